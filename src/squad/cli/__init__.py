"""The ``squad`` command line. Each area registers its commands on the shared app:

- ``engine.py``: ``squad engine install|info``, ``squad models pull|list|info``
- ``config.py``: ``squad config show|path``
- ``launch.py``: ``squad engine start|stop|status``, ``squad verify``
- ``plan.py``: ``squad plan``
- ``run.py``: ``squad run``, ``squad recipes validate`` (what it prints: ``run_report.py``)
- ``chat.py``: ``squad chat``
- ``trace.py``: ``squad trace show|plot``
- ``serve.py``: ``squad serve``
"""

from __future__ import annotations

from squad.cli import chat as _chat  # noqa: F401
from squad.cli import config as _config  # noqa: F401  (registers commands)
from squad.cli import engine as _engine  # noqa: F401
from squad.cli import launch as _launch  # noqa: F401
from squad.cli import plan as _plan  # noqa: F401
from squad.cli import run as _run  # noqa: F401
from squad.cli import serve as _serve  # noqa: F401
from squad.cli import trace as _trace  # noqa: F401
from squad.cli._app import app, main, unwrap_help

unwrap_help(app)

__all__ = ["app", "main"]
