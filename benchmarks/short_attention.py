"""Diagnostic: bert_kit.kernels.short_attention's kernels against SDPA (cuDNN) and the QKV gradient's assembly.

One BERT-base attention layer at batch 256 x 128 (12 heads of 64, bf16, attention dropout 0.1),
forward + backward, each timed alone (median, triton's do_bench):
- SDPA forward + backward (cuDNN's kernels, their dot(dO, O) pre-pass and dq conversion), then
  `fused_backward.qkv_grad` laying dq, dk, dv out as the QKV projection's gradient with its bias
  gradient: what compiled training runs without the short attention;
- the short attention's forward (its dropout mask included) and backward, which writes that
  gradient and its bias sums itself.
The matmuls of the QKV projection are the same on both sides and left out. Needs CUDA and Triton.

    python benchmarks/short_attention.py [--batch 256] [--seq 128] [--dropout 0.1] [--masked]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.kernels import fused_backward, short_attention  # noqa: E402


def bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=30, rep=200, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--masked", action="store_true", help="a key mask (lengths T/3-T), as padded training batches have")
    args = p.parse_args()
    fused, short = fused_backward.triton_ops, short_attention.triton_ops
    if not torch.cuda.is_available() or fused is None or short is None:
        sys.exit("needs a CUDA GPU and Triton")
    B, T, nh, hd, drop = args.batch, args.seq, args.heads, args.head_dim, args.dropout
    H = nh * hd
    qkv = torch.randn(B * T, 3 * H, device="cuda").bfloat16()
    do = torch.randn(B * T, H, device="cuda").bfloat16()
    seed = torch.tensor([12345], device="cuda")
    q, k, v = (t.detach().requires_grad_() for t in qkv.view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4))
    dy = do.view(B, T, nh, hd).transpose(1, 2)
    mask = None
    if args.masked:
        lengths = torch.randint(T // 3, T + 1, (B,), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        mask = torch.arange(T, device="cuda")[None] < lengths[:, None]
    sdpa_mask = None if mask is None else mask[:, None, None, :]

    def sdpa():
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, dropout_p=drop)
        return torch.autograd.grad(o, (q, k, v), dy)

    dq, dk, dv = sdpa()
    sdpa_ms, assembly_ms = bench(sdpa), bench(lambda: fused.qkv_grad(dq, dk, dv))
    o, lse, keep = short.attention_fwd(qkv, mask, seed, B, T, nh, drop)
    fwd_ms = bench(lambda: short.attention_fwd(qkv, mask, seed, B, T, nh, drop))
    bwd_ms = bench(lambda: short.attention_bwd(qkv, mask, keep, do, lse, B, T, nh, drop))
    print(torch.cuda.get_device_name())
    print(f"B {B} T {T} heads {nh} x {hd} dropout {drop}{', key mask' if mask is not None else ''}, one layer (ms):")
    print(f"  SDPA forward + backward {sdpa_ms:.3f} + QKV gradient assembly {assembly_ms:.3f} = "
          f"{sdpa_ms + assembly_ms:.3f}")
    print(f"  short attention forward {fwd_ms:.3f} + backward {bwd_ms:.3f} = {fwd_ms + bwd_ms:.3f} "
          f"({(sdpa_ms + assembly_ms) / (fwd_ms + bwd_ms):.2f}x)")


if __name__ == "__main__":
    main()
