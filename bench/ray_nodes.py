"""Ray on more than one node: items/s of one map over 1 vs 2 Ray nodes, one fake engine per node (issue 31).

Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``) on 127.0.0.1: a head, and for 2 nodes one worker
node, each with 1 CPU, its own custom resource and an 80 MiB object store. Each node's worker opens its own
``squad.testing.FakeNodeEngine`` (``--slots`` slots, ``--token-delay`` seconds per token, ``max_tokens`` 8): the
engine's time is simulated, so more nodes means more slots answering at once, as more machines would give. Both
node counts run the same ``--items``-item recipe map (``run_recipe(..., ray=RayFanout(worker_engine=...))``), each
in a fresh process, alternating per repeat. The map's time: from the last ``worker.started`` to the last item
served. Every node shares this machine's 2 cores (and the driver's): report the ratio, not the rates.

    .venv/bin/python bench/ray_nodes.py [--items 200] [--repeats 2] [--slots 4] [--token-delay 0.01]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OBJECT_STORE = 80 * 2**20
MAX_TOKENS = 8


def _recipe_text(n: int) -> str:
    words = ", ".join(f"w{i:04d}" for i in range(n))
    return (f"name: nodes\nparams:\n  items: {{type: list, default: [{words}]}}\nagents:\n"
            f"  echo: {{instructions: Repeat., max_tokens: {MAX_TOKENS}}}\n  boss: {{instructions: Be brief.}}\n"
            "main: boss\nflow:\n  - id: words\n    map: params.items\n    agent: echo\n"
            "    prompt: \"Say {{ item }}\"\n")


def child(nodes: int, items: int, slots: int, token_delay: float) -> dict:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    temp = tempfile.mkdtemp(prefix="sqbn-")
    os.mkdir(os.path.join(temp, "ray"))
    os.environ["RAY_TMPDIR"] = temp  # Ray's files and the cluster's address file here, not /tmp/ray
    import anyio
    import ray
    from ray.cluster_utils import Cluster

    from squad.cluster.ray import RayFanout
    from squad.events import WorkerStarted
    from squad.recipes import load_recipe, run_recipe
    from squad.testing.fake_node import FakeNodeEngine

    def args(k: int) -> dict:
        got: dict = dict(num_cpus=1, resources={f"squad-node-{k}": 1}, object_store_memory=OBJECT_STORE,
                         node_ip_address="127.0.0.1")
        if k == 0:
            got.update(temp_dir=temp, include_dashboard=False)
        return got

    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=args(0))
        for k in range(1, nodes):
            cluster.add_node(**args(k))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        path = Path(temp) / "nodes.yaml"
        path.write_text(_recipe_text(items))
        recipe = load_recipe(path, {})
        marks: dict[str, float] = {}

        def on_event(event: object) -> None:
            if isinstance(event, WorkerStarted):
                marks["ready"] = time.monotonic()

        def on_item(result: object) -> None:
            marks["last"] = time.monotonic()

        fanout = RayFanout(address=cluster.address, worker_engine=FakeNodeEngine(slots=slots, token_delay=token_delay),
                           on_item=on_item)
        run = anyio.run(lambda: run_recipe(recipe, engine=recipe.engine_spec(), ray=fanout, on_event=on_event))
        results = [r for sid, r in run.results if sid == "words"]
        failed = [r for r in results if r.error is not None]
        if failed or [r.item for r in results] != list(range(items)):
            raise RuntimeError(f"{len(failed)} items failed or out of order: {failed[:1]}")
        return {"nodes": len({w.node_id for w in fanout.workers}), "map_s": marks["last"] - marks["ready"],
                "per_worker": sorted(w["items"] for w in run.workers)}
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--token-delay", type=float, default=0.01)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.items, a.slots, a.token_delay)), flush=True)
        return
    from _common import md_table, spread

    got: dict[int, list[dict]] = {1: [], 2: []}
    for r in range(a.repeats):
        for nodes in ((1, 2) if r % 2 == 0 else (2, 1)):
            argv = [sys.executable, __file__, "--child", str(nodes), "--items", str(a.items), "--slots", str(a.slots),
                    "--token-delay", str(a.token_delay)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"{nodes} node(s) failed:\n{done.stderr[-3000:]}")
            got[nodes].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {r + 1}: {nodes} node(s) done", file=sys.stderr)
    rate = {n: [a.items / x["map_s"] for x in runs] for n, runs in got.items()}
    ratios = [two / one for one, two in zip(rate[1], rate[2])]
    rows = [[n, statistics.median(x["nodes"] for x in got[n]), spread([x["map_s"] for x in got[n]], 2),
             spread(rate[n], 1), "; ".join("+".join(map(str, x["per_worker"])) for x in got[n])] for n in (1, 2)]
    print(f"### {a.items} items over 1 vs 2 Ray nodes, one FakeNodeEngine per node ({a.slots} slots, "
          f"{a.token_delay * 1e3:g} ms per token, {MAX_TOKENS} tokens per item; {a.repeats} repeats, "
          "median (min–max))\n")
    print(md_table(["Ray nodes", "nodes used", "map s", "items/s", "items per worker (each repeat)"], rows))
    print(f"\n2 nodes / 1 node items/s: {spread(ratios, 2)} (paired per repeat; the nodes share this machine's cores)")


if __name__ == "__main__":
    main()
