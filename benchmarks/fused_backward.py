"""Diagnostic: bert_kit.kernels.fused_backward's kernels against inductor's, on one GPU.

BERT-base at batch 256 x 128 (32768 tokens, bf16), each timed alone (median, triton's do_bench):
0. GELU's forward: the Triton kernel against inductor's, with the share of outputs rounded as the
   exact GELU (float64) rounds;
1. the FFN's GELU gradient with its bias gradient, and the QKV gradient laid out with its bias
   gradient: the Triton kernel against what inductor compiles from the same PyTorch expression;
   a copy of the same bytes gives the memory-bandwidth floor;
2. with --sweep, the kernels' launch settings (rows per program, rows per step, columns, warps;
   for GELU's forward, elements per program and warps);
3. one FFN and one attention block, forward + backward, compiled, plain against fused.

    python benchmarks/fused_backward.py [--tokens 32768] [--sweep]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.config import BertConfig  # noqa: E402
from bert_kit.kernels import fused_backward  # noqa: E402
from bert_kit.model import FeedForward, MultiHeadAttention  # noqa: E402


def bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def gelu_forward(ops, M: int, I: int) -> None:
    z = (3 * torch.randn(M, I, device="cuda")).bfloat16()
    inductor = torch.compile(torch.nn.functional.gelu)
    copy, ours, theirs = bench(lambda: z.clone()), bench(lambda: ops.gelu(z)), bench(lambda: inductor(z))
    zd = z.double()
    exact = (zd * 0.5 * torch.special.erfc(-zd / 2**0.5)).bfloat16()
    del zd

    def share(h: torch.Tensor) -> float:
        return 100 * (h == exact).double().mean().item()

    print(f"GELU forward ({M} x {I}): Triton {ours:.3f} ms, inductor {theirs:.3f} ms, copy floor {copy:.3f} ms; "
          f"rounded as the exact GELU: Triton {share(ops.gelu(z)):.3f}%, inductor {share(inductor(z)):.3f}%")


def kernels(ops, M: int, H: int, I: int, nh: int) -> None:
    dh, z = (torch.randn(M, I, device="cuda").bfloat16() for _ in range(2))
    inductor = torch.compile(lambda dh, z: (lambda dz: (dz, dz.float().sum(0)))(torch.ops.aten.gelu_backward(dh, z)))
    copy = bench(lambda: torch.stack((dh, z)))  # 2 tensors read and written: 4/3 of the kernel's bytes
    ours, theirs = bench(lambda: ops.gelu_grad(dh, z)), bench(lambda: inductor(dh, z))
    gb = 3 * dh.numel() * 2 / 1e9
    print(f"GELU gradient + bias gradient ({M} x {I}): Triton {ours:.3f} ms ({gb / ours:.2f} TB/s), "
          f"inductor {theirs:.3f} ms; copy floor {copy * 3 / 4:.3f} ms")
    qkv = torch.randn(M // 128, 128, 3, nh, H // nh, device="cuda").bfloat16()
    for layout in ("strided", "contiguous"):
        dq, dk, dv = qkv.permute(2, 0, 3, 1, 4)
        if layout == "contiguous":
            dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()

        def assemble(dq, dk, dv):
            out = torch.cat([t.transpose(1, 2).reshape(M, H) for t in (dq, dk, dv)], 1)
            return out, out.float().sum(0)

        inductor = torch.compile(assemble)
        ours, theirs = bench(lambda: ops.qkv_grad(dq, dk, dv)), bench(lambda: inductor(dq, dk, dv))
        gb = 2 * qkv.numel() * 2 / 1e9
        print(f"QKV gradient + bias gradient ({layout} dq, dk, dv): Triton {ours:.3f} ms ({gb / ours:.2f} TB/s), "
              f"inductor {theirs:.3f} ms")


SETTINGS = [(512, 16, 128, 4), (512, 32, 128, 4), (512, 16, 256, 4), (256, 16, 128, 4), (256, 32, 128, 4),
            (1024, 16, 128, 4), (512, 32, 128, 8), (256, 32, 256, 8)]  # ROWS, BLOCK_M, BLOCK_N, num_warps


def sweep(ops, M: int, H: int, I: int, nh: int) -> None:
    dh, z = (torch.randn(M, I, device="cuda").bfloat16() for _ in range(2))
    dq, dk, dv = torch.randn(M // 128, 128, 3, nh, H // nh, device="cuda").bfloat16().permute(2, 0, 3, 1, 4)
    defaults = dict(ops.GELU_SETTINGS), dict(ops.QKV_SETTINGS)
    for setting in SETTINGS:
        ops.GELU_SETTINGS = ops.QKV_SETTINGS = dict(zip(("ROWS", "BLOCK_M", "BLOCK_N", "num_warps"), setting))
        gelu, qkv = bench(lambda: ops.gelu_grad(dh, z)), bench(lambda: ops.qkv_grad(dq, dk, dv))
        print(f"  rows {setting[0]:4d} block {setting[1]:2d} x {setting[2]:3d} warps {setting[3]}: "
              f"GELU gradient {gelu:.3f} ms ({3 * dh.numel() * 2 / gelu / 1e9:.2f} TB/s), "
              f"QKV gradient {qkv:.3f} ms ({6 * dq.numel() * 2 / qkv / 1e9:.2f} TB/s)")
    ops.GELU_SETTINGS, ops.QKV_SETTINGS = defaults
    forward = dict(ops.GELU_FORWARD_SETTINGS)
    for block, warps in ((1024, 2), (1024, 4), (2048, 2), (2048, 4), (4096, 4), (4096, 8)):
        ops.GELU_FORWARD_SETTINGS = {"BLOCK": block, "num_warps": warps}
        print(f"  GELU forward, block {block:4d} warps {warps}: {bench(lambda: ops.gelu(z)):.3f} ms")
    ops.GELU_FORWARD_SETTINGS = forward


def compiled_block_ms(module: torch.nn.Module, plain: type, fast: type, x: torch.Tensor,
                      dy: torch.Tensor) -> dict[bool, float]:
    """Forward + backward of `module` compiled under bf16 autocast, in ms: as `plain` (False) and
    with its class swapped to `fast` (True), as `fast_path.apply` swaps it."""
    times = {}
    for fused in (False, True):
        module.__class__ = fast if fused else plain
        torch._dynamo.reset()
        compiled = torch.compile(module, fullgraph=True)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = compiled(x)
            y.backward(dy)

        times[fused] = bench(step)
    return times


def blocks(M: int, H: int, I: int, nh: int) -> None:
    cfg = BertConfig(hidden_size=H, intermediate_size=I, num_attention_heads=nh)
    for name, module, fast in (("FFN", FeedForward(cfg), fused_backward.FusedFeedForward),
                               ("attention", MultiHeadAttention(cfg), fused_backward.FusedQKVAttention)):
        x = torch.randn(M // 128, 128, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # 16-bit stream
        dy = torch.randn(M // 128, 128, H, device="cuda", dtype=torch.bfloat16)
        times = compiled_block_ms(module.cuda().train(), type(module), fast, x, dy)
        print(f"one {name} block, forward + backward, compiled: plain {times[False]:.3f} ms, "
              f"fused {times[True]:.3f} ms ({times[False] - times[True]:+.3f} ms a layer)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--sweep", action="store_true", help="time the kernels' launch settings too")
    args = p.parse_args()
    ops = fused_backward.triton_ops
    assert torch.cuda.is_available() and ops is not None, "this benchmark needs a CUDA GPU and Triton"
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    gelu_forward(ops, args.tokens, 3072)
    kernels(ops, args.tokens, 768, 3072, 12)
    if args.sweep:
        sweep(ops, args.tokens, 768, 3072, 12)
    blocks(args.tokens, 768, 3072, 12)


if __name__ == "__main__":
    main()
