"""Capacity: the highest load each tier's SLO holds, and the arithmetic built on it.

`arrivals` (open-loop arrival processes, send lateness), `search` (doubling then bisection),
`judge` (one step's verdict per tier, the measured window's size), `result` (capacity.json),
`plan` (replicas and cost). Core modules: they import nothing of ours above `slo`.
"""
