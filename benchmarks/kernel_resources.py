"""Diagnostic without a GPU: registers and spills of the short-attention kernels, compiled for an H100/H200.

Triton compiles the kernels for sm_90a here and ptxas reports each one's resources (`ptxas -v`):
the first question for a kernel far from its floors.
Needs only `pip install triton` (no torch, no GPU): the kernel module's source is read up to its
torch part.

    python benchmarks/kernel_resources.py [bert_kit/kernels/short_attention_triton.py]
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

def load(path):
    """The kernels of `path` without its torch part (everything from `def _meta(` on)."""
    text = open(path).read()
    text = text[:text.index("def _meta(")].replace("import torch\n", "")
    text = text.replace("from bert_kit.kernels.dropout_triton import fill_mask\n", "")
    folder = tempfile.mkdtemp()
    kernels = os.path.join(folder, "kernels.py")
    open(kernels, "w").write(text)
    spec = importlib.util.spec_from_file_location("kernels", kernels)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
target = GPUTarget("cuda", 90, 64)

def report(fn, sig, consts, warps):
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    k = triton.compile(src, target=target, options={"num_warps": warps})
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    info = " ".join(l.strip() for l in out.stderr.splitlines() if "registers" in l or "spill" in l)
    regs = re.search(r"Used (\d+) registers", info); spill = re.search(r"(\d+) bytes spill stores", info)
    return (int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1)

def meta(T=128, nh=12, hd=64, mask=False, p=0.1, bq=64):
    H = nh * hd
    block = max(16, triton.next_power_of_2(T))
    return dict(scale=hd ** -0.5, keep_scale=1 / (1 - p), T=T, nh=nh, H=H, HAS_MASK=mask, DROPOUT=p > 0,
                BLOCK_T=block, BLOCK_Q=min(bq, block), HEAD_DIM=hd)

def run(mod, which, m, warps):
    fn = getattr(mod, which)
    args = fn.arg_names
    consts = {a: m[a] for a in args if a in m}
    ptr_types = {"mask_ptr": "*i1" if m["HAS_MASK"] else "*bf16", "keep_ptr": "*i1" if m["DROPOUT"] else "*bf16",
                 "lse_ptr": "*fp32", "partial_ptr": "*fp32"}
    sig = {a: (ptr_types.get(a, "*bf16") if a.endswith("_ptr") else "constexpr") for a in args}
    return report(fn, sig, consts, warps)

if __name__ == "__main__":
    mod = load(sys.argv[1] if len(sys.argv) > 1 else "bert_kit/kernels/short_attention_triton.py")
    for mask in (False, True):
        for hd, nh in ((64, 12), (128, 8)):
            for which in ("_attention_fwd", "_attention_bwd"):
                m = meta(nh=nh, hd=hd, mask=mask)
                names = getattr(mod, which).arg_names
                if "BLOCK_Q" not in names:
                    m.pop("BLOCK_Q")
                warps = 4 if "BLOCK_Q" in names else 8
                if which == "_attention_bwd" and hd > 64 and "BLOCK_Q" in names:
                    m["BLOCK_Q"], warps = m["BLOCK_T"], 8
                try:
                    print(f"{which:16s} hd{hd} mask{int(mask)} warps{warps}: regs, spill bytes = {run(mod, which, m, warps)}", flush=True)
                except Exception as e:
                    print(f"{which} hd{hd} mask{int(mask)}: {repr(e)[-400:]}")
