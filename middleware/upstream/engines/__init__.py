"""One module per engine, each registering its `EngineAdapter` at import
(`middleware.upstream.registry`). Every module here is imported with this package, so adding
an engine is adding its module: nothing else names it."""

from __future__ import annotations

import importlib
import pkgutil

ENGINE_MODULES = tuple(
    importlib.import_module(f"{__name__}.{module.name}").__name__
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda module: module.name)
)
