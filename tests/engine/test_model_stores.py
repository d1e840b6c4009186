"""Model references into stores people already have, on real stores built on disk around the
built-in GGUF: Ollama (manifests → blobs), LM Studio's folder, the Hugging Face cache (its
documented layout), split GGUF files; `squad models list|info` over all of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_support import squad as run_cli
from squad.engine import hub, stores
from squad.engine.facts import read_model_facts
from squad.engine.registry import find_model, list_stores, resolve_model
from squad.errors import ModelError, UnknownModel
from store_support import CARD, GEMMA_CARD, hf_cache, link, ollama_store, split_gguf


@pytest.fixture(autouse=True)
def empty_stores(tmp_path, monkeypatch):
    """Every store empty and inside tmp_path, whatever this machine has."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("SQUAD_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)  # no test here may reach a network
    monkeypatch.setattr(hf_constants, "ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture(scope="module")
def split_model(default_model_path, tmp_path_factory) -> list[Path]:
    return split_gguf(default_model_path, tmp_path_factory.mktemp("split") / "SmolLM2-Q4_1.gguf", parts=3)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: to prove a store was only read."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


# --- Ollama ----------------------------------------------------------------------------------


def test_ollama_name_and_tag_resolve_to_the_blob_read_only(tmp_path, default_model_path):
    root = tmp_path / "ollama"
    ollama_store(root, default_model_path, "smollm2", "135m")
    ollama_store(root, default_model_path, "smollm2", "latest", license_text=None)
    ollama_store(root, default_model_path, "mine", "v1", namespace="someone")
    before = tree(root)
    blob = next((root / "blobs").glob("sha256-b179*"))
    assert resolve_model("ollama:smollm2:135m") == blob
    assert resolve_model("ollama:smollm2") == blob  # tag latest
    assert resolve_model("ollama:SmolLM2:135M") == blob  # Ollama's names ignore case
    assert resolve_model("ollama:someone/mine:v1") == blob
    found = find_model("ollama:smollm2:135m")
    assert found.store == "ollama" and found.size == 98_362_432 and found.license == "Apache License"
    assert read_model_facts(found.path).architecture == "llama"
    assert sorted(m.ref for m in stores.list_ollama()) == [
        "ollama:smollm2:135m", "ollama:smollm2:latest", "ollama:someone/mine:v1"]
    assert tree(root) == before  # nothing written into Ollama's store


def test_ollama_default_location_without_ollama_models(tmp_path, default_model_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS")
    ollama_store(tmp_path / "home" / ".ollama" / "models", default_model_path)
    assert stores.ollama_dirs()[0] == tmp_path / "home" / ".ollama" / "models"
    assert find_model("ollama:smollm2:135m").store == "ollama"


def test_ollama_errors_name_the_store_and_what_is_there(tmp_path, default_model_path):
    root = tmp_path / "ollama"
    with pytest.raises(UnknownModel, match=f"no Ollama model 'qwen:latest' in {root}.*no Ollama models there"):
        resolve_model("ollama:qwen")
    manifest = ollama_store(root, default_model_path)
    with pytest.raises(UnknownModel, match=r"smollm2:7b.*OLLAMA_MODELS.*Ollama has ollama:smollm2:135m"):
        resolve_model("ollama:smollm2:7b")
    with pytest.raises(UnknownModel, match="not an Ollama model name"):
        resolve_model("ollama:a/b/c/d:x")
    next((root / "blobs").glob("sha256-b179*")).unlink()
    with pytest.raises(ModelError, match=r"is missing; run `ollama pull smollm2:135m`"):
        resolve_model("ollama:smollm2:135m")
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.license",
                                                "digest": "sha256:00"}]}))
    with pytest.raises(ModelError, match="has no GGUF model layer"):
        resolve_model("ollama:smollm2:135m")
    manifest.write_text("{not json")
    with pytest.raises(ModelError, match="cannot read Ollama's manifest"):
        resolve_model("ollama:smollm2:135m")


# --- LM Studio -------------------------------------------------------------------------------


def test_lmstudio_folder_by_repo_quant_and_file(tmp_path, default_model_path, monkeypatch):
    monkeypatch.delenv("SQUAD_LMSTUDIO_MODELS")
    root = tmp_path / "home" / ".lmstudio" / "models"  # LM Studio 0.3's default folder
    folder = root / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    q4 = link(default_model_path, folder / "SmolLM2-135M-Instruct.Q4_1.gguf")
    link(default_model_path, folder / "SmolLM2-135M-Instruct-Q8_0.gguf")
    (folder / "mmproj-SmolLM2-f16.gguf").write_bytes(b"GGUF")
    assert resolve_model("lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1") == q4
    assert resolve_model("lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:q4_1") == q4
    assert resolve_model("lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf") == q4
    with pytest.raises(ModelError, match=r"2 GGUF files and none is Q4_K_M.*\(Q4_1, Q8_0\)"):
        resolve_model("lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    with pytest.raises(ModelError, match=r"has no Q2_K file"):
        resolve_model("lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q2_K")
    assert [m.ref for m in stores.list_lmstudio()] == [
        "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q8_0.gguf",
        "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf",
    ]  # the projector file is no model
    with pytest.raises(UnknownModel, match=r"no other/model in LM Studio's models folder .*\.lmstudio/models.*"
                                            r"SQUAD_LMSTUDIO_MODELS.*LM Studio has lmstudio:HuggingFaceTB"):
        resolve_model("lmstudio:other/model")
    with pytest.raises(UnknownModel, match="write lmstudio:PUBLISHER/MODEL"):
        resolve_model("lmstudio:justone")


# --- split GGUF ------------------------------------------------------------------------------


def test_a_split_model_is_passed_by_its_first_part(split_model, tmp_path):
    first, second, third = split_model
    total = sum(p.stat().st_size for p in split_model)
    assert resolve_model(str(first)) == first
    assert stores.model_bytes(first) == total
    assert read_model_facts(first).file_size == total
    with pytest.raises(ModelError, match=rf"part 2 of a split model; pass its first part, {first}"):
        resolve_model(str(second))
    lonely = link(first, tmp_path / "alone" / first.name)
    link(third, tmp_path / "alone" / third.name)
    with pytest.raises(ModelError, match=rf"split into 3 parts but {second.name} is missing"):
        resolve_model(str(lonely))


def test_a_split_model_in_lmstudio_is_one_model(split_model, tmp_path):
    folder = tmp_path / "lmstudio" / "me" / "smol-split"
    for part in split_model:
        link(part, folder / part.name)
    found = find_model("lmstudio:me/smol-split:Q4_1")
    assert found.path == folder / split_model[0].name
    assert found.size == sum(p.stat().st_size for p in split_model)
    assert len(stores.list_lmstudio()) == 1


# --- the Hugging Face cache ------------------------------------------------------------------


def test_hf_cache_resolves_with_no_network(tmp_path, default_model_path):
    snapshot = hf_cache(tmp_path / "hf", "bartowski/SmolLM2-135M-Instruct-GGUF", {
        "SmolLM2-135M-Instruct-Q4_1.gguf": default_model_path, "README.md": CARD})
    want = snapshot / "SmolLM2-135M-Instruct-Q4_1.gguf"
    for ref in ("hf:bartowski/SmolLM2-135M-Instruct-GGUF", "hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_1",
                "hf:bartowski/SmolLM2-135M-Instruct-GGUF:q4_1",
                "hf:bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_1.gguf"):
        found = find_model(ref, pull=False)
        assert found.path == want and found.store == "hf" and found.license == "apache-2.0", ref
    assert [m.ref for m in hub.list_hf()] == ["hf:bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q4_1.gguf"]


def test_hf_cache_split_model_and_gemma_license(tmp_path, split_model):
    hf_cache(tmp_path / "hf", "google/gemma-like-GGUF", {f"Q4_1/{p.name}": p for p in split_model[:2]}
             | {"README.md": GEMMA_CARD})
    with pytest.raises(ModelError, match="not in the Hugging Face cache.*squad models pull"):
        resolve_model("hf:google/gemma-like-GGUF:Q4_1", pull=False)  # part 3 is not cached
    hf_cache(tmp_path / "hf", "google/gemma-like-GGUF", {f"Q4_1/{split_model[2].name}": split_model[2]})
    found = find_model("hf:google/gemma-like-GGUF:Q4_1", pull=False)
    assert found.path.name == split_model[0].name and found.license == "gemma"
    assert found.size == sum(p.stat().st_size for p in split_model)


def test_hf_offline_and_not_cached_says_so(tmp_path):
    with pytest.raises(ModelError, match=rf"hf:org/repo:Q4_K_M is not in the Hugging Face cache \({tmp_path / 'hf'}\) "
                                         "and HF_HUB_OFFLINE is set"):
        resolve_model("hf:org/repo:Q4_K_M")
    for bad in ("hf:org", "hf:org/repo/file.bin", "hf:org/repo:", "hf:org/repo/sub/x.gguf:Q4"):
        with pytest.raises(UnknownModel):
            resolve_model(bad)


# --- every store at once ---------------------------------------------------------------------


def test_an_unknown_model_names_every_store_searched(tmp_path, default_model_path):
    ollama_store(tmp_path / "ollama", default_model_path, "smollm2", "135m")
    with pytest.raises(UnknownModel) as caught:
        resolve_model("smollm")
    message = str(caught.value)
    for where in ("squad's registry (smollm2-135m, gemma3-270m)", f"Hugging Face cache ({tmp_path / 'hf'})",
                  f"Ollama ({tmp_path / 'ollama'})", f"LM Studio ({tmp_path / 'lmstudio'})",
                  "did you mean ollama:smollm2:135m?", "hf:ORG/REPO[:QUANT]", "ollama:NAME[:TAG]",
                  "lmstudio:PUBLISHER/MODEL"):
        assert where in message, where


def test_models_list_and_info_show_every_store(tmp_path, default_model_path, capsys, monkeypatch):
    from squad.cli._app import console

    monkeypatch.setattr(console, "_width", 250)
    ollama_store(tmp_path / "ollama", default_model_path, "smollm2", "135m")
    link(default_model_path, tmp_path / "lmstudio" / "HuggingFaceTB" / "smol" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    hf_cache(tmp_path / "hf", "google/gemma-like-GGUF", {"m-Q4_1.gguf": default_model_path, "README.md": GEMMA_CARD})
    assert {k: len(v[1]) for k, v in list_stores().items() if k != "squad"} == {"hf": 1, "ollama": 1, "lmstudio": 1}

    code, out, err = run_cli(capsys, "models", "list", "--json")
    assert code == 0, err
    rows = {r["store"]: r for r in json.loads(out) if r["store"] != "squad"}
    assert set(rows) == {"hf", "ollama", "lmstudio"}
    for row in rows.values():
        assert row["size"] == 98_362_432 and row["architecture"] == "llama"
        assert row["n_ctx_train"] == 8192 and row["kv_bytes_per_token"] == 23_040
    assert rows["hf"]["license"] == "gemma" and rows["ollama"]["license"] == "Apache License"
    assert rows["lmstudio"]["license"] == "apache-2.0"  # the GGUF's own general.license

    code, out, err = run_cli(capsys, "models", "list")
    assert code == 0, err
    for text in ("ollama:smollm2:135m", "hf:google/gemma-like-GGUF/m-Q4_1.gguf", "23,040", "Hugging Face cache",
                 str(tmp_path / "ollama"), str(tmp_path / "lmstudio")):
        assert text in out.replace("\n", ""), text

    code, out, err = run_cli(capsys, "models", "info", "hf:google/gemma-like-GGUF:Q4_1", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["store"] == "hf" and info["license"] == "gemma" and info["kv_bytes_per_token"]["f16"] == 23_040

    code, out, err = run_cli(capsys, "models", "info", "ollama:nothing")
    assert code == 2 and "no Ollama model 'nothing:latest'" in err and "Traceback" not in err


def test_a_recipe_and_the_planner_take_a_reference(tmp_path, default_model_path, capsys):
    ollama_store(tmp_path / "ollama", default_model_path, "smollm2", "135m")
    code, out, err = run_cli(capsys, "plan", "--agents", "a:512", "-m", "ollama:smollm2:135m", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == str(next((tmp_path / "ollama" / "blobs").glob("sha256-b179*")))


def test_store_directories_come_from_their_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", " /srv/ollama ")
    assert stores.ollama_dirs() == [Path("/srv/ollama")]
    monkeypatch.delenv("OLLAMA_MODELS")
    monkeypatch.delenv("SQUAD_LMSTUDIO_MODELS")
    home = Path(os.environ["HOME"])
    assert stores.ollama_dirs()[0] == home / ".ollama" / "models"
    assert stores.lmstudio_dirs() == [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def test_a_recipe_names_a_model_by_reference(tmp_path, default_model_path, capsys):
    ollama_store(tmp_path / "ollama", default_model_path, "smollm2", "135m")
    body = "agents:\n  a:\n    instructions: Hi.\nmain: a\nflow:\n  - agent: a\n    prompt: Say hi.\n"
    good = tmp_path / "good.yaml"
    good.write_text("name: good\nmodel: ollama:smollm2:135m\n" + body)
    code, out, err = run_cli(capsys, "plan", good, "--json")
    assert code == 0, err
    assert json.loads(out)["model"].startswith(str(tmp_path / "ollama" / "blobs"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: ollama:nothing:7b\n" + body)
    code, out, err = run_cli(capsys, "plan", bad, "--json")
    assert code == 2 and f"{bad}:2" in err and "no Ollama model 'nothing:7b'" in err, err
    later = tmp_path / "later.yaml"  # an hf: file not cached yet: the recipe loads, `squad run` downloads it
    later.write_text("name: later\nmodel: hf:org/not-cached-GGUF:Q4_K_M\n" + body)
    code, out, err = run_cli(capsys, "recipes", "validate", later)
    assert code == 0, err


def test_offline_with_other_quants_cached_lists_them_and_how_to_pick_one(tmp_path, default_model_path):
    """Issue 19: the repository is cached, only not in the quantization asked for (or the
    default one): the error lists what is cached and the reference that picks it."""
    repo = "bartowski/SmolLM2-135M-Instruct-GGUF"
    hf_cache(tmp_path / "hf", repo, {"SmolLM2-135M-Instruct-Q4_1.gguf": default_model_path,
                                     "SmolLM2-135M-Instruct-Q8_0.gguf": default_model_path, "README.md": CARD})
    for ref in (f"hf:{repo}", f"hf:{repo}:Q2_K"):
        with pytest.raises(ModelError) as info:
            resolve_model(ref)  # offline (the fixture)
        text = str(info.value)
        assert "not in the Hugging Face cache" in text and "HF_HUB_OFFLINE is set" in text
        assert f"SmolLM2-135M-Instruct-Q4_1.gguf (hf:{repo}:Q4_1)" in text
        assert f"SmolLM2-135M-Instruct-Q8_0.gguf (hf:{repo}:Q8_0)" in text
        assert f"-m hf:{repo}:Q4_1" in text
        with pytest.raises(ModelError, match=rf"squad models pull .*, or run one the cache does hold of {repo}"):
            resolve_model(ref, pull=False)
    assert find_model(f"hf:{repo}:Q8_0", pull=False).path.name == "SmolLM2-135M-Instruct-Q8_0.gguf"  # as told
