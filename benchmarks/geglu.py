"""Diagnostic: bert_kit.kernels.geglu's Triton kernels against inductor's, on one GPU.

ModernBERT-base's feed-forward (hidden 768, intermediate 1152) at 32,768 tokens (seq 512 x 64),
bf16, each timed alone (median, triton's do_bench):
1. the activation's forward and backward: the Triton op against what inductor compiles from the
   reference's expression (`GeGLU`: chunk, GELU, product), with the bandwidth each reaches;
2. with --sweep, the kernels' launch settings (rows, columns, warps);
3. one GeGLU block, forward + backward, compiled under autocast: reference against `FusedGeGLU`.

    python benchmarks/geglu.py [--tokens 32768] [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from fused_backward import bench, compiled_block_ms  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.kernels import geglu  # noqa: E402
from bert_kit.modernbert import GeGLU  # noqa: E402
from bert_kit.modernbert_config import ModernBertConfig  # noqa: E402


def reference(z: torch.Tensor) -> torch.Tensor:
    a, gate = z.chunk(2, dim=-1)
    return F.gelu(a) * gate


def activation(ops, M: int, I: int) -> None:
    z = (3 * torch.randn(M, 2 * I, device="cuda")).bfloat16().requires_grad_()
    dh = torch.randn(M, I, device="cuda").bfloat16()
    inductor = torch.compile(reference)
    backward_ref = torch.compile(lambda z, dh: torch.autograd.grad(reference(z), z, dh)[0])
    fwd = {"Triton": bench(lambda: ops.geglu(z.detach())), "inductor": bench(lambda: inductor(z.detach()))}
    bwd = {"Triton": bench(lambda: ops.geglu_grad(dh, z.detach())), "inductor": bench(lambda: backward_ref(z, dh))}
    fwd_gb, bwd_gb = 3 * M * I * 2 / 1e9, 5 * M * I * 2 / 1e9  # bytes read and written, bf16
    for name, times, gb in (("forward", fwd, fwd_gb), ("backward", bwd, bwd_gb)):
        print(f"GeGLU {name} ({M} x 2 x {I}): " + ", ".join(
            f"{k} {t:.3f} ms ({gb / t:.2f} TB/s)" for k, t in times.items()))


def sweep(ops, M: int, I: int) -> None:
    z = (3 * torch.randn(M, 2 * I, device="cuda")).bfloat16()
    dh = torch.randn(M, I, device="cuda").bfloat16()
    defaults = dict(ops.FORWARD_SETTINGS), dict(ops.BACKWARD_SETTINGS)
    for block_m, block_n, warps in itertools.product((8, 16, 32), (64, 128, 256), (4, 8)):
        ops.FORWARD_SETTINGS = ops.BACKWARD_SETTINGS = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps}
        fwd, bwd = bench(lambda: ops.geglu(z)), bench(lambda: ops.geglu_grad(dh, z))
        print(f"  block {block_m:2d} x {block_n:3d} warps {warps}: forward {fwd:.3f} ms, backward {bwd:.3f} ms")
    ops.FORWARD_SETTINGS, ops.BACKWARD_SETTINGS = defaults


def block(M: int) -> None:
    module = GeGLU(ModernBertConfig.from_name("modernbert-base")).cuda().train()
    x = torch.randn(M, module.up.in_features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, module.up.in_features, device="cuda", dtype=torch.bfloat16)
    times = compiled_block_ms(module, GeGLU, geglu.FusedGeGLU, x, dy)
    print(f"one GeGLU block, forward + backward, compiled: reference {times[False]:.3f} ms, "
          f"Triton {times[True]:.3f} ms ({times[False] - times[True]:+.3f} ms a layer)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--sweep", action="store_true", help="time the kernels' launch settings too")
    args = p.parse_args()
    ops = geglu.triton_ops
    assert torch.cuda.is_available() and ops is not None, "this benchmark needs a CUDA GPU and Triton"
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    I = ModernBertConfig.from_name("modernbert-base").intermediate_size
    activation(ops, args.tokens, I)
    if args.sweep:
        sweep(ops, args.tokens, I)
    block(args.tokens)


if __name__ == "__main__":
    main()
