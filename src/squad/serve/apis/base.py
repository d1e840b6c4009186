"""One API squad serve admits, as an object: :class:`Api` (each API a module beside this one).

An API says, for the request side of ``squad serve``:

- ``name`` (the ``kind`` the relay, assembly and ledger know it by) and ``paths`` (the routes it is
  served on, llama-server b11434's own, ``tools/server/server.cpp``);
- :meth:`Api.check`: the shape of a body the engine can take, refused with a 400 naming the field
  (squad never sends the engine a body it would answer with a 500);
- :meth:`Api.count`: the prompt tokens the engine will hold for the body (an upper bound where the
  engine's own count is not available: never less than it uses);
- the generation limit: :data:`squad.engine.llama.LIMIT_FIELDS` (+ the API's own, ``limit_fields``)
  are read for the reservation, and :meth:`Api.write_limit` sends exactly the reserved limit,
  overwriting every alias the engine reads and dropping the fields squad decides itself
  (:data:`~squad.engine.llama.COMPLETIONS_FIELDS` once split, :data:`~squad.engine.llama.SLOT_PIN_FIELDS`);
- :meth:`Api.error`: an error body in the API's own shape (OpenAI's by default).

Adding the next API is one new module with an :class:`Api` subclass, named in
:data:`squad.serve.apis.APIS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from squad.engine.llama import COMPLETIONS_FIELDS, LIMIT_FIELDS, MAX_PROBS, SLOT_PIN_FIELDS
from squad.serve.demand import Kind, Refused

if TYPE_CHECKING:
    import httpx

    from squad.engine.info import EngineInfo
    from squad.sched.admission import Admission

__all__ = ["Api", "Counting", "MAX_TOKEN_CHARS", "prompt_floor", "MEDIA_PARTS", "objects", "text_or_parts",
           "check_probs", "written_limit"]

MEDIA_PARTS = frozenset({"image_url", "input_image", "image", "input_audio", "audio", "input_file", "file",
                         "document"})
"""Content part types that carry an image, audio or a file (OpenAI chat, Responses, Anthropic)."""

MEDIA_FIX = ("squad serve admits text only: it cannot count an image's, audio's or file's tokens before the "
             "engine holds them (and the model it serves has no projector, llama-server's --mmproj); send the "
             "content as text, or send this request to a server with a vision model directly")


class Counting(Protocol):
    """What the APIs need of squad serve's gateway (:class:`squad.serve.gateway.Gateway` is one): a
    protocol, so that this module does not import the gateway, which imports it."""

    default_max_tokens: int
    """Tokens a request without ``max_tokens`` reserves and may generate."""

    @property
    def admission(self) -> Admission: ...

    @property
    def engine(self) -> EngineInfo: ...

    @property
    def upstream(self) -> httpx.AsyncClient: ...

    async def count(self, body: dict[str, Any], kind: Kind, big: bool = False) -> int:
        """Prompt tokens of a request of ``kind`` (raises :class:`Refused`)."""
        ...

    async def count_chat(self, messages: list[Any], tools: list[Any] | None, big: bool = False) -> int:
        """Prompt tokens of chat ``messages`` and ``tools`` (``big``: counted off the event loop)."""
        ...

    async def count_text(self, prompt: Any, big: bool = False) -> int:
        """Prompt tokens of a text prompt or a list of token ids (raises :class:`Refused`; ``big``: counted
        off the event loop)."""
        ...

    async def engine_count(self, path: str, body: dict[str, Any]) -> int:
        """The engine's own count of ``body`` at ``path`` (raises :class:`Refused`)."""
        ...


class Api:
    """The request side of one API (module docstring). Subclasses set the class variables and
    override what differs."""

    name: ClassVar[str]
    """The API's kind, as :data:`squad.serve.demand.Kind` names it."""
    paths: ClassVar[tuple[str, ...]]
    """The routes squad serves it on (llama-server's)."""
    generates: ClassVar[bool] = True
    """Whether a request generates tokens (False: embeddings, rerank: it reserves its input only)."""
    limit_fields: ClassVar[tuple[str, ...]] = LIMIT_FIELDS
    """The fields this API's requests may give the generation limit in (all read, the largest wins)."""
    limit_field: ClassVar[str] = "max_tokens"
    """The field the reserved limit is written to (besides every alias the body holds)."""
    several: ClassVar[bool] = True
    """Whether the engine reads ``n``/``n_cmpl`` for this API (several completions of a prompt)."""
    prompt_fields: ClassVar[tuple[str, ...]] = ()
    """The fields whose texts all reach the prompt (:func:`prompt_floor`)."""

    def check(self, body: dict[str, Any]) -> None:
        """Raise :class:`Refused` (400) for a body whose shape the engine cannot take."""
        check_probs(body)
        if body.get("stream") is not None and not isinstance(body["stream"], bool):
            raise Refused(400, f"stream must be true or false, got {_name(body['stream'])}", param="stream")

    async def count(self, host: Counting, body: dict[str, Any], big: bool = False) -> int:
        """Prompt tokens of ``body``, after :meth:`check` (raises :class:`Refused`; ``big``: a large body,
        counted off the event loop)."""
        raise NotImplementedError

    def write_limit(self, body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        """``body`` as sent to the engine: at most ``max_tokens`` generated, whatever else it says."""
        return written_limit(body, max_tokens, self.limit_field)

    def error(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI-shaped error body (``{"error": {...}}``) in this API's own shape."""
        return body

    def __repr__(self) -> str:
        return f"<api {self.name}>"


MAX_TOKEN_CHARS = 256
"""No token covers more characters than this (SmolLM2's longest: 81), so a prompt holding C characters
of text is at least C / 256 tokens: a body that can never fit is refused before it is tokenized (which
takes ~2.5 s per MB)."""


def prompt_floor(body: dict[str, Any], fields: tuple[str, ...]) -> int:
    """The fewest tokens the texts in ``body``'s ``fields`` can be (:data:`MAX_TOKEN_CHARS`)."""
    chars, todo = 0, [body.get(f) for f in fields]
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return chars // MAX_TOKEN_CHARS


def written_limit(body: dict[str, Any], max_tokens: int, field: str | None) -> dict[str, Any]:
    """A copy of ``body`` where every generation-limit field the engine reads (and ``field``) says
    ``max_tokens`` (0 for an API that generates nothing: only the aliases present are written), and the
    fields squad decides are gone: ``n``/``n_cmpl`` (a request is one completion once
    :func:`squad.serve.fanout.split` has split it) and ``id_slot`` (squad's admission places requests)."""
    out = {k: v for k, v in body.items() if k not in COMPLETIONS_FIELDS and k not in SLOT_PIN_FIELDS}
    for name in (*LIMIT_FIELDS, "max_output_tokens"):
        if name in out:
            out[name] = max_tokens
    if field is not None:
        out[field] = max_tokens
    return out


def objects(body: dict[str, Any], field: str, *, required: bool = False, empty: bool = True,
            what: str = "objects") -> list[dict[str, Any]]:
    """``body[field]`` as a list of JSON objects ([] when absent or null and not ``required``);
    :class:`Refused` (400, naming the field and the first bad item) otherwise."""
    value = body.get(field)
    if value is None:
        if required:
            raise Refused(400, f"'{field}' is required: a list of {what}", param=field)
        return []
    if not isinstance(value, list) or (not value and not empty):
        raise Refused(400, f"'{field}' must be a {'non-empty ' if not empty else ''}list of {what}, got "
                           f"{_name(value)}", param=field)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise Refused(400, f"{field}[{i}] must be an object, got {_name(item)}", param=f"{field}[{i}]")
    return value


def text_or_parts(value: Any, where: str, *, none: bool = True, part_types: frozenset[str] | None = None) -> None:
    """Check a message ``content``: a text, null (when ``none``), or a list of objects each with a string
    ``type``; an image, audio or file part is refused with what to do instead."""
    if isinstance(value, str) or (value is None and none):
        return
    if not isinstance(value, list):
        raise Refused(400, f"{where} must be a text or a list of content parts, got {_name(value)}", param=where)
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise Refused(400, f"{where}[{i}] must be a content part: an object with a 'type'", param=f"{where}[{i}]")
        if kind in MEDIA_PARTS:
            raise Refused(400, f"{where}[{i}] is a '{kind}' part: {MEDIA_FIX}", param=f"{where}[{i}]")
        if part_types is not None and kind not in part_types:
            raise Refused(400, f"{where}[{i}] has type {kind!r}; this API takes {', '.join(sorted(part_types))}",
                          param=f"{where}[{i}]")


def check_probs(body: dict[str, Any]) -> None:
    """Refuse more than :data:`~squad.engine.llama.MAX_PROBS` top tokens per generated token."""
    for name in ("n_probs", "top_logprobs", "logprobs"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_PROBS:
            raise Refused(400, f"{name} may be at most {MAX_PROBS} (the top tokens returned per generated token), "
                               f"got {value}", param=name)


def check_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``tools``: a list of objects (refused otherwise)."""
    return objects(body, "tools", what="tool definitions (objects)")


def _name(value: Any) -> str:
    return "null" if value is None else {dict: "an object", list: "a list", str: "a text", bool: "a boolean",
                                         int: "a number", float: "a number"}.get(type(value), type(value).__name__)
