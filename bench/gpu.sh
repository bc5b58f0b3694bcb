#!/usr/bin/env bash
# GPU checks for one lent GPU (e.g. an H200), a few minutes in all. Not part of CI or the tests.
#   bash bench/gpu.sh            (from the repository root)
# Needs only a Python whose torch sees CUDA, with numpy, tokenizers, safetensors and tqdm: the
# engine runs from src/ without installing lehr, so GPU images without Kedro or DVC do. Prints, for
# the ~124M gpt2-small preset: tokens/s, MFU and peak memory of lehr's loop vs a bare loop in bf16,
# eager and compiled (goal: MFU >= 50% on an H200), and with FP8 block matmuls, compiled; then the
# engine's CUDA checks (host syncs per log interval, exact resume, the non-finite guard); then FSDP2
# runs of gpt2-small with and without activation checkpointing, and of the ~1B llama-1b preset
# with Muon and with AdamW; then the GPU line (bench/gpu_line.py, alone in <= 8 minutes): the
# project's shards and tasks (data/04_feature, ~9 MB: copy it to the GPU machine) trained at a fixed token budget by
# llama-350m and llama-1b under FSDP2 with Muon, compiled, evals included: tok/s, MFU, eval share.
# FP8 needs torchao; on a machine without a package index, carry a wheel in .wheels/
# (`pip download "torchao>=0.14" --no-deps -d .wheels` beforehand).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
common=(--preset gpt2-small --vocab 50304 --device cuda --batch 64 --micro 32 --steps 30 --warmup 10 --rounds 2)
echo "== gpt2-small, bf16, eager =="
$PY bench/train_loop.py "${common[@]}" --precision bf16 --no-compile
echo "== gpt2-small, bf16, torch.compile =="
$PY bench/train_loop.py "${common[@]}" --precision bf16 --compile
echo "== gpt2-small, fp8 block matmuls (torchao), torch.compile =="
if $PY -c "import torchao" 2>/dev/null || $PY -m pip install --quiet --no-index --find-links .wheels "torchao>=0.14"; then
  $PY bench/train_loop.py "${common[@]}" --precision fp8 --compile
else
  echo "skipped: torchao is not installed and .wheels/ holds no wheel of it"
fi
echo "== FSDP2 (one process, one shard): MFU and peak memory, with and without activation checkpointing =="
for ac in none blocks; do
  $PY bench/train_loop.py "${common[@]}" --precision bf16 --compile --parallel fsdp --optimizer adamw --activation-checkpointing $ac
done
echo "== llama-1b under FSDP2 with Muon (the default) and with AdamW: MFU and peak memory =="
for opt in muon adamw; do
  $PY bench/train_loop.py --preset llama-1b --vocab 32000 --device cuda --batch 16 --micro 8 --steps 10 \
    --warmup 5 --rounds 1 --precision bf16 --compile --parallel fsdp --optimizer $opt --activation-checkpointing blocks
done
echo "== engine checks on CUDA =="
$PY bench/cuda_checks.py
echo "== the GPU line: llama-350m and llama-1b, 2M tokens each, FSDP2 + Muon, evals included =="
if [ -f data/04_feature/shards/manifest.json ]; then
  $PY bench/gpu_line.py
else
  echo "skipped: no shards in data/04_feature (make run builds them; carry data/04_feature to the GPU machine)"
fi
