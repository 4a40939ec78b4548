"""The rotary attention kernels in Triton's interpreter on a CPU (a helper script for
tests/kernels/test_rotary_attention.py, not a test module):

    TRITON_INTERPRET=1 python tests/kernels/rotary_interpreter_worker.py

Runs `rotary_attention_triton`'s ops in float16 over the edge cases of their contract (empty
sequences, one-token ones, sequences shorter than a query block, the last block running past N,
heads of 32, 64 and 128; for the window kernels sequences longer than 128, windows of 0 to 128)
and checks every address that a load or a store touches where its mask is true against the tensor
argument it points into: an access out of bounds there is an illegal memory
access on a GPU, which names neither the kernel nor the case. The numbers are compared with float64
autograd. Prints one line per case; exits 1 at the first access out of bounds or error above 1e-2,
77 where this Triton's interpreter lacks the hooks the check needs. (The interpreter is chosen when
the kernels are defined, hence a process of its own.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# lengths, heads, head size, window (-1: none); the short kernels', then the window kernels' (any length)
CASES = [([128, 128, 0, 37, 1, 128], 2, 64, 64), ([20, 0, 64, 5], 2, 32, 2), ([100, 3, 128], 1, 128, 16),
         ([3, 1, 0], 2, 32, -1), ([1], 1, 64, -1)]
WINDOW_CASES = [([300, 0, 1, 129, 64], 2, 64, 64), ([200, 70, 5], 2, 32, 16), ([150, 3], 1, 128, 64),
                ([190], 1, 32, 128), ([130], 1, 64, 0)]


class BoundsCheck:
    """Every masked-in address of a load or store lies inside the tensor argument holding its lowest
    address (the kernel's arguments are recorded at each launch)."""

    def __init__(self, interpreter):
        self.tensors: list[tuple[int, int, str]] = []
        self.kernel = ""
        self.faults: list[str] = []
        executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
        init_args, load, store = executor._init_args_hst, builder.create_masked_load, builder.create_masked_store
        check = self

        def _init_args_hst(self, args_dev, kwargs):
            args, kwargs_hst = init_args(self, args_dev, kwargs)
            check.kernel = self.fn.__name__
            check.tensors = [(t.data_ptr(), t.data_ptr() + extent(t), name) for name, t in
                             [*zip(self.arg_names, args), *kwargs_hst.items()] if isinstance(t, torch.Tensor)]
            return args, kwargs_hst

        def create_masked_load(self, ptrs, mask, *rest):
            check.access("load", ptrs, mask)
            return load(self, ptrs, mask, *rest)

        def create_masked_store(self, ptrs, value, mask, *rest):
            check.access("store", ptrs, mask)
            return store(self, ptrs, value, mask, *rest)

        executor._init_args_hst = _init_args_hst
        builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
        self.itemsize = lambda ptrs: np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        self.program = lambda: interpreter.interpreter_builder.grid_idx

    def access(self, kind: str, ptrs, mask) -> None:
        addresses = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape).astype(bool)].astype(np.uint64)
        if not addresses.size:
            return
        lowest, size = int(addresses.min()), self.itemsize(ptrs)
        inside = [(lo, hi, name) for lo, hi, name in self.tensors if lo <= lowest < hi]
        if inside and int(addresses.max()) + size <= inside[0][1]:
            return
        where = f"past the end of {inside[0][2]} by {int(addresses.max()) + size - inside[0][1]} bytes" if inside \
            else "outside every tensor argument"
        self.faults.append(f"{self.kernel}: a {kind} {where} (program {self.program()})")


def extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last."""
    return 0 if not t.numel() else (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def run_case(ops, check: BoundsCheck, lengths: list[int], nh: int, hd: int, window: int,
             kernels: str = "short") -> list[str]:
    """The short kernels' three ops (or the window kernels' two) on one case: the faults found, and
    errors above tolerance, as lines."""
    from bert_kit.modernbert import apply_rotary, rotary
    from tests.kernels.test_rotary_attention import float64_reference, rel

    def error(got: torch.Tensor, want: torch.Tensor) -> float:  # absolute where the reference is 0
        return rel(got, want) if want.norm() > 0 else got.double().norm().item()

    g = torch.Generator().manual_seed(sum(lengths) + hd)
    N, H = sum(lengths), nh * hd
    qkv = torch.randn(N, 3 * H, generator=g).half()
    do = torch.randn(N, H, generator=g).half()
    cos, sin = (t[:, None] for t in rotary(torch.cat([torch.arange(L) for L in lengths]), 10_000.0, hd))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    check.faults.clear()
    if kernels == "window":
        o, lse, q, k = ops.window_fwd(qkv, cos, sin, cu, max(lengths), nh, window)
        dqkv = ops.window_bwd(qkv, q, k, cos, sin, cu, o, do, lse, max(lengths), nh, window)
    else:
        o, lse = ops.attention_fwd(qkv, cos, sin, cu, max(lengths), nh, window)
        dqkv = ops.attention_bwd(qkv, cos, sin, cu, do, lse, max(lengths), nh, window)
    want, want_grad = float64_reference(qkv, cos, sin, lengths, nh, window, do)
    errors = {"out": error(o, want), **{name: error(dqkv[:, i * H:(i + 1) * H], want_grad[:, i * H:(i + 1) * H])
                                        for i, name in enumerate(("dq", "dk", "dv"))}}
    if kernels == "short":
        q, k = ops.rotate_qk(qkv, cos, sin, nh)
        heads = qkv.view(N, 3, nh, hd).double()
        errors["rotate_qk"] = max(error(got, apply_rotary(x, cos.double(), sin.double()))
                                  for got, x in ((q, heads[:, 0]), (k, heads[:, 1])))
    print(f"{kernels} kernels, lengths {lengths}, heads {nh}x{hd}, window {window}: "
          + ", ".join(f"{name} {e:.1e}" for name, e in errors.items())
          + f"; {len(check.faults)} accesses out of bounds", flush=True)
    return check.faults[:5] + [f"{name} error {e:.1e}" for name, e in errors.items() if not e < 1e-2]


def catches_one_past_the_end(check: BoundsCheck) -> bool:
    """The check itself: a load one element past a tensor's end is reported."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy(x_ptr, y_ptr, n):
        i = tl.arange(0, 16)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n, other=0.0))

    x, y = torch.zeros(8), torch.zeros(16)
    copy[(1,)](x, y, 8)
    clean, check.faults[:] = not check.faults, []
    copy[(1,)](x, y, 9)
    caught, check.faults[:] = bool(check.faults), []
    return clean and caught


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("run with TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    import triton.runtime.interpreter as interpreter

    try:
        check = BoundsCheck(interpreter)
    except AttributeError as e:
        print(f"this Triton's interpreter lacks a hook of the bounds check: {e}", file=sys.stderr)
        return 77
    if not catches_one_past_the_end(check):
        print("the bounds check missed a load past a tensor's end", file=sys.stderr)
        return 1
    from bert_kit.kernels import rotary_attention_triton as ops

    for case, kernels in [*((c, "short") for c in CASES), *((c, "window") for c in WINDOW_CASES)]:
        failures = run_case(ops, check, *case, kernels=kernels)
        if failures:
            print("\n".join(failures), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
