"""The planner's KV estimate against the engine's own ``llama_kv_cache: size`` log lines.

For both built-in models (SmolLM2-135M: full attention on all 30 layers; Gemma 3 270M: a
512-token sliding window on 15 of 18 layers) at two contexts and slot counts, squad plans the
engine (:func:`squad.engine.session.plan_engine`), launches it with ``-lv 4`` (the size lines are
logged only at that verbosity) and compares ``EnginePlan.kv_bytes`` with the sum of the size
lines. The issue's bar is 2%; measured on b11434 the difference is 0 bytes for every case
(the sliding-window cells, ``pad256(window × slots + ubatch)``, match the engine's own rule),
so the test pins that it stays within 2% and prints the difference.
"""

from __future__ import annotations

import anyio
import pytest

from launch_support import engine_kv_bytes
from squad.engine.launcher import Launcher
from squad.engine.registry import resolve_model
from squad.engine.session import EngineSpec, plan_engine
from squad.errors import SquadError

pytestmark = pytest.mark.engine

def test_engine_kv_size_line_parser():
    log = ("llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  2/1 seqs), K (f16): 6.00 MiB\n"
           "llama_kv_cache: size =   22.50 MiB (  1536 cells,  15 layers,  2/1 seqs), K (f16): 11.25 MiB\n")
    assert engine_kv_bytes(log) == (int(34.5 * 2**20), [(4096, 3), (1536, 15)])


def _model(name: str):
    try:
        return resolve_model(name, pull=True)
    except SquadError as exc:
        pytest.skip(f"{name} not available: {exc}")


CASES = [
    ("smollm2-135m", 2048, 2),
    ("smollm2-135m", 16384, 4),
    ("gemma3-270m", 4096, 2),
    ("gemma3-270m", 16384, 4),
]


@pytest.mark.parametrize(("model", "ctx", "slots"), CASES, ids=[f"{m}-{c}-np{s}" for m, c, s in CASES])
def test_planned_kv_bytes_match_the_engine_log(model, ctx, slots, llama_server_path, tmp_path, capsys):
    path = _model(model)
    planned = plan_engine(EngineSpec(model=path, slots=slots, ctx=ctx), None)

    async def launch() -> str:
        async with Launcher(planned, binary=llama_server_path, threads=1, log_dir=tmp_path,
                            extra_args=["-lv", "4"]) as engine:
            return engine.log_path.read_text(errors="replace")

    log = anyio.run(launch)
    logged, caches = engine_kv_bytes(log)
    assert caches, f"no llama_kv_cache size line in the engine log:\n{log[-2000:]}"
    diff = planned.kv_bytes - logged
    with capsys.disabled():
        print(f"\n{model} -c {ctx} -np {slots}: planned {planned.kv_bytes:,} B, engine {logged:,} B "
              f"({caches}), difference {diff:+,} B ({diff / logged:+.2%})")
    assert abs(diff) <= 0.02 * logged
    if model == "gemma3-270m":
        assert len(caches) == 2 and planned.kv_bytes_full > planned.kv_bytes  # the window's saving is shown
    else:
        assert planned.kv_bytes_full == planned.kv_bytes
