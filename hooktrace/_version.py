"""The package's version (pyproject.toml's), written into every trace's metadata."""

__version__ = "0.1.0"
