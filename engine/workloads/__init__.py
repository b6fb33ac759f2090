"""Workloads run on the engine: the scheduling comparison (`compare`) and the overload
scenario (`overload`), apart from the serving core."""
