"""The source build (``squad engine install --build``) keeps its own real tests.

The whole suite runs on the prebuilt engine (what a fresh machine gets, issue 24); .ci/run then
runs this file with ``SQUAD_ENGINE=source``, together with the launch read-back, ``squad verify``,
the exact counter and the prebuilt/source agreement (tests/engine/test_verify.py,
tests/engine/test_tokens_real.py, tests/engine/test_prebuilt_real.py), once the background build
is done. Without ``SQUAD_ENGINE=source`` this file is skipped: the suite's own pass has no source
build to ask for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from squad.engine.binary import cached_binary_path, resolve_llama_server

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(os.environ.get("SQUAD_ENGINE", "").lower() != "source",
                       reason="the source build's pass: SQUAD_ENGINE=source (.ci/run, after `squad engine "
                              "install --build`)"),
]


def test_the_engine_under_test_is_the_cached_source_build():
    found = resolve_llama_server()
    assert found.path == cached_binary_path(), found
    assert found.source == "cache" and "SQUAD_ENGINE=source" in found.reason


@pytest.mark.timeout(900)
def test_the_readme_main_job_runs_on_the_source_build(default_model_path):
    """The README's first command's job (``squad run recipes/review.yaml``), on the source build."""
    done = subprocess.run([sys.executable, "-m", "squad", "run", str(ROOT / "recipes" / "review.yaml"), "--json", "-t",
                           "2"],
                          capture_output=True, text=True, timeout=840, env={**os.environ, "SQUAD_ENGINE": "source"})
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert data["output"].strip() and not data["errors"]
    assert data["engine"]["slots"] == 3
