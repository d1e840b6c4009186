"""Commands for this area are registered on `squad.cli._app.app`."""

from squad.cli._app import app  # noqa: F401
