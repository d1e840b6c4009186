"""``squad serve``: squad's planning and KV-aware admission as an OpenAI-compatible endpoint.

Any OpenAI-compatible client (coding agents, editors, scripts, several ``squad run --url``)
points at ``http://127.0.0.1:8090/v1`` with the key squad serve printed; every generation
request is counted, reserved and queued by squad's :class:`~squad.sched.admission.Admission` before
it reaches llama-server, so requests running together never exceed its slots or its KV pool.

- :mod:`squad.serve.gateway`: the ASGI app (routes, key, counting, ``/squad/status``);
- :mod:`squad.serve.relay`: one admitted generation request, forwarded and relayed;
- :mod:`squad.serve.http`: ASGI bodies (bounded in size and time, parsed off the event loop when
  large), headers, JSON answers, errors in each API's shape;
- :mod:`squad.serve.demand`: one request's reservation (prompt + max_tokens) or its 400;
- :mod:`squad.serve.fanout`: a list of prompts or ``n`` > 1, one reservation per completion;
- :mod:`squad.serve.assemble`: a request not streamed (chat, completions, Responses, Messages) is
  streamed from llama-server (so it stops when the client leaves) and answered whole;
- :mod:`squad.serve.apis`: one module per admitted API (chat, completions, Responses, Messages,
  embeddings, infill, rerank): its paths, shape check, count, generation limit and error shape;
- :mod:`squad.serve.forcing`: tool choice and schemas for every client, as squad's own client sends them;
- :mod:`squad.serve.stream_start`: a stream starts as its API says (Messages ``message_start``,
  chat ``role``, one Responses ``response.created``);
- :mod:`squad.serve.early`: a queued stream's early start and keep-alive comments;
- :mod:`squad.serve.cors`: ``OPTIONS`` preflights and allowed origins;
- :mod:`squad.serve.watch`: ``--watch``, drawn from the ledger and admission;
- :mod:`squad.serve.status`: live requests and per-client counts;
- :mod:`squad.serve.replan`: ``--slots auto`` re-planning at quiet moments;
- :mod:`squad.serve.server`: engine session + uvicorn (:func:`serving`).
"""

from __future__ import annotations

from squad.serve.demand import Demand, Refused
from squad.serve.gateway import CLIENT_HEADER, DEFAULT_MAX_TOKENS, PRIORITY_HEADER, SERVE_HEADER, STATUS_PATH, Gateway
from squad.serve.server import HOST, PORT, Served, serving

__all__ = ["Gateway", "Served", "serving", "Demand", "Refused", "SERVE_HEADER", "PRIORITY_HEADER", "CLIENT_HEADER",
           "STATUS_PATH", "DEFAULT_MAX_TOKENS", "HOST", "PORT"]
