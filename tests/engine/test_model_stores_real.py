"""A real llama-server runs a model resolved through each store kind: the Hugging Face cache,
Ollama's blob, LM Studio's folder and a split GGUF passed by its first part (one engine at a
time, 2 threads, 8 tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch_support import THREADS
from squad.engine.session import EngineSpec
from squad.runtime.agent import Agent
from squad.runtime.squad import Squad
from store_support import CARD, hf_cache, link, ollama_store, split_gguf

pytestmark = [pytest.mark.engine, pytest.mark.anyio]


async def test_a_model_from_each_store_runs(tmp_path, monkeypatch, llama_server_path: Path,
                                            default_model_path: Path) -> None:
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("SQUAD_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)

    snapshot = hf_cache(tmp_path / "hf", "bartowski/SmolLM2-135M-Instruct-GGUF",
                        {"SmolLM2-135M-Instruct-Q4_1.gguf": default_model_path, "README.md": CARD})
    ollama_store(tmp_path / "ollama", default_model_path, "smollm2", "135m")
    lms = link(default_model_path,
               tmp_path / "lmstudio" / "HuggingFaceTB" / "SmolLM2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    parts = split_gguf(default_model_path, tmp_path / "split" / "SmolLM2-Q4_1.gguf", parts=2)
    cases = {
        "hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1": snapshot / "SmolLM2-135M-Instruct-Q4_1.gguf",
        "ollama:smollm2:135m": next((tmp_path / "ollama" / "blobs").glob("sha256-b179*")),
        "lmstudio:HuggingFaceTB/SmolLM2:Q4_1": lms,
        str(parts[0]): parts[0],
    }
    agent = Agent(name="a", instructions="Answer in three words.", budget=256, max_tokens=8,
                  sampling={"temperature": 0.0, "seed": 1})
    for ref, path in cases.items():
        async with Squad([agent], engine=EngineSpec(model=ref, binary=llama_server_path, threads=THREADS)) as sq:
            assert Path(sq.info.model_path) == path, ref
            result = await sq.run("Name a colour.")
        assert result.main.ok and result.output.strip(), (ref, result.main.summary())
        assert result.main.usage.completion_tokens > 0, ref
