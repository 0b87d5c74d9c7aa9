#!/usr/bin/env bash
# On a machine with a CUDA GPU, in one short command: the CUDA tests, then the transfer benchmark.
#   tools/gpu_check.sh [bench_transfer options...]
# The interpreter is $PYTHON if set, else the first of .venv/bin/python and python3 whose torch
# sees a CUDA device (the Makefile's .venv holds the CPU build of torch; a GPU image's python3
# usually has a CUDA build). It needs torch, pytest, hypothesis, typer and typing_extensions.
# Exits non-zero if there is no CUDA device, a CUDA test fails, or the benchmark fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null && has_cuda "$candidate"; then PY="$candidate"; break; fi
  done
fi
if [ -z "$PY" ] || ! has_cuda "$PY"; then
  echo "gpu_check: no interpreter whose torch sees a CUDA device (set PYTHON=...)" >&2
  exit 2
fi
"$PY" -c 'import torch; print(f"gpu_check: {torch.__version__} on {torch.cuda.get_device_name()}")'
"$PY" -m pytest -q -m cuda -rs -p no:cacheprovider tests
"$PY" tools/bench_transfer.py --device cuda --plot "${PLOT:-bench_transfer_cuda.png}" "$@"
