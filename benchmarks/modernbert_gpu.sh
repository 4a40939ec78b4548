#!/usr/bin/env bash
# ModernBERT on one GPU in one command (about 6 minutes on an H200): the GPU tests of its kernels
# (Triton rotary attention and GeGLU, flash and FlexAttention with the sliding window, the fast
# path's training step and inference against the reference, relative-norm errors printed) run beside the compilation
# of the benchmark's variants; then every variant is timed alone on the GPU:
#   training (MLM step, bf16, fused AdamW) at seq 128 x 256, 512 x 64, 1024 x 32: bert-kit beside
#     transformers' ModernBertForMaskedLM under torch.compile (target 1.5x);
#   inference (the encoder's forward, bf16) at 512 x 64 and 8192 x 4: bert-kit compiled and eager
#     unpadded beside transformers eager and compiled (target 2x);
# MFU counts the sliding windows' real FLOPs. Without transformers' ModernBERT the transformers rows
# are skipped; no flash_attn package is needed (torch's own flash kernel runs the window).
#
#   bash benchmarks/modernbert_gpu.sh                  # PYTHON=... to pick the interpreter
#   TRAIN_VARIANTS=bertkit,hf-eager,hf-compile STEPS=20 bash benchmarks/modernbert_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
STEPS=${STEPS:-10}
TRAIN_VARIANTS=${TRAIN_VARIANTS:-bertkit,hf-compile}
INFER_VARIANTS=${INFER_VARIANTS:-bertkit-unpadded,bertkit,hf-eager,hf-compile}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'" || { echo "needs a CUDA GPU"; exit 2; }
"$PY" -c "import torch, importlib.util as u; print('torch', torch.__version__, '| triton', u.find_spec('triton') is not None,
'| flash_attn package', u.find_spec('flash_attn') is not None, '(not needed)')"

# the GPU tests, beside the compilation (the benchmark times nothing before they end)
( timeout 420 "$PY" -m pytest -q -s -p no:cacheprovider -p no:xdist -k gpu -rfEs \
    tests/kernels/test_rotary_attention.py tests/kernels/test_window_attention.py tests/kernels/test_geglu.py \
    >"$WORK/tests.log" 2>&1
  echo $? >"$WORK/tests.rc"; touch "$WORK/tests.done" ) &
tests=$!

timeout 600 "$PY" benchmarks/modernbert_throughput.py --parallel 4 --wait-file "$WORK/tests.done" \
  --shapes 128x256,512x64,1024x32 --variants "$TRAIN_VARIANTS" \
  --inference 512x64,8192x4 --inference-variants "$INFER_VARIANTS" --warmup 3 --steps "$STEPS"
bench=$?
wait "$tests"

echo
echo "== GPU tests of the ModernBERT kernels (relative-norm errors against the references)"
grep -E "relative error|^(FAILED|ERROR|SKIPPED)|passed|failed|error" "$WORK/tests.log" | grep -v "^$" | tail -60
rc=$(cat "$WORK/tests.rc" 2>/dev/null || echo 1)
echo "tests exit code $rc, benchmark exit code $bench, $(( $(date +%s) - start ))s in all"
[ "$rc" = 0 ] && [ "$bench" = 0 ]
