"""squad: agents that share one local llama-server.

The public API is listed in ``__all__``; everything else is private.
"""

from squad.errors import *  # noqa: F403
from squad.errors import __all__ as _error_names
from squad.planner import EnginePlan

__version__ = "0.1.0"

__all__ = ["EnginePlan", "__version__", *_error_names]
