"""The optional C extensions, in setuptools' stable form; everything else is in pyproject.toml.

``[tool.setuptools] ext-modules`` in pyproject.toml still makes setuptools warn that it is
*experimental* on every install; ``ext_modules`` here is the documented, stable way.

Both are optional (``optional=True``): without a compiler the install still succeeds and the
same results come from pure Python, ~2x slower to read large jobs (the column builder's scan)
and ~15x the load for the pickle key walk. ``FR_OTEL_PURE_PYTHON=1`` turns both off at run time.
``scripts/setup.sh`` reinstalls when this file or a C source changes (its stamp covers both).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("fr_otel.read._column_scan", ["src/fr_otel/read/_column_scan.c"], optional=True),
        Extension("fr_otel.read._pickle_keys", ["src/fr_otel/read/_pickle_keys.c"], optional=True),
    ],
)
