"""The compiled per-event hot path (`middleware._hotpath`, Cython); everything else about the
package is in pyproject.toml.

The extension is optional: where there is no C compiler the install still succeeds and
`middleware.hotpath` runs the pure-Python twin (`middleware._hotpath_py`), which behaves the
same. See docs/middleware.md, "The compiled hot path".
"""

from __future__ import annotations

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython (pyproject's build requires name it): no extension
    cythonize = None

HOTPATH = Extension("middleware._hotpath", ["middleware/_hotpath.pyx"], extra_compile_args=["-O2"])


def extensions() -> list[Extension]:
    if cythonize is None:
        return []
    built = cythonize([HOTPATH], compiler_directives={"language_level": "3"}, quiet=True)
    for extension in built:
        # Optional: a failed compile (no C compiler) warns and installs without it. Set after
        # cythonize, which does not carry the flag over to the extensions it returns.
        extension.optional = True
    return built


setup(ext_modules=extensions())
