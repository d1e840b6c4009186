"""What a running engine reports about itself, read back after load."""

from __future__ import annotations

from dataclasses import dataclass, field

from squad.engine.chat_templates import call_id_length, call_prefix, describe
from squad.engine.kinds import EngineKind, kind_of
from squad.engine.kinds.counting import PromptCounting

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
    - ``kind``: what answers at ``base_url`` (:data:`squad.engine.kinds.ENGINE_KINDS`; its record:
      :attr:`engine_kind`): ``llama.cpp``, ``vllm``, ``sglang``, ``ollama``, ``lmstudio``,
      ``openai-compatible``, ``squad-serve``.
      For kinds other than llama.cpp, ``slots``/``n_ctx``/``pool`` are what that server reports
      (:mod:`squad.engine.kinds`) and ``model_alias`` is the model name requests carry.
    - ``sources``: where each of ``slots``, ``ctx``, ``pool`` came from, in words.
    - ``counting`` (its name: ``count_with``): how prompts are counted when the model file is not
      on this machine:
      ``"input_tokens"`` (llama-server ``POST /v1/chat/completions/input_tokens``), ``"tokenize"``
      (vLLM ``POST /tokenize`` with the chat messages), ``"estimate"`` (no endpoint: squad's
      estimate, :func:`squad.engine.kinds.counting.estimate_chat_tokens`, which counts high on purpose).
    - ``version``: the server's version when it reports one; ``warnings``: what the probe found
      worth telling (a default used, a pin above a reported limit).
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
    kind: str = "llama.cpp"
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    version: str = ""
    warnings: tuple[str, ...] = field(default=(), compare=False, repr=False)
    slot_save_dir: str | None = None
    """The engine's ``--slot-save-path`` when squad launched it with one (shared input,
    :mod:`squad.sched.share`); None: slots are not saved or restored."""
    pid: int | None = field(default=None, compare=False)
    """The engine's process id when squad launched it (None: attached, or not known)."""
    log_path: str | None = field(default=None, compare=False)
    """The engine's log file when squad launched it."""

    def describe_process(self) -> str:
        """Which engine, for a message about it: ``the engine at http://127.0.0.1:8080 (pid 1234, log
        /path/llama-server.log)``; an attached one by its URL (``attached: its process and log are not squad's``)."""
        if self.pid is None and self.log_path is None:
            return f"the engine at {self.base_url} (attached: its process and log are not squad's)"
        parts = [f"pid {self.pid}" if self.pid is not None else "", f"log {self.log_path}" if self.log_path else ""]
        return f"the engine at {self.base_url} ({', '.join(p for p in parts if p)})"

    @property
    def engine_kind(self) -> EngineKind:
        """The record of :attr:`kind` (:func:`squad.engine.kinds.kind_of`): how squad detects, admits
        within, counts for and sends to this kind of server."""
        return kind_of(self.kind)

    @property
    def policy(self) -> str:
        """How squad admits calls to this kind of server, in words (:attr:`EngineKind.policy`)."""
        return self.engine_kind.policy

    @property
    def counting(self) -> PromptCounting:
        """How prompts are counted when the model file is not here (:attr:`EngineKind.counting`)."""
        return self.engine_kind.counting

    @property
    def count_with(self) -> str:
        """The name of :attr:`counting` (class docstring)."""
        return self.counting.name

    @property
    def truncates(self) -> bool:
        """True for a server that silently cuts a prompt longer than its context (Ollama, LM Studio):
        squad must refuse such a request itself."""
        return self.engine_kind.truncates

    @property
    def template_name(self) -> str:
        """Which chat template the engine applies, for people (:func:`squad.engine.chat_templates.describe`)."""
        return describe(self.chat_template)

    @property
    def tool_call_prefix(self) -> str | None:
        """The text that opens a tool call in the template the engine applies, squad's own or a
        measured family's (the client prefills it for a forced tool choice,
        :func:`squad.engine.chat_templates.call_prefix`), else None."""
        return call_prefix(self.chat_template)

    @property
    def call_id_length(self) -> int | None:
        """The length the engine's template demands of tool call ids (9 for Mistral's), else None:
        the client and ``squad serve`` rewrite the ids they send to fit
        (:func:`squad.engine.template_profile.fit_call_ids`)."""
        return call_id_length(self.chat_template)
