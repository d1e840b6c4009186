"""Fakes of the other servers squad attaches to, answering the documented shapes.

Each is a :class:`~squad.testing.fake_engine.FakeEngine` (real HTTP on 127.0.0.1, the same chat
stream, slots and token count) with another kind's control endpoints and its own behaviour when
the running requests outgrow its KV capacity or a prompt outgrows its context. Sources of every
shape are in :mod:`squad.engine.kinds`; the fakes answer exactly those fields.

- :class:`FakeVLLM`: ``/health`` 200 with an empty body, ``/version``, ``/v1/models``
  (``max_model_len``, ``owned_by: "vllm"``), ``/metrics`` (``vllm:cache_config_info`` with
  ``block_size`` and ``num_gpu_blocks``, ``vllm:num_requests_running``), ``POST /tokenize``
  (``{"count", "max_model_len", "tokens"}``). Running requests beyond the KV capacity are
  **preempted** (counted in ``preemptions``), not failed; a prompt above ``max_model_len`` is a
  400 ``BadRequestError``.
- :class:`FakeSGLang`: ``/health``, ``/server_info`` and ``/get_server_info`` (server arguments,
  ``max_total_num_tokens``, ``max_req_input_len``, ``internal_states[0]
  .effective_max_running_requests_per_dp``, ``version``), ``/v1/models``. Overflow: retracted
  (``preemptions``).
- :class:`FakeOllama`: ``/`` "Ollama is running", ``/api/version``, ``/api/ps``
  (``models[].context_length``), ``/v1/models``; no ``/health`` (404). A prompt longer than the
  context is **silently truncated** (``truncations``), as Ollama does.
- :class:`FakeLMStudio`: ``/api/v1/models`` (``loaded_instances[].config.context_length``,
  ``.parallel``) and ``/api/v0/models`` (``state``, ``max_context_length``), ``/v1/models``; a
  too-long prompt is truncated (``truncations``).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from squad.testing.counting import count_tokens
from squad.testing.fake_engine import FakeEngine

__all__ = ["FakeVLLM", "FakeSGLang", "FakeOllama", "FakeLMStudio"]


class _Recomputing(FakeEngine):
    """A server that preempts (and later recomputes) requests when its KV capacity runs out."""

    def __init__(self, *, capacity: int = 4096, n_ctx: int = 2048, slots: int = 8, model: str = "Qwen/Qwen3-0.6B",
                 **kwargs: Any) -> None:
        super().__init__(slots=slots, n_ctx=n_ctx, **kwargs)
        self.capacity, self.model = capacity, model
        self.preemptions = 0
        """Times the running requests needed more KV than the capacity (the engine would preempt)."""

    @property
    def pool(self) -> int:
        return self.capacity

    def _overflowed(self) -> bool:
        self.preemptions += 1
        return False

    def _models_list(self, request: Request) -> Response:
        return self._gate(request) or JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": self.owner,
            "root": self.model, "parent": None, "max_model_len": self.n_ctx}]})

    owner = "vllm"


class FakeVLLM(_Recomputing):
    """A vLLM OpenAI-compatible server: ``capacity`` = ``num_gpu_blocks × block_size`` KV tokens,
    ``n_ctx`` = ``--max-model-len``, ``slots`` = ``--max-num-seqs`` (not reported, as in vLLM)."""

    def __init__(self, *, block_size: int = 16, version: str = "0.11.0", metrics: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block_size, self.version, self.metrics = block_size, version, metrics

    def _routes(self) -> list[Route]:
        chat = [r for r in super()._routes() if r.path in ("/v1/chat/completions", "/chat/completions")]
        routes = [Route("/health", self._vllm_health), Route("/version", self._version),
                  Route("/v1/models", self._models_list), Route("/tokenize", self._tokenize, methods=["POST"]), *chat]
        if self.metrics:
            routes.append(Route("/metrics", self._metrics))
        return routes

    async def _vllm_health(self, request: Request) -> Response:
        return self._gate(request, auth=False) or Response(status_code=200)

    async def _version(self, request: Request) -> Response:
        return JSONResponse({"version": self.version})

    async def _metrics(self, request: Request) -> Response:
        blocks = self.capacity // self.block_size
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} {float(self.processing)}\n'
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",calculate_kv_scales="False",'
            f'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",'
            f'num_gpu_blocks="{blocks}",num_gpu_blocks_override="None"}} 1.0\n'
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def _tokenize(self, request: Request) -> Response:
        if gated := self._gate(request):
            return gated
        body = await request.json()
        self.count_requests += 1
        if "prompt" in body:  # TokenizeCompletionRequest: {model, prompt, add_special_tokens}
            n = len(str(body["prompt"]).split()) + 1
        else:  # TokenizeChatRequest: {model, messages, tools, add_generation_prompt}
            n = count_tokens(body.get("messages", []), body.get("tools"))
        return JSONResponse({"count": n, "max_model_len": self.n_ctx, "tokens": list(range(n)), "token_strs": None})

    def _too_long(self, n_prompt: int) -> tuple[int, Response | None]:
        message = (f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                   f"{n_prompt} tokens in the messages. Please reduce the length of the messages.")
        return n_prompt, JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                                       "param": None, "code": 400}, status_code=400)


class FakeSGLang(_Recomputing):
    """An SGLang server: ``capacity`` = ``max_total_num_tokens``, ``n_ctx`` = ``context_length``,
    ``slots`` = the reported running-request cap."""

    owner = "sglang"

    def __init__(self, *, version: str = "0.5.3", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = version

    def _routes(self) -> list[Route]:
        chat = [r for r in super()._routes() if r.path in ("/v1/chat/completions", "/chat/completions")]
        return [Route("/health", self._sglang_health), Route("/server_info", self._server_info),
                Route("/get_server_info", self._server_info), Route("/v1/models", self._models_list), *chat]

    async def _sglang_health(self, request: Request) -> Response:
        return self._gate(request, auth=False) or Response(status_code=200)

    async def _server_info(self, request: Request) -> Response:
        return JSONResponse({
            "model_path": self.model, "context_length": self.n_ctx, "max_running_requests": self.slots,
            "max_total_tokens": None, "dp_size": 1, "tp_size": 1, "chunked_prefill_size": 8192,
            "status": "ready", "max_total_num_tokens": self.capacity, "max_req_input_len": self.n_ctx - 5,
            "internal_states": [{"last_gen_throughput": 0.0,
                                 "memory_usage": {"weight": 1.0, "kvcache": 0.2, "token_capacity": self.capacity},
                                 "effective_max_running_requests_per_dp": self.slots}],
            "version": self.version,
        })

    def _too_long(self, n_prompt: int) -> tuple[int, Response | None]:
        return n_prompt, JSONResponse({"object": "error", "message": f"The input ({n_prompt} tokens) is longer than "
                                       f"the model's context length ({self.n_ctx} tokens).", "type": "BadRequestError",
                                       "param": None, "code": 400}, status_code=400)


class _Truncating(FakeEngine):
    """A server that silently cuts a prompt longer than its context (and runs what is left)."""

    def __init__(self, *, n_ctx: int = 2048, slots: int = 1, model: str = "llama3.2:3b", **kwargs: Any) -> None:
        super().__init__(slots=slots, n_ctx=n_ctx, **kwargs)
        self.model = model
        self.truncations = 0
        """Prompts the server cut to fit its context without telling the client."""

    @property
    def pool(self) -> int:
        return self.slots * self.n_ctx  # each parallel request has its own context

    def _overflowed(self) -> bool:
        return False

    def _too_long(self, n_prompt: int) -> tuple[int, Response | None]:
        self.truncations += 1
        return self.n_ctx // 2, None

    def _openai_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "library"}]})


class FakeOllama(_Truncating):
    """An Ollama server with one model loaded at ``n_ctx`` (``context_length`` in ``/api/ps``) and
    ``slots`` = ``OLLAMA_NUM_PARALLEL`` (not reported, as in Ollama). ``loaded=False``: no model in
    ``/api/ps`` yet."""

    def __init__(self, *, version: str = "0.12.3", loaded: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version, self.loaded = version, loaded

    def _routes(self) -> list[Route]:
        chat = [r for r in super()._routes() if r.path in ("/v1/chat/completions", "/chat/completions")]
        return [Route("/", self._root), Route("/api/version", self._version), Route("/api/ps", self._ps),
                Route("/v1/models", self._openai_models), *chat]

    async def _root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def _version(self, request: Request) -> Response:
        return JSONResponse({"version": self.version})

    async def _ps(self, request: Request) -> Response:
        models = [{
            "name": self.model, "model": self.model, "size": 3_338_801_804, "digest": "a80c4f17acd5" + "0" * 52,
            "details": {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                        "parameter_size": "3.2B", "quantization_level": "Q4_K_M"},
            "expires_at": "2026-09-01T12:00:00Z", "size_vram": 3_338_801_804, "context_length": self.n_ctx,
        }] if self.loaded else []
        return JSONResponse({"models": models})


class FakeLMStudio(_Truncating):
    """An LM Studio server with one model loaded at ``n_ctx`` and ``slots`` parallel predictions.
    ``api="v0"``: only the older ``/api/v0/models`` (LM Studio 0.3.6+)."""

    def __init__(self, *, api: str = "v1", model: str = "qwen/qwen3-4b", slots: int = 4, **kwargs: Any) -> None:
        super().__init__(model=model, slots=slots, **kwargs)
        self.api = api

    @property
    def pool(self) -> int:
        return self.n_ctx

    def _routes(self) -> list[Route]:
        chat = [r for r in super()._routes() if r.path in ("/v1/chat/completions", "/chat/completions")]
        routes = [Route("/api/v0/models", self._v0), Route("/v1/models", self._openai_models), *chat]
        if self.api == "v1":
            routes.append(Route("/api/v1/models", self._v1))
        return routes

    async def _v1(self, request: Request) -> Response:
        return JSONResponse({"models": [{
            "type": "llm", "publisher": "qwen", "key": self.model, "display_name": "Qwen3 4B", "architecture": "qwen3",
            "quantization": {"name": "Q4_K_M", "bits_per_weight": 4}, "size_bytes": 2_497_280_256,
            "params_string": "4B", "loaded_instances": [{"id": self.model, "config": {
                "context_length": self.n_ctx, "eval_batch_size": 512, "parallel": self.slots,
                "flash_attention": True, "offload_kv_cache_to_gpu": True}}],
            "max_context_length": 40960, "format": "gguf",
            "capabilities": {"vision": False, "trained_for_tool_use": True}, "description": None}]})

    async def _v0(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "type": "llm", "publisher": "qwen", "arch": "qwen3",
            "compatibility_type": "gguf", "quantization": "Q4_K_M", "state": "loaded",
            "max_context_length": self.n_ctx}]})
