"""What a running engine reports about itself, read back after load."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EngineInfo"]


@dataclass(frozen=True)
class EngineInfo:
    """The engine as it really is, read back from ``/props``, ``/slots`` and ``/v1/models``.

    These values, never the requested ones, are what squad uses and shows.

    - ``base_url``: ``http://127.0.0.1:PORT`` (no ``/v1``).
    - ``api_key``: bearer key or None.
    - ``slots``: ``/props`` ``total_slots``.
    - ``n_ctx``: ``/props`` ``default_generation_settings.n_ctx``: the context one request
      may use, in tokens. With unified KV this is the whole shared pool.
    - ``kv_unified``: True/False when known (squad launched it, or it could be inferred),
      None when an attached engine does not say.
    - ``pool``: KV cells the slots share, in tokens. Unified: ``n_ctx``. Not unified: each slot
      has its own ``n_ctx`` cells, so admission must keep each request under ``n_ctx``.
    - ``n_ctx_train``: the model's training context (``/v1/models`` ``data[0].meta``), or None.
    - ``chat_template``: ``/props`` ``chat_template``, the jinja source the engine applies (the
      model's own, or one squad passed with ``--chat-template-file``), or None when not reported;
      :attr:`template_name` names it, :attr:`tool_call_prefix` is the prefix of squad's own.
    - ``template_has_tools``: whether that template renders tool definitions and tool calls
      (:func:`squad.engine.chat_templates.handles_tools`; None when unknown). llama-server renders
      ``tools`` into the prompt only through the chat template, so a template without them
      silently drops the tool definitions (measured on b11434 with SmolLM2's own template: the
      same prompt token count with and without tools).
    - ``admits``: the URL is a ``squad serve`` endpoint in front of the engine (it answers
      ``/squad/status``): it admits every request itself, so a client must not reserve again
      (field case F20).
    """

    base_url: str
    api_key: str | None = field(repr=False)
    slots: int
    n_ctx: int
    kv_unified: bool | None
    pool: int
    n_ctx_train: int | None = None
    model_path: str = ""
    model_alias: str = ""
    build_info: str = ""
    launched: bool = True
    template_has_tools: bool | None = None
    chat_template: str | None = field(default=None, repr=False)
    admits: bool = False

    @property
    def template_name(self) -> str:
        """Which chat template the engine applies, for people (:func:`squad.engine.chat_templates.describe`)."""
        from squad.engine.chat_templates import describe

        return describe(self.chat_template)

    @property
    def tool_call_prefix(self) -> str | None:
        """The text that opens a tool call when the engine applies a template squad ships (the
        client prefills it for a forced tool choice), else None."""
        from squad.engine.chat_templates import known_template

        shipped = known_template(self.chat_template)
        return shipped.call_prefix if shipped is not None else None
