#!/usr/bin/env bash
# On a machine with a CUDA GPU, in one short command: the CUDA tests, then the transfer benchmark.
#   tools/gpu_check.sh            # builds .venv if needed (note: the Makefile installs the CPU torch)
#   PYTHON=/path/to/python tools/gpu_check.sh   # use an interpreter that has a CUDA build of torch
# Exits non-zero if there is no CUDA device, a CUDA test fails, or the benchmark fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ] && [ -z "${PYTHON:-}" ]; then make .venv/.kvref-installed; fi
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run with a CUDA build of torch")
print(f"gpu_check: torch {torch.__version__}, {torch.cuda.get_device_name()}")
PYEOF
"$PY" -m pytest -q -m cuda -rs tests
"$PY" tools/bench_transfer.py --device cuda --plot "${PLOT:-bench_transfer_cuda.png}" "$@"
