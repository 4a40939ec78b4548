"""ModernBERT's sliding-window attention kernels (`bert_kit.kernels.rotary_attention`) timed alone beside
torch's flash varlen attention with the same window (a diagnostic: the training step's figures are
`modernbert_throughput.py`'s).

One layer of ModernBERT-base's shape (12 heads of 64, window +-64), bf16, 32,768 packed tokens as
(batch x length) full sequences; median of 20 CUDA-event timings after 3 warm-up calls:
- flash: `aten._flash_attention_forward` with window_size (64, 64) on q, k, v already turned (the
  rotations it needs are not counted: in the model they are other kernels);
- window kernels: `window_rotary_attention` from the QKV projection's output, rotations included.
--sweep also times the kernels at other tiles (queries per block, warps).

    python benchmarks/window_attention.py
    python benchmarks/window_attention.py --sweep
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.kernels import rotary_attention  # noqa: E402
from bert_kit.kernels.packing import Packed  # noqa: E402
from bert_kit.modernbert import rotary  # noqa: E402
from attention_backends import time_ms  # noqa: E402  (beside this script)

HEADS, HEAD_DIM, WINDOW = 12, 64, 64
SHAPES = ((64, 512), (32, 1024), (4, 8192))  # (batch, length): 32,768 tokens each


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="store_true", help="also other tiles: (queries per block, warps)")
    args = p.parse_args()
    if not torch.cuda.is_available() or rotary_attention.triton_ops is None:
        sys.exit("needs a CUDA GPU and Triton")
    ops = rotary_attention.triton_ops
    tiles = [(ops.WINDOW_BLOCK, ops.WINDOW_WARPS)] + ([(64, 8), (128, 8)] if args.sweep else [])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; {HEADS} heads of {HEAD_DIM}, window {WINDOW}")
    for B, T in SHAPES:
        N, H = B * T, HEADS * HEAD_DIM
        qkv = torch.randn(N, 3 * H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cos, sin = (t[:, None] for t in rotary(torch.arange(T, device="cuda").repeat(B), 10_000.0, HEAD_DIM))
        cu = torch.arange(0, N + 1, T, device="cuda", dtype=torch.int32)
        packed = Packed(cu, T)
        do = torch.randn(N, H, device="cuda", dtype=torch.bfloat16)
        q, k, v = (t.detach().contiguous().requires_grad_() for t in qkv.view(N, 3, HEADS, HEAD_DIM).unbind(1))

        def flash():
            return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, T, T, 0.0, False, False,
                                                           scale=HEAD_DIM ** -0.5, window_size_left=WINDOW,
                                                           window_size_right=WINDOW)[0]

        def kernels():
            return rotary_attention.window_rotary_attention(qkv, cos, sin, packed, HEADS, WINDOW)

        with torch.no_grad():
            flash_fwd = time_ms(flash, warmup=3)
        flash_both = time_ms(lambda: flash().backward(do.view(N, HEADS, HEAD_DIM)), warmup=3)
        print(f"batch {B} x {T}: flash (q, k turned before) forward {flash_fwd:.3f} ms, forward + backward "
              f"{flash_both:.3f} ms")
        default = (ops.WINDOW_BLOCK, ops.WINDOW_WARPS)
        for block, warps in tiles:
            ops.WINDOW_BLOCK, ops.WINDOW_WARPS = block, warps
            with torch.no_grad():
                fwd = time_ms(kernels, warmup=3)
            both = time_ms(lambda: kernels().backward(do), warmup=3)
            print(f"  window kernels ({block} queries a block, {warps} warps), rotations included: forward "
                  f"{fwd:.3f} ms, forward + backward {both:.3f} ms ({flash_both / both:.2f}x flash's)")
        ops.WINDOW_BLOCK, ops.WINDOW_WARPS = default


if __name__ == "__main__":
    main()
