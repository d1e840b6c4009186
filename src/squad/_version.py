"""squad's version string, in a module of its own so that parts of the package (the CLI's
``--version``, ``squad serve``'s ``Server`` header) can read it without importing :mod:`squad`'s
lazy public API. ``pyproject.toml`` holds the same number."""

__version__ = "0.1.0"
