"""ModernBERT's fast path: what `fast_path.plan` puts on a ModernBERT for a device, dtype and job
(tested without a GPU), that `install` keeps its parameters and its outputs, FlexAttention with a
document and sliding-window block mask against the reference on the CPU (forward: FlexAttention has
no CPU backward), and on a GPU (skipped on a CPU) the flash varlen kernel with the window and
FlexAttention against the reference, forward and backward, a compiled training step, and memory
that grows linearly with the length.

Run: .venv/bin/python -m pytest tests/kernels/test_window_attention.py -q
GPU: python -m pytest -q tests/kernels/test_window_attention.py (on a CUDA machine)
"""

import copy

import pytest
import torch
from torch.testing import assert_close

from bert_kit.kernels import fast_path
from bert_kit.kernels.fast_path import FastPath, plan
from bert_kit.kernels.packing import Packed
from bert_kit.kernels.residual import LowPrecisionTorchLayerNorm
from bert_kit.kernels.window_attention import (PackedModernBertModel, document_window_mask, flash_window_attention,
                                               flex_window_attention, rotary_table)
from bert_kit.modernbert import (ModernBertForMaskedLM, ModernBertForSequenceClassification, ModernBertModel,
                                 rotary, sdpa_attention)
from bert_kit.modernbert_config import ModernBertConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# 4 layers (global, local, local, global), a window of +-4 far shorter than the inputs
CONFIG = ModernBertConfig.from_name("modernbert-tiny", num_hidden_layers=4, local_attention=8)
BASE = ModernBertConfig.from_name("modernbert-base")


def padded_batch(T: int = 40, B: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and a right-padded mask: rows of T, 2/3 T, 5 and 1 tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CONFIG.vocab_size, (B, T), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([T, 2 * T // 3, 5, 1][:B]):
        mask[row, length:] = 0
    return ids, mask


def packed_qkv(lengths: list[int], heads: int = 2, head_dim: int = 16, seed: int = 0, device: str = "cpu",
               dtype: torch.dtype = torch.float32, requires_grad: bool = False):
    """q, k, v (N, nh, hd) of sequences of `lengths` laid end to end, and their layout (on `device`).
    Drawn on the host (a CPU generator draws no CUDA tensor), so every device gets the same numbers."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q, k, v = (torch.randn(n, heads, head_dim, generator=g).to(device, dtype).requires_grad_(requires_grad)
               for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, Packed(cu, max(lengths)).to(device)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64: the GPU kernels' measure (fp32 far under 1e-3, TF32 about
    3e-4, bf16 1e-3 to 1e-2); NaN or inf anywhere in `got` gives inf, which no limit passes."""
    got, want = got.detach().double(), want.detach().double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).norm() / want.norm()).item()


# ---- the plan ---------------------------------------------------------------------------------------

def test_modernbert_on_cuda_in_16_bit_takes_flash_attention_with_the_window():
    fast = plan("cuda", BASE, training=True, dtype=torch.bfloat16, compile=True, low_precision_residual=True)
    assert fast == FastPath("cuda", window_flash=True, rotary_attention=True, fused_geglu=True,
                            low_precision_residual=True)
    assert str(fast) == ("fast path: 16-bit residual stream, flash varlen attention with sliding window, "
                         "Triton rotary attention (T <= 128, sliding windows) and rotations, Triton GeGLU, "
                         "padded batches packed")
    assert plan("cuda", BASE, training=False, dtype=torch.float16) == FastPath(
        "cuda", window_flash=True, rotary_attention=True, fused_geglu=True)
    # the Triton kernels: only where Triton runs and is allowed, for the head sizes they tile
    assert plan("cuda", BASE, training=False, dtype=torch.float16, triton=False) == FastPath("cuda", window_flash=True)
    assert plan("cuda", BASE, training=True, dtype=torch.bfloat16, short_attention=False) == FastPath(
        "cuda", window_flash=True, fused_geglu=True)
    assert plan("cuda", BASE, training=True, dtype=torch.bfloat16, fused_backward=False) == FastPath(
        "cuda", window_flash=True, rotary_attention=True)
    odd_heads = dataclass_replace(BASE, num_attention_heads=16)  # heads of 48
    assert plan("cuda", odd_heads, training=True, dtype=torch.bfloat16) == FastPath("cuda", window_flash=True,
                                                                                    fused_geglu=True)
    # the GeGLU kernel computes the exact GELU only
    tanh = dataclass_replace(BASE, hidden_activation="gelu_pytorch_tanh")
    assert plan("cuda", tanh, training=True, dtype=torch.bfloat16) == FastPath("cuda", window_flash=True,
                                                                               rotary_attention=True)


def test_modernbert_on_cuda_in_float32_takes_flexattention_and_the_cpu_the_reference():
    assert plan("cuda", BASE, training=False) == FastPath("cuda", flex_attention=True)
    assert plan("cuda", BASE, training=True, dtype=torch.bfloat16, attention="flex") == FastPath(
        "cuda", flex_attention=True, fused_geglu=True)
    assert plan("cuda", BASE, training=True, dtype=torch.bfloat16, attention="sdpa") == FastPath("cuda")
    assert str(plan("cpu", BASE, training=False)) == "fast path: none (CPU: eager SDPA)"
    assert plan("cpu", BASE, training=False, attention="flex") == FastPath("cpu", flex_attention=True)
    assert plan("cpu", BASE, training=False, dtype=torch.bfloat16) == FastPath("cpu")
    # none of BERT's kernels, whatever the job
    assert plan("cuda", BASE, training=True, dtype=torch.bfloat16, compile=True, mlm_head=True) == FastPath(
        "cuda", window_flash=True, rotary_attention=True, fused_geglu=True)
    with pytest.raises(ValueError, match="attention='flash2' is not a valid choice"):
        plan("cuda", BASE, training=False, attention="flash2")


# ---- install: same parameters, the reference's numbers where the kernels do not run ------------------

def test_install_swaps_the_kernels_in_and_keeps_every_parameter():
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(CONFIG)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fast = fast_path.install(model, FastPath("cuda", window_flash=True, low_precision_residual=True))
    assert fast.window_flash and type(model.bert) is PackedModernBertModel
    assert all(layer.attention.attend is flash_window_attention for layer in model.bert.layers)
    assert type(model.bert.final_norm) is type(model.head.norm) is LowPrecisionTorchLayerNorm
    assert model.state_dict().keys() == state.keys()
    for name, tensor in model.state_dict().items():
        assert tensor is not state[name] and torch.equal(tensor, state[name]), name
    # applying again (an evaluation that wraps the training model) changes nothing
    fast_path.install(model, FastPath("cuda", flex_attention=True))
    assert all(layer.attention.attend is flash_window_attention for layer in model.bert.layers)


@pytest.mark.parametrize("kernel", ["flash", "flex"])
@pytest.mark.parametrize("role", ["ForMaskedLM", "ForSequenceClassification"])
def test_installed_kernels_give_the_reference_outputs_on_the_cpu(kernel, role):
    """Flash falls back to the reference on a CPU; FlexAttention runs (inference); both through the
    packed encoder, whose padded calls run packed."""
    cls = {"ForMaskedLM": ModernBertForMaskedLM, "ForSequenceClassification": ModernBertForSequenceClassification}[role]
    torch.manual_seed(0)
    reference = cls(dataclass_replace(CONFIG, classifier_pooling="mean")).eval()
    fast = copy.deepcopy(reference)
    fast_path.install(fast, FastPath("cpu", window_flash=kernel == "flash", flex_attention=kernel == "flex"))
    ids, mask = padded_batch()
    keep = mask.bool()
    with torch.no_grad():
        want, got = reference(ids, mask), fast(ids, mask)
        packed = fast(ids, mask, unpadded=True)
    if role == "ForMaskedLM":
        want, got, packed = want[keep], got[keep], packed[keep]
    assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert_close(packed, want, atol=2e-6, rtol=1e-5)


def dataclass_replace(config: ModernBertConfig, **changes) -> ModernBertConfig:
    return ModernBertConfig.from_dict({**config.to_dict(), **changes})


@pytest.mark.parametrize("window", [None, 4, 300])
def test_flexattention_with_the_block_mask_equals_the_reference(window):
    # sequences longer and shorter than the window and than a 128-token block, and an empty one
    q, k, v, packed = packed_qkv([150, 3, 0, 70, 1])
    want = sdpa_attention(q, k, v, None, packed, window)
    got = flex_window_attention(q, k, v, None, packed, window)
    assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert set(packed.block_masks) == {window}  # kept for the next layer
    assert document_window_mask(packed, window, q.shape[0], q.device) is packed.block_masks[window]


@pytest.mark.slow
def test_compiled_flexattention_equals_the_reference_on_the_cpu():
    """FlexAttention compiled (inductor's CPU kernel; the block mask made inside the graph), as a
    compiled CUDA run takes it: the reference's numbers. Compiling takes about 20 s on 2 cores."""
    q, k, v, packed = packed_qkv([150, 3, 0, 70, 1])
    compiled = torch.compile(flex_window_attention, fullgraph=True)
    for window in (None, 4):
        packed.block_masks.clear()
        assert_close(compiled(q, k, v, None, packed, window), sdpa_attention(q, k, v, None, packed, window),
                     atol=2e-6, rtol=1e-5)


@pytest.mark.slow
def test_the_compiled_flexattention_encoder_is_one_graph_with_the_references_outputs():
    """The encoder with FlexAttention compiled for inference on the CPU: padded rows packed, a block
    mask per window made in the graph, no break, the reference's outputs at real tokens."""
    import torch._dynamo

    torch.manual_seed(0)
    reference = ModernBertModel(CONFIG).eval()
    model = copy.deepcopy(reference)
    fast_path.install(model, FastPath("cpu", flex_attention=True))
    ids, mask = padded_batch(T=150)
    keep = mask.bool()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(ids, mask)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
        assert_close(torch.compile(model)(ids, mask)[keep], reference(ids, mask)[keep], atol=2e-6, rtol=1e-5)


def test_compiled_code_takes_the_rotations_from_one_op_per_theta(monkeypatch):
    """The fast path's encoder computes cos and sin in `rotary_table` (one call per layer type),
    which inductor cannot fuse into the kernels that turn q and k; the reference's graph computes
    them inline. Same outputs. (On the CPU the flash kernel is a stand-in of its signature, so the
    encoder traces as one graph, as on CUDA.)"""
    import torch._dynamo

    from bert_kit.kernels import window_attention

    torch.manual_seed(0)
    reference = ModernBertModel(CONFIG).eval()
    model = copy.deepcopy(reference)
    model.__class__ = PackedModernBertModel
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(model(ids, mask)[mask.bool()], reference(ids, mask)[mask.bool()], atol=2e-6, rtol=1e-5)
    positions = torch.tensor([0, 5, 8191])
    for got, want in zip(rotary_table(positions, 160000.0, 16), rotary(positions, 160000.0, 16)):
        assert_close(got, want, atol=0, rtol=0)

    monkeypatch.setattr(window_attention, "flash_applies", lambda q: True)
    monkeypatch.setattr(window_attention, "varlen_attn", lambda q, k, v, *args, scale, window_size: v * scale)
    fast_path.install(model, FastPath("cuda", window_flash=True))
    fast_path.install(reference, FastPath("cuda", window_flash=True))
    reference.__class__ = ModernBertModel  # the stand-in kernel, the reference's rotations

    def calls(m):
        explained = torch._dynamo.explain(m)(ids, mask)
        assert explained.graph_count == 1, explained.break_reasons
        return [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op in ("call_function",
                                                                                          "call_method")]

    with torch.no_grad():
        packed, inline = calls(model), calls(reference)
    assert packed.count("bert_kit.rotary_table.default") == len(set(CONFIG.layer_types)) == 2
    assert "cos" not in packed and "sin" not in packed and "cos" in inline and "sin" in inline


def test_kernels_fall_back_to_the_reference_where_they_do_not_run():
    q, k, v, packed = packed_qkv([9, 4], requires_grad=True)
    for kernel in (flash_window_attention, flex_window_attention):  # a CPU backward: the reference's
        got = kernel(q, k, v, None, packed, 2)
        got.sum().backward()
        assert got.grad_fn is not None
    padded = torch.randn(2, 2, 6, 16)  # padded calls carry their mask, and run the reference
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril(1)
    assert_close(flex_window_attention(padded, padded, padded, mask, None, 1),
                 sdpa_attention(padded, padded, padded, mask, None, 1), atol=0, rtol=0)


def test_the_packed_encoder_runs_padded_calls_packed():
    torch.manual_seed(0)
    model = ModernBertModel(CONFIG).eval()
    reference = copy.deepcopy(model)
    model.__class__ = PackedModernBertModel
    seen = []
    for layer in model.layers:
        layer.attention.attend = lambda q, k, v, mask, packed, window, p=0.0: (
            seen.append(packed is not None and mask is None) or sdpa_attention(q, k, v, mask, packed, window, p))
    ids, mask = padded_batch()
    with torch.no_grad():
        assert_close(model(ids, mask)[mask.bool()], reference(ids, mask)[mask.bool()], atol=2e-6, rtol=1e-5)
        assert_close(model(ids), reference(ids), atol=2e-6, rtol=1e-5)  # no mask: every position
    assert seen and all(seen)
    with pytest.raises(RuntimeError, match="take right-padded rows"):
        model(ids, mask.flip(1))  # padding first
    with torch.no_grad():  # which unpadding takes
        assert_close(model(ids, mask.flip(1), unpadded=True)[mask.flip(1).bool()],
                     reference(ids, mask.flip(1))[mask.flip(1).bool()], atol=2e-6, rtol=1e-5)


# ---- on a GPU: the kernels' numbers against the reference's ------------------------------------------

def test_packed_qkv_draws_the_same_numbers_on_every_device():
    """The GPU tests below take their inputs from `packed_qkv`: drawn on the host, then moved (a CPU
    generator cannot draw on CUDA: the GPU kernel test failed there before it compared anything)."""
    q, k, v, packed = packed_qkv([3, 2], device="meta", dtype=torch.bfloat16, requires_grad=True)
    assert q.device.type == "meta" and q.dtype == torch.bfloat16 and q.requires_grad and q.is_leaf
    assert packed.cu_seqlens.device.type == "meta" and packed.max_seqlen == 3
    assert torch.equal(packed_qkv([3, 2])[0], packed_qkv([3, 2])[0])
    assert relative_error(torch.tensor([1.0, float("nan")]), torch.ones(2)) == float("inf")
    assert relative_error(torch.tensor([3.0, 4.0]) * 1.001, torch.tensor([3.0, 4.0])) == pytest.approx(1e-3, rel=1e-3)


@cuda
@pytest.mark.parametrize("window", [None, 64])
@pytest.mark.parametrize("kernel", ["flash", "flex"])
def test_gpu_kernels_forward_and_backward_equal_the_reference(kernel, window):
    """Flash (bf16) and FlexAttention (float32) against the float32 reference on the same inputs:
    sequences longer and shorter than the window and than a 128-token block, one of a single token.
    Relative errors of the output and of each gradient, all printed when one is over its limit."""
    dtype = torch.bfloat16 if kernel == "flash" else torch.float32
    q, k, v, packed = packed_qkv([700, 129, 1, 64, 300], heads=4, head_dim=64, device="cuda", dtype=dtype,
                                 requires_grad=True)
    attend = flash_window_attention if kernel == "flash" else flex_window_attention
    got = attend(q, k, v, None, packed, window)
    dout = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)).to("cuda")
    grads = torch.autograd.grad(got, (q, k, v), dout.to(dtype))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))  # the same (rounded) inputs
    want = sdpa_attention(q32, k32, v32, None, packed, window)
    want_grads = torch.autograd.grad(want, (q32, k32, v32), dout)
    errors = {name: relative_error(a, b) for name, a, b in
              zip(("out", "dq", "dk", "dv"), (got, *grads), (want, *want_grads))}
    limit = 1e-2 if dtype == torch.bfloat16 else 1e-3  # FlexAttention's float32 dots may run in TF32
    print(f"\n{kernel} window attention, window {window}: relative errors "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert max(errors.values()) < limit, f"{kernel}, window {window}: relative errors {errors} (limit {limit})"


@cuda
@pytest.mark.parametrize("compile, T, short_attention", [(False, 128, True), (True, 128, True), (False, 128, False),
                                                     (True, 160, True)])
def test_gpu_fast_path_training_step_equals_the_reference(compile, T, short_attention):
    """The whole model with `apply`'s kernels, under bf16 autocast, eager and compiled with static
    shapes: the loss and the gradients within bf16 rounding of the reference's. At 128 tokens the
    Triton rotary attention (or, without it, flash), at 160 flash after the reference's rotation."""
    from bert_kit.heads import masked_index
    from bert_kit.training.losses import compute_mlm_loss

    torch.manual_seed(0)
    config = ModernBertConfig.from_name("modernbert-mini", local_attention=32)  # windows of +-16
    reference = ModernBertForMaskedLM(config).cuda()
    model = copy.deepcopy(reference)
    fast = fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16, compile=compile,
                           short_attention=short_attention)
    assert fast.window_flash and fast.rotary_attention == short_attention
    ids, mask = padded_batch(T=T)
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, -100).masked_fill(mask == 0, -100)
    index = masked_index(labels)  # on the host, as a collator: no data-dependent shape in the graph
    ids, mask, index, targets = ids.cuda(), mask.cuda(), index.cuda(), labels.flatten()[index].cuda()

    def step(m, ids, mask, index, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return compute_mlm_loss(m(ids, mask, masked_index=index), targets)

    def loss_and_grads(m, compiled=False):
        run = torch.compile(step, dynamic=False) if compiled else step
        loss = run(m, ids, mask, index, targets)
        loss.backward()
        return loss.float(), {n: p.grad.float() for n, p in m.named_parameters()}

    got, grads = loss_and_grads(model, compile)
    want, want_grads = loss_and_grads(reference)
    assert_close(got, want, atol=2e-2, rtol=2e-2)
    for name, g in grads.items():
        w = want_grads[name]
        assert (g - w).norm() <= 0.05 * w.norm() + 1e-6, name


@cuda
def test_gpu_memory_grows_linearly_with_the_length():
    """ModernBERT-base's forward at 8,192 tokens: the activations of 2 x 4,096 tokens, not 4x."""
    torch.manual_seed(0)
    model = ModernBertModel(BASE).cuda().to(torch.bfloat16).eval()
    fast_path.apply(model, "cuda", training=False, dtype=torch.bfloat16)

    def peak(T: int, B: int) -> float:
        ids = torch.randint(100, 50000, (B, T), device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            model(ids, torch.ones_like(ids))
        return torch.cuda.max_memory_allocated() - base

    short, long = peak(4096, 2), peak(8192, 1)  # the same number of tokens
    assert long < 1.5 * short, (short, long)


def test_the_compiled_training_step_traces_as_one_graph(monkeypatch):
    """torch.compile sees the whole step (packing by rows, rotations, flash attention with the window,
    the decoder at fixed prediction slots, the loss) without a break. On the CPU the flash kernel
    is a stand-in of its signature (flash runs on CUDA only)."""
    import torch._dynamo

    from bert_kit.heads import with_prediction_slots
    from bert_kit.kernels import window_attention
    from bert_kit.training.losses import compute_mlm_loss

    calls = []

    def varlen_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size):
        calls.append(window_size)
        return v * scale

    monkeypatch.setattr(window_attention, "flash_applies", lambda q: True)
    monkeypatch.setattr(window_attention, "varlen_attn", varlen_stand_in)
    model = ModernBertForMaskedLM(CONFIG)
    fast_path.install(model, FastPath("cuda", window_flash=True, low_precision_residual=True))
    ids, mask = padded_batch()
    labels = torch.where(torch.rand(ids.shape) < 0.3, ids, -100).masked_fill(mask == 0, -100)
    slots = with_prediction_slots({"labels": labels}, share=0.5, multiple=8)

    def loss_fn(ids, mask, index, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return compute_mlm_loss(model(ids, mask, masked_index=index), targets)

    explained = torch._dynamo.explain(loss_fn)(ids, mask, slots["masked_index"], slots["masked_labels"])
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert calls == [(-1, -1), (4, 4), (4, 4), (-1, -1)]  # global, local, local, global
