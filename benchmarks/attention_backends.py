"""Attention kernels for BERT shapes: each SDPA backend, forward + backward, with and without dropout.

SDPA picks a backend by priority, not by speed; this measures them side by side on the shapes
of `pretrain_throughput.py` (bf16, 12 heads of 64, no padding mask), CUDA-event timed.

    python benchmarks/attention_backends.py
    python benchmarks/attention_backends.py --shapes 128x256 --dropout 0.1
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def time_ms(fn, warmup: int = 5, steps: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="128x256,512x32", help="SEQxBATCH list")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dropout", default="0.1,0.0")
    args = p.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for shape in args.shapes.split(","):
        T, B = map(int, shape.split("x"))
        q, k, v = (torch.randn(B, args.heads, T, args.head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        flops = 4 * B * args.heads * T * T * args.head_dim * 3  # two matmuls, forward + 2x backward
        for p_drop in map(float, args.dropout.split(",")):
            print(f"\n== seq {T} batch {B}, dropout {p_drop}: forward + backward of one layer's attention")
            for name, backend in BACKENDS.items():
                def step():
                    with sdpa_kernel(backend):
                        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop)
                    y.backward(grad)
                try:
                    ms = time_ms(step)
                except RuntimeError as e:
                    print(f"  {name:10s} not available: {str(e).splitlines()[0][:120]}")
                    continue
                print(f"  {name:10s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  x12 layers = {12 * ms:5.1f} ms")


if __name__ == "__main__":
    main()
