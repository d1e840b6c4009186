"""A small MCP server of notes, written with the official ``mcp`` SDK: agents save short
notes and read them back (used by ``recipes/notes.yaml``).

Tools: ``add_note(text)``, ``list_notes()``, ``find_notes(word)`` and ``count_lines(text)``.
Notes live in memory for the server's lifetime, or in a JSON-lines file with ``--file``.

    python examples/mcp_notes.py                        # stdio: squad starts it (command: python)
    python examples/mcp_notes.py --http 8765            # streamable HTTP on 127.0.0.1:8765/mcp

In a recipe::

    mcp:
      notes:
        command: python
        args: [../examples/mcp_notes.py]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("notes", instructions="Save short notes and read them back.")
_notes: list[str] = []
_file: Path | None = None


def _save() -> None:
    if _file is not None:
        _file.write_text("".join(json.dumps(n) + "\n" for n in _notes), encoding="utf-8")


@server.tool()
def add_note(text: Annotated[str, Field(description="the note, one or two sentences")]) -> str:
    """Save a short note."""
    text = text.strip()
    if not text:
        raise ToolError("the note is empty; give it some text")
    _notes.append(text)
    _save()
    return f"saved note {len(_notes)}: {text}"


@server.tool()
def list_notes() -> str:
    """All saved notes, one per line, numbered."""
    return "\n".join(f"{i}. {n}" for i, n in enumerate(_notes, 1)) or "no notes yet"


@server.tool()
def find_notes(word: Annotated[str, Field(description="the word to look for")]) -> str:
    """The saved notes that contain a word (case does not matter)."""
    found = [f"{i}. {n}" for i, n in enumerate(_notes, 1) if word.lower() in n.lower()]
    return "\n".join(found) or f"no note contains {word!r}"


@server.tool()
def count_lines(text: Annotated[str, Field(description="the text to count")]) -> int:
    """How many non-empty lines a text has."""
    return sum(1 for line in text.splitlines() if line.strip())


def main() -> None:
    global _file
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, help="keep the notes in this JSON-lines file")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    if args.file is not None:
        _file = args.file
        if _file.is_file():
            _notes.extend(json.loads(line) for line in _file.read_text(encoding="utf-8").splitlines() if line)
    if args.http is not None:
        server.run(transport="streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
