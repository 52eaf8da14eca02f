"""The version, in one place below every layer (the package and the round-cost cache key read it)."""

__version__ = "0.1.0"
