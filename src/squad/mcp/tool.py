"""An MCP server's tool as an agent's tool: its arguments checked against the server's schema,
its result (text, resources, images...) as the text the model reads (:func:`result_text`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from squad.tools import Tool, ToolOutcome

__all__ = ["MCPTool", "ToolCaller", "AnyArguments", "never_called", "result_text"]


class ToolCaller(Protocol):
    """What calls an :class:`MCPTool` on its open server (:class:`squad.mcp.connection.Connection`)."""

    async def call(self, tool: MCPTool, args: dict[str, Any]) -> ToolOutcome: ...


class AnyArguments(BaseModel):
    """Any arguments (an MCP tool's are checked against its own JSON schema instead)."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an open MCP server. ``parameters()`` is the server's own JSON schema;
    ``remote`` its name on the server; ``server`` the server's name. Arguments are checked
    against the schema before the call (``args_model`` is unused)."""

    server: str = ""
    remote: str = ""
    schema: Mapping[str, Any] = field(default_factory=dict)
    connection: ToolCaller | None = field(default=None, compare=False, repr=False)

    def parameters(self) -> dict[str, Any]:
        schema = dict(self.schema)
        schema.setdefault("type", "object")
        return schema

    def schema_problem(self) -> str | None:
        """Why the input schema is not a valid JSON schema, or None (checked once per tool)."""
        return self._problem

    @functools.cached_property
    def _problem(self) -> str | None:
        import jsonschema  # third-party, slow to import: only once a tool is checked

        try:
            jsonschema.validators.validator_for(self.schema).check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            return exc.message
        return None

    @functools.cached_property
    def _validator(self) -> Any:
        import jsonschema

        return jsonschema.validators.validator_for(self.schema)(self.schema)

    async def call(self, arguments: str) -> ToolOutcome:
        """Check ``arguments`` (JSON text) and call the tool; every failure is the result text."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: not JSON ({exc.msg})", ok=False)
        if not isinstance(args, dict):
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: give a JSON object", ok=False)
        problem = self._invalid(args)
        if problem is not None:
            return ToolOutcome(self.name, f"error: bad arguments for {self.name}: {problem}", ok=False)
        assert self.connection is not None, "an MCPTool comes from an open server"
        return await self.connection.call(self, args)

    def _invalid(self, args: dict[str, Any]) -> str | None:
        if self.schema_problem() is not None:
            return None  # the server checks its own arguments
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if not errors:
            return None
        return "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in errors[:5])


async def never_called(**_: Any) -> None:
    """An :class:`MCPTool`'s ``fn``: never called (:meth:`MCPTool.call` talks to the server)."""
    raise AssertionError("MCPTool.call talks to the server")


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the text the model reads: its text blocks and text resources
    (after a ``[resource: URI, MIME]`` line) joined by newlines; content that is not text
    (images, audio, binary resources, resource links) described, never dumped:
    ``[image: image/png, 1,000 bytes, not shown]``,
    ``[resource: file:///logo.png, image/png, 1,000 bytes, binary, not shown]``,
    ``[resource link: file:///q3.pdf (q3.pdf), application/pdf, 48,213 bytes]``.
    The structured content as JSON when there is no block."""
    parts = [_block_text(block) for block in result.content or ()]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, default=str)
    return "\n".join(parts)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "") or "content"
    if kind == "text":
        return str(block.text)
    if kind == "resource":
        res = block.resource
        if isinstance(getattr(res, "text", None), str):
            return f"[{_about('resource', res.uri, res.mime_type)}]\n{res.text}"
        size = _decoded_size(getattr(res, "blob", None))
        return f"[{_about('resource', res.uri, res.mime_type, size)}, binary, not shown]"
    if kind == "resource_link":
        name = getattr(block, "name", None)
        uri = f"{block.uri} ({name})" if name and not str(block.uri).endswith(name) else block.uri
        return f"[{_about('resource link', uri, block.mime_type, getattr(block, 'size', None))}]"
    size = _decoded_size(getattr(block, "data", None))
    return f"[{_about(kind, None, getattr(block, 'mime_type', None), size)}, not shown]"


def _about(kind: str, uri: Any, mime: str | None, size: int | None = None) -> str:
    """``kind: URI, MIME, N bytes`` with what is known (URIs past 200 characters cut)."""
    said = [str(uri) if len(str(uri)) <= 200 else str(uri)[:200] + "..."] if uri is not None else []
    said.append(mime or "type not given")
    if size is not None:
        said.append(f"{size:,} bytes")
    return f"{kind}: {', '.join(said)}"


def _decoded_size(data: Any) -> int | None:
    """Bytes a base64 text decodes to (None for no text)."""
    if not isinstance(data, str):
        return None
    body = "".join(data.split()).rstrip("=")
    return len(body) * 3 // 4
