"""The package version, in one place (pyproject.toml reads it from here).

Its own module so that any layer can name the version without importing the package root
(which imports the analysis API, and would close an import circle)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
