"""``squad serve``'s generation limit on the real llama-server: the field case of issue 28
(``n_predict: -1`` beside ``max_tokens: 8`` and ``ignore_eos``, which b11434 read as "no limit" and
which filled the pool and failed every client beside it) now generates 8 tokens while two others run;
20 bodies drawn (seeded) from the fields llama-server reads for each API generate at most what squad
reserved, counted from the engine's own usage; /infill and /v1/rerank go through admission to the
engine. The fake engine's property test: tests/serve/test_serve_admission.py."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from serve_support import squad_serve

pytestmark = pytest.mark.engine

KEY = "serve-admission-key-0123456789"
DEFAULT = 6
PROMPT = "Count to ten."


@pytest.fixture(scope="module")
def url(tmp_path_factory, llama_server_path, default_model_path):
    state = tmp_path_factory.mktemp("state")
    with squad_serve(state, KEY, llama_server_path, default_model_path, ctx=2048, slots=4,
                     args=("--default-max-tokens", str(DEFAULT))) as (served, _):
        yield served


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=850)


def generated(path: str, answer: dict[str, Any]) -> int:
    """Tokens the engine generated, from its own usage in the answer."""
    if path in ("/v1/responses", "/v1/messages"):
        return answer["usage"]["output_tokens"]
    if path in ("/completion", "/infill"):
        return answer["tokens_predicted"]
    return answer["usage"]["completion_tokens"]


@pytest.mark.timeout(900)  # 248 tokens on 2 shared cores took 182 s at load 14, over 300 s at load 20
def test_n_predict_minus_one_beside_max_tokens_8_generates_8_while_two_others_run(url):
    """The field case: on main b11434 read n_predict -1 first and generated until the pool was full."""
    chat = {"messages": [{"role": "user", "content": PROMPT}], "ignore_eos": True}
    bodies = [{**chat, "max_tokens": 60}, {**chat, "max_tokens": 60},
              {**chat, "max_tokens": 8, "n_predict": -1}]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda b: post(url, "/v1/chat/completions", b), bodies))
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text[:300] for a in answers]
    assert [generated("/v1/chat/completions", a.json()) for a in answers] == [60, 60, 8]
    assert all(a.json()["choices"][0]["finish_reason"] == "length" for a in answers)


PATHS = ["/v1/chat/completions", "/v1/completions", "/completion", "/v1/responses", "/v1/messages"]
BASE = {"/v1/chat/completions": {"messages": [{"role": "user", "content": PROMPT}]},
        "/v1/completions": {"prompt": PROMPT}, "/completion": {"prompt": PROMPT},
        "/v1/responses": {"input": PROMPT}, "/v1/messages": {"messages": [{"role": "user", "content": PROMPT}]}}
FIELDS = {"n_predict": [-1, 3, 9, None], "max_tokens": [None, 5, 11], "max_completion_tokens": [None, 7],
          "max_output_tokens": [None, 10], "n": [None, 1], "n_cmpl": [None, 1], "id_slot": [0, 3],
          "n_keep": [-1, 5], "cache_prompt": [False, True], "t_max_predict_ms": [0, -1]}


def reserved_limit(path: str, body: dict[str, Any]) -> int:
    """What squad serve reserves for generation: the largest limit field the API reads, else its default."""
    names = {"/v1/messages": ("max_tokens",), "/v1/responses": tuple(FIELDS)[:4]}.get(path, tuple(FIELDS)[:3])
    given = [body[n] for n in names if isinstance(body.get(n), int) and body[n] >= 1]
    return max(given) if given else DEFAULT


@pytest.mark.timeout(1200)  # 20 short requests, on 2 shared cores at load 17 this took over 300 s
def test_twenty_generated_bodies_generate_at_most_what_squad_reserved(url):
    rng = random.Random(28)
    for _ in range(20):
        path = rng.choice(PATHS)
        body = {**BASE[path], "ignore_eos": True, "temperature": 0, "seed": 1}
        for name in rng.sample(sorted(FIELDS), 5):
            body[name] = rng.choice(FIELDS[name])
        got = post(url, path, body)
        assert got.status_code == 200, (path, body, got.text[:300])
        cap, made = reserved_limit(path, body), generated(path, got.json())
        assert made <= cap, (path, body, made)
        if path != "/v1/messages":  # the limit written is the one reserved (Messages pass no ignore_eos on)
            assert made == cap, (path, body, made)


def test_infill_and_rerank_go_through_admission_to_the_engine(url):
    infill = post(url, "/infill", {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": -1,
                                   "max_tokens": 6, "ignore_eos": True})
    if infill.status_code == 200:  # SmolLM2 has FIM tokens
        assert generated("/infill", infill.json()) == 6
    else:  # the engine's own answer for a model without them, passed on as it is
        assert infill.status_code == 501 and "Infill is not supported" in infill.text, infill.text
    rerank = post(url, "/v1/rerank", {"query": "q", "documents": ["a", "b"]})
    # squad's engine is not started with --reranking: the engine's 501 naming the flag, after admission
    assert rerank.status_code == 501 and "--reranking" in rerank.text, rerank.text
    status = httpx.get(url + "/squad/status", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert status["admission"]["reserved"] == 0
