"""`bert_kit.kernels.geglu`: ModernBERT's gated activation in Triton, against the reference `GeGLU`.

On a CPU: what is installed where (a machine without Triton keeps the reference), and the swapped
module's numbers where its kernels do not run. On a GPU: the kernels against float64 autograd,
eager and compiled, at widths and token counts that are not multiples of their tiles.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from bert_kit.kernels import fast_path, geglu
from bert_kit.kernels.fast_path import FastPath
from bert_kit.modernbert import GeGLU, ModernBertForMaskedLM
from bert_kit.modernbert_config import ModernBertConfig

cuda = pytest.mark.skipif(not torch.cuda.is_available() or geglu.triton_ops is None,
                          reason="needs a CUDA GPU and Triton")
CONFIG = ModernBertConfig.from_name("modernbert-mini")


def test_install_swaps_every_geglu_where_triton_imports_and_keeps_the_parameters():
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(CONFIG)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fast = fast_path.install(model, FastPath("cuda", fused_geglu=True))
    ffns = [layer.ffn for layer in model.bert.layers]
    if geglu.triton_ops is None:  # this machine: the plan is withdrawn, the reference stays
        assert not fast.fused_geglu and all(type(ffn) is GeGLU for ffn in ffns)
    else:
        assert fast.fused_geglu and all(type(ffn) is geglu.FusedGeGLU for ffn in ffns)
    assert model.state_dict().keys() == state.keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_the_swapped_module_computes_the_references_function_where_its_kernels_do_not_run():
    """On a CPU (and in float32, or with dropout, anywhere) `FusedGeGLU` is the reference."""
    torch.manual_seed(0)
    reference = GeGLU(CONFIG)
    fused = copy.deepcopy(reference)
    fused.__class__ = geglu.FusedGeGLU
    x = torch.randn(3, 5, CONFIG.hidden_size, requires_grad=True)
    assert not geglu.applies(x, fused)
    want, got = reference(x), fused(x)
    assert torch.equal(got, want)
    got.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    want.sum().backward()
    assert torch.equal(x.grad, grad)


def float64_geglu(z: torch.Tensor) -> torch.Tensor:
    a, gate = z.double().chunk(2, dim=-1)
    return nn.functional.gelu(a) * gate


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm()).item() if torch.isfinite(got).all() else float("inf")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M, I", [(1, 64), (37, 1152), (300, 200)])
def test_gpu_kernels_match_float64_autograd(dtype, M, I):
    """Forward and backward of the op against float64 autograd on the same 16-bit inputs: errors
    of one rounding (bf16 about 4e-3 relative, fp16 5e-4)."""
    torch.manual_seed(0)
    z = (torch.randn(M, 2 * I, device="cuda") * 3).to(dtype).requires_grad_()
    dh = torch.randn(M, I, device="cuda").to(dtype)
    h = geglu.triton_ops.geglu(z)
    assert h.shape == (M, I) and h.dtype == dtype
    h.backward(dh)
    z64 = z.detach().double().requires_grad_()
    want = float64_geglu(z64)
    want.backward(dh.double())
    limit = 8e-3 if dtype == torch.bfloat16 else 1e-3
    assert relative_error(h, want) < limit
    assert relative_error(z.grad, z64.grad) < limit


@cuda
def test_gpu_compiled_module_equals_the_reference_under_autocast():
    """The swapped feed-forward compiled under bf16 autocast: the reference's output and gradients
    within bf16 rounding; the custom op is in the graph (not the reference's erf)."""
    torch.manual_seed(0)
    reference = GeGLU(CONFIG).cuda()
    fused = copy.deepcopy(reference)
    fused.__class__ = geglu.FusedGeGLU
    x = torch.randn(4, 50, CONFIG.hidden_size, device="cuda", requires_grad=True)

    def run(module):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = torch.compile(module, dynamic=False)(x)
        y.float().square().sum().backward()
        grads = [x.grad.clone(), *(p.grad.clone() for p in module.parameters())]
        x.grad = None
        return y, grads

    want, want_grads = run(reference)
    got, got_grads = run(fused)
    assert relative_error(got, want) < 1e-2
    for g, w in zip(got_grads, want_grads):
        assert relative_error(g, w) < 2e-2
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert geglu.applies(x, fused)
        explained = torch._dynamo.explain(fused)(x)
    assert explained.graph_count == 1 and explained.break_reasons == []
    code = explained.graphs[0].code
    assert "bert_kit.geglu" in code and "gelu" not in code.replace("bert_kit.geglu", "")
