#!/usr/bin/env bash
# GPU check: on one CUDA GPU, in at most 8 minutes, a random-init 1.1B Llama
# (TinyLlama-1.1B's shape) in bf16, micro-batch 4 x 512 tokens: peak CUDA memory against
# `memfit plan`'s estimate, and tokens/s against the peer doing the same job, for
#   LoRA (vs PEFT), QLoRA (vs PEFT + bitsandbytes), full AdamW8bit (vs bitsandbytes),
#   layer-wise GaLore (vs HF Trainer optim="galore_adamw_layerwise").
# The logic is `memfit bench` (src/memfit/bench); this script only checks for CUDA,
# bounds the time and says where the results are: OUT/bench.md (one file).
#
#   bash benchmarks/gpu_check.sh [OUT]        # default OUT: gpu-check
set -euo pipefail
out="${1:-gpu-check}"
python="${PYTHON:-python}"
if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: needs a CUDA GPU (torch.cuda.is_available() is False here);" \
         "on CPU run: memfit bench --suite all" >&2
    exit 2
fi
# 8 steps per case: memory measured on steps 2, 4, 6, 8, tokens/s timed on steps 3, 5, 7.
timeout 480 "$python" -m memfit bench --suite speed --model llama-1b --cases gpu-check \
    --steps 8 --out "$out"
echo "gpu_check.sh: results in $out/bench.md"
