#!/usr/bin/env bash
# GPU checks for one lent GPU (e.g. an H200), a few minutes in all. Not part of CI or the tests.
#   bash bench/gpu.sh            (from the repository root, with torch for CUDA installed)
# Prints, for the ~124M gpt2-small preset: tokens/s, MFU and peak memory of lehr's loop vs a bare
# loop in bf16 without and with torch.compile (goal: MFU >= 50% on an H200), and with FP8 block
# matmuls compiled; the synchronizing CUDA operations between two log steps (goal: the one read of
# the log step); and the engine's resume, guard and host-read tests on CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! $PY -c "import lehr" 2>/dev/null; then
  $PY -m pip install --quiet -e . || { echo "install failed" >&2; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
common=(--preset gpt2-small --vocab 50304 --device cuda --precision bf16 --batch 64 --micro 32 --steps 30 --warmup 10 --rounds 2)
echo "== gpt2-small, bf16, eager =="
$PY bench/train_loop.py "${common[@]}"
echo "== gpt2-small, bf16, torch.compile =="
$PY bench/train_loop.py "${common[@]}" --compile
echo "== gpt2-small, fp8 block matmuls (torchao), torch.compile =="
$PY -m pip install --quiet "torchao>=0.14" && $PY bench/train_loop.py "${common[@]/bf16/fp8}" --compile
echo "== synchronizing CUDA operations per log interval (goal: 1) =="
$PY bench/syncs.py
echo "== engine tests on CUDA (resume exactness, guards, one read per log step) =="
$PY -m pytest -q tests/engine/test_resume.py::test_in_process_stop_and_resume_is_exact tests/engine/test_guards.py \
  tests/engine/test_host_syncs.py
