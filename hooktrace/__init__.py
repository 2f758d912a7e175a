"""hooktrace: low-overhead per-module tracing for PyTorch models."""

__version__ = "0.1.0"

__all__ = ["__version__"]
