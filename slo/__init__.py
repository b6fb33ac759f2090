"""llm-slo core: SLI catalog, SLO spec, request records, record store and evaluator.

Importing this package never imports torch or any other package of this project.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
