"""bert_kit.kernels.rotary_attention: ModernBERT's attention with its rotations in Triton kernels.

On a CPU (no Triton, no CUDA) the kernels' contracts are computed by the reference's own functions
(`ReferenceOps`) in their place, which tests what calls them: the layout, the window and the
rotations they are given, the gradient that comes back through the autograd Function, the
fallbacks, and one graph when the training step is compiled. Where Triton is installed, the
kernels in Triton's interpreter on the CPU (float16; relative errors about 4e-4 against float64)
with every masked-in address checked against its tensor. On a GPU (skipped elsewhere): the
Triton kernels against float64 autograd, and eager inference of the whole encoder against the
reference.

Run: .venv/bin/python -m pytest tests/kernels/test_rotary_attention.py -q
"""

import copy
import math
import os
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

from bert_kit.heads import with_prediction_slots
from bert_kit.kernels import fast_path, rotary_attention
from bert_kit.kernels.fast_path import FastPath
from bert_kit.kernels.packing import Packed
from bert_kit.kernels.rotary_attention import RotaryAttention
from bert_kit.modernbert import ModernBertForMaskedLM, ModernBertModel, apply_rotary, rotary, sdpa_attention
from bert_kit.modernbert_config import ModernBertConfig
from bert_kit.training.losses import compute_mlm_loss
from tests.kernels import rotary_interpreter_worker

pytestmark = pytest.mark.usefixtures("one_torch_thread")
cuda = pytest.mark.skipif(not torch.cuda.is_available() or rotary_attention.triton_ops is None,
                          reason="needs CUDA and Triton")
# 4 layers (global, local, local, global), heads of 16, a window of +-4 far shorter than the inputs
CONFIG = ModernBertConfig.from_name("modernbert-tiny", num_hidden_layers=4, local_attention=8)


class ReferenceOps:
    """`rotary_attention_triton`'s three ops, as their docstrings define them, by the reference's
    functions; records the window of each attention call."""

    def __init__(self):
        self.windows, self.rotations = [], 0

    def attention_fwd(self, qkv, cos, sin, cu_seqlens, max_seqlen, nh, window):
        self.windows.append(window)
        N, hd = qkv.shape[0], qkv.shape[1] // 3 // nh
        q, k, v = qkv.view(N, 3, nh, hd).unbind(1)
        y = sdpa_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, None,
                           Packed(cu_seqlens, max_seqlen), None if window < 0 else window)
        return y.reshape(N, nh * hd), qkv.new_zeros(N, nh, dtype=torch.float32)

    def attention_bwd(self, qkv, cos, sin, cu_seqlens, do, lse, max_seqlen, nh, window):
        x = qkv.detach().requires_grad_()
        with torch.enable_grad():
            o, _ = self.attention_fwd(x, cos, sin, cu_seqlens, max_seqlen, nh, window)
        self.windows.pop()
        return torch.autograd.grad(o, x, do)[0]

    def window_fwd(self, qkv, cos, sin, cu_seqlens, max_seqlen, nh, window):  # the same contract, any length
        o, lse = self.attention_fwd(qkv, cos, sin, cu_seqlens, max_seqlen, nh, window)
        self.rotations -= 1  # (turned q and k kept for the backward, not a separate rotation)
        return (o, lse, *self.rotate_qk(qkv, cos, sin, nh))

    def window_bwd(self, qkv, q, k, cos, sin, cu_seqlens, o, do, lse, max_seqlen, nh, window):
        return self.attention_bwd(qkv, cos, sin, cu_seqlens, do, lse, max_seqlen, nh, window)

    def rotate_qk(self, qkv, cos, sin, nh):
        self.rotations += 1
        q, k, _ = qkv.view(qkv.shape[0], 3, nh, -1).unbind(1)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


@torch.library.custom_op("bert_kit_test::rotary_attention_fwd", mutates_args=())
def opaque_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
               nh: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`ReferenceOps.attention_fwd` as an op the compiler does not trace into, as a Triton op is not."""
    return ReferenceOps().attention_fwd(qkv, cos, sin, cu_seqlens, max_seqlen, nh, window)


@opaque_fwd.register_fake
def _(qkv, cos, sin, cu_seqlens, max_seqlen, nh, window):
    return qkv.new_empty(qkv.shape[0], qkv.shape[1] // 3), qkv.new_empty(qkv.shape[0], nh, dtype=torch.float32)


@torch.library.custom_op("bert_kit_test::rotary_attention_bwd", mutates_args=())
def opaque_bwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor, do: torch.Tensor,
               lse: torch.Tensor, max_seqlen: int, nh: int, window: int) -> torch.Tensor:
    ops = ReferenceOps()  # (autograd does not run inside an op's body: functorch's vjp does)
    _, vjp = torch.func.vjp(lambda x: ops.attention_fwd(x, cos, sin, cu_seqlens, max_seqlen, nh, window)[0], qkv)
    return vjp(do)[0]


@opaque_bwd.register_fake
def _(qkv, cos, sin, cu_seqlens, do, lse, max_seqlen, nh, window):
    return torch.empty_like(qkv)


class OpaqueOps(ReferenceOps):
    """`ReferenceOps` through opaque ops: what the compiler sees of the Triton ops."""

    def attention_fwd(self, qkv, cos, sin, cu_seqlens, max_seqlen, nh, window):
        self.windows.append(window)
        return opaque_fwd(qkv, cos, sin, cu_seqlens, max_seqlen, nh, window)

    def attention_bwd(self, qkv, cos, sin, cu_seqlens, do, lse, max_seqlen, nh, window):
        return opaque_bwd(qkv, cos, sin, cu_seqlens, do, lse, max_seqlen, nh, window)


@pytest.fixture()
def reference_ops(monkeypatch):
    """The reference's functions in the kernels' place, taken on a CPU as if it were CUDA in 16 bits."""
    ops = ReferenceOps()
    monkeypatch.setattr(rotary_attention, "triton_ops", ops)
    monkeypatch.setattr(rotary_attention, "applies", lambda x, packed, qkv, head_dim: packed is not None)
    monkeypatch.setattr(rotary_attention, "HALF", (torch.float32,))
    return ops


def padded_batch(T: int, B: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) ids, a right-padded mask (rows of T, 2/3 T, 5 and 1 tokens) and MLM labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CONFIG.vocab_size, (B, T), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([T, 2 * T // 3, 5, 1][:B]):
        mask[row, length:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, -100).masked_fill(mask == 0, -100)
    return ids, mask, labels


def install_rotary(model: torch.nn.Module) -> None:
    fast = fast_path.install(model, FastPath("cuda", window_flash=True, rotary_attention=True))
    assert fast.rotary_attention
    assert all(type(layer.attention) is RotaryAttention for layer in model.bert.layers)


def loss_and_grads(model, ids, mask, labels) -> tuple[torch.Tensor, dict]:
    loss = compute_mlm_loss(model(ids, mask, labels=labels), labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_install_needs_triton_and_keeps_every_parameter(monkeypatch):
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(CONFIG)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(rotary_attention, "triton_ops", None)  # no Triton: the plan's part is dropped
    fast = fast_path.install(copy.deepcopy(model), FastPath("cuda", window_flash=True, rotary_attention=True))
    assert fast == FastPath("cuda", window_flash=True)
    monkeypatch.setattr(rotary_attention, "triton_ops", ReferenceOps())
    install_rotary(model)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(t, state[name]) for name, t in model.state_dict().items())


@pytest.mark.parametrize("T, windows", [(40, [-1, 4, 4, -1]), (150, [4, 4])])
def test_training_through_the_kernels_contracts_gives_the_references_gradients(reference_ops, T, windows):
    """At T <= 128 every layer's attention goes through the short kernels' contract (window -1 in
    global layers, 4 in local ones); at 150 the local layers' through the window kernels' and the
    global ones through the reference's rotation and attention; either way the loss and every
    gradient are the reference's."""
    torch.manual_seed(0)
    reference = ModernBertForMaskedLM(CONFIG)
    model = copy.deepcopy(reference)
    install_rotary(model)
    ids, mask, labels = padded_batch(T)
    got, grads = loss_and_grads(model, ids, mask, labels)
    want, want_grads = loss_and_grads(reference, ids, mask, labels)
    assert reference_ops.windows == windows
    assert_close(got, want, atol=1e-6, rtol=1e-6)
    for name, g in grads.items():
        assert_close(g, want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_eager_inference_turns_q_and_k_in_one_kernel(reference_ops):
    """Longer than 128 tokens and nothing needing gradients: `rotate_qk` in each global layer, then
    flash attention, and the window kernel in each local one; padded, packed by rows, and unpadded
    calls alike."""
    torch.manual_seed(0)
    reference = ModernBertModel(CONFIG).eval()
    model = copy.deepcopy(reference)
    fast_path.install(model, FastPath("cuda", window_flash=True, rotary_attention=True))
    ids, mask, _ = padded_batch(150)
    keep = mask.bool()
    with torch.inference_mode():
        want = reference(ids, mask)[keep]
        assert_close(model(ids, mask)[keep], want, atol=2e-6, rtol=1e-5)
        assert_close(model(ids, mask, unpadded=True)[keep], want, atol=2e-6, rtol=1e-5)
    assert reference_ops.rotations == 2 * 2 and reference_ops.windows == [4, 4] * 2  # (2 calls, 2 layers of each)
    with torch.inference_mode():  # 128 tokens or fewer: the short kernel, no separate rotation
        ids, mask, _ = padded_batch(60)
        assert_close(model(ids, mask)[mask.bool()], reference(ids, mask)[mask.bool()], atol=2e-6, rtol=1e-5)
    assert reference_ops.rotations == 2 * 2 and reference_ops.windows == [4, 4] * 2 + [-1, 4, 4, -1]


def test_dropout_on_the_probabilities_and_padded_calls_take_the_reference(reference_ops):
    torch.manual_seed(0)
    config = ModernBertConfig.from_dict({**CONFIG.to_dict(), "attention_dropout": 0.1})
    model = ModernBertForMaskedLM(config)
    install_rotary(model)
    ids, mask, labels = padded_batch(40)
    loss_and_grads(model, ids, mask, labels)  # in training: dropout, so the reference's attention
    assert not reference_ops.windows
    model.bert.layers[1].attention(torch.randn(2, 7, CONFIG.hidden_size), *rotary(torch.arange(7), 10.0, 16))
    assert not reference_ops.windows and not reference_ops.rotations  # padded (B, T, H): the reference


def test_the_compiled_training_step_through_the_short_kernels_is_one_graph(reference_ops, monkeypatch):
    """torch.compile sees the step with the short kernels' autograd Function in every layer (on the
    CPU their contract by the reference's functions, behind opaque ops) without a break, and the
    compiled step's loss and gradients are the reference's. (The window kernels' Function is built
    the same way; at T > 128 the CPU's global layers run the reference's packed attention, which
    breaks the graph where flash attention does not.)"""
    import torch._dynamo

    reference_ops = OpaqueOps()
    monkeypatch.setattr(rotary_attention, "triton_ops", reference_ops)
    torch.manual_seed(0)
    reference = ModernBertForMaskedLM(CONFIG)
    model = copy.deepcopy(reference)
    install_rotary(model)
    ids, mask, labels = padded_batch(40)
    slots = with_prediction_slots({"labels": labels}, share=0.5, multiple=8)

    def loss_fn(ids, mask, index, targets):
        return compute_mlm_loss(model(ids, mask, masked_index=index), targets)

    inputs = (ids, mask, slots["masked_index"], slots["masked_labels"])
    explained = torch._dynamo.explain(loss_fn)(*inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert reference_ops.windows == [-1, 4, 4, -1]
    torch._dynamo.reset()
    loss = torch.compile(loss_fn, dynamic=False, backend="aot_eager")(*inputs)
    loss.backward()
    want, want_grads = loss_and_grads(reference, ids, mask, labels)
    assert_close(loss, want, atol=1e-6, rtol=1e-6)
    for name, p in model.named_parameters():
        assert_close(p.grad, want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


# ---- on a GPU: the Triton kernels' numbers ------------------------------------------------------------

def float64_reference(qkv, cos, sin, lengths, nh, window, do):
    """Rotations, then attention within each sequence (within `window`, -1: all), in float64: the
    output (N, H) and the gradient with respect to qkv (N, 3H)."""
    N, H = qkv.shape[0], qkv.shape[1] // 3
    hd = H // nh
    x = qkv.double().detach().requires_grad_()
    q, k, v = x.view(N, 3, nh, hd).unbind(1)
    q, k = apply_rotary(q, cos.double(), sin.double()), apply_rotary(k, cos.double(), sin.double())
    outs, start = [], 0
    for L in lengths:
        qs, ks, vs = (t[start:start + L].transpose(0, 1) for t in (q, k, v))  # (nh, L, hd)
        start += L
        s = qs @ ks.transpose(-1, -2) / math.sqrt(hd)
        if window >= 0:
            pos = torch.arange(L, device=qkv.device)
            s = s.masked_fill((pos[:, None] - pos[None, :]).abs() > window, float("-inf"))
        outs.append((s.softmax(-1) @ vs).transpose(0, 1).reshape(L, H))
    o = torch.cat(outs)
    o.backward(do.double())
    return o, x.grad


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.skipif(rotary_attention.triton_ops is None, reason="needs Triton")
def test_kernels_in_tritons_interpreter_stay_in_bounds_and_match_float64():
    """The three Triton ops on a CPU in Triton's interpreter (float16, a process of its own:
    `rotary_interpreter_worker.py`) over empty sequences, one-token ones, sequences shorter than a
    query block and the last block past N, heads of 32, 64 and 128: no load or store touches an
    address outside its tensor where its mask is true (on a GPU, an illegal memory access), and
    the numbers are float64's within 1e-2."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, rotary_interpreter_worker.__file__], env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = len(rotary_interpreter_worker.CASES) + len(rotary_interpreter_worker.WINDOW_CASES)
    assert proc.stdout.count("; 0 accesses out of bounds") == cases, proc.stdout


def synchronized(op: str, case: str) -> None:
    """Waits for the GPU, so that a kernel's fault is raised here naming the op and the case (CUDA
    reports it at a later call otherwise, and every later test of the process fails with it)."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:  # torch.AcceleratorError
        raise AssertionError(f"{op} faulted on {case}: {e}") from e


@cuda
@pytest.mark.parametrize("kernels, lengths, nh, hd, window, theta", [
    ("short", [128, 128, 0, 37, 1, 128], 12, 64, 64, 10_000.0), ("short", [128] * 8, 12, 64, -1, 160_000.0),
    ("short", [20, 0, 64, 5], 4, 32, 2, 10_000.0), ("short", [100, 3, 128], 6, 128, 16, 160_000.0),
    ("window", [512, 512, 300, 0, 1, 512], 12, 64, 64, 10_000.0), ("window", [1024, 700, 129], 12, 64, 64, 10_000.0),
    ("window", [200, 130, 5], 4, 32, 16, 10_000.0), ("window", [300, 64], 6, 128, 128, 10_000.0)])
def test_gpu_kernels_match_float64(kernels, lengths, nh, hd, window, theta):
    """ModernBERT-base's cases first: a sliding layer (window 64, theta 10k) over rows packed with
    their padding, a global one (theta 160k); then the window kernels over longer sequences (whose
    backward repeats bit for bit); relative-norm errors printed (pytest -s)."""
    ops = rotary_attention.triton_ops
    g = torch.Generator().manual_seed(sum(lengths) + hd)
    N, H = sum(lengths), nh * hd
    qkv = torch.randn(N, 3 * H, generator=g).cuda().bfloat16()
    do = torch.randn(N, H, generator=g).cuda().bfloat16()
    positions = torch.cat([torch.arange(L) for L in lengths]).cuda()
    cos, sin = (t[:, None] for t in rotary(positions, theta, hd))  # (N, 1, hd), as the model passes them
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    case = f"{kernels} kernels, lengths {lengths}, heads {nh}x{hd}, window {window}"
    synchronized("the inputs' preparation", case)
    if kernels == "window":
        o, lse, q, k = ops.window_fwd(qkv, cos, sin, cu, max(lengths), nh, window)
        synchronized("window_fwd", case)
        dqkv = ops.window_bwd(qkv, q, k, cos, sin, cu, o, do, lse, max(lengths), nh, window)
        synchronized("window_bwd", case)
        again = ops.window_bwd(qkv, q, k, cos, sin, cu, o, do, lse, max(lengths), nh, window)
        assert torch.equal(again, dqkv), "the window backward is not bit for bit the same run to run"
    else:
        o, lse = ops.attention_fwd(qkv, cos, sin, cu, max(lengths), nh, window)
        synchronized("attention_fwd", case)
        dqkv = ops.attention_bwd(qkv, cos, sin, cu, do, lse, max(lengths), nh, window)
        synchronized("attention_bwd", case)
    want, want_grad = float64_reference(qkv, cos, sin, lengths, nh, window, do)
    synchronized("the float64 reference", case)
    errors = {"out": rel(o, want), **{name: rel(dqkv[:, i * H:(i + 1) * H], want_grad[:, i * H:(i + 1) * H])
                                      for i, name in enumerate(("dq", "dk", "dv"))}}
    print(f"\nrotary attention, {case}, theta {theta:g}: "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert all(math.isfinite(e) and e < 1e-2 for e in errors.values()), errors
    q, k = ops.rotate_qk(qkv, cos, sin, nh)
    synchronized("rotate_qk", case)
    heads = qkv.view(N, 3, nh, hd)
    for got, x in ((q, heads[:, 0]), (k, heads[:, 1])):  # the reference's rotation, to bf16 rounding
        assert_close(got, apply_rotary(x, cos, sin), atol=1e-2, rtol=1e-2)


@cuda
def test_gpu_eager_inference_equals_the_reference():
    """modernbert-mini in bf16 at 300 tokens (flash after `rotate_qk`, the window kernel in local
    layers) and at 100 (the short kernel),
    padded and unpadded: the reference's states at the real tokens, within bf16 rounding."""
    torch.manual_seed(0)
    config = ModernBertConfig.from_name("modernbert-mini")
    reference = ModernBertModel(config).cuda().bfloat16().eval()
    model = copy.deepcopy(reference)
    fast = fast_path.apply(model, "cuda", training=False, dtype=torch.bfloat16)
    assert fast.rotary_attention and fast.window_flash
    for T in (300, 100):
        g = torch.Generator().manual_seed(T)
        ids = torch.randint(5, config.vocab_size, (3, T), generator=g).cuda()
        mask = torch.ones_like(ids)
        mask[1, T // 2:] = 0
        keep = mask.bool()
        with torch.inference_mode():
            want = reference(ids, mask)[keep]
            for unpadded in (False, True):
                assert rel(model(ids, mask, unpadded=unpadded)[keep], want) < 1e-2, (T, unpadded)


def bf16_errors(model: torch.nn.Module, reference: torch.nn.Module, float32: torch.nn.Module, ids, mask,
                labels) -> tuple[dict, dict]:
    """Relative-norm errors against the float32 reference (`float32`) of the loss, the last hidden
    states at the real tokens and each layer's QKV and output gradients: of `model` (the fast path)
    and of `reference` (the reference under the same bf16 autocast)."""
    keep = mask.bool()
    results = []
    for m in (model, reference, float32):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=m is not float32):
            hidden = m.bert(ids, mask)[keep].float()
            loss = compute_mlm_loss(m(ids, mask, labels=labels), labels).float()
        loss.backward()
        grads = {f"layer {i} {part}": getattr(layer.attention, part).weight.grad.float()
                 for i, layer in enumerate(m.bert.layers) for part in ("qkv", "out")}
        results.append({"loss": loss.detach(), "hidden": hidden, **grads})
    want = results[2]
    return tuple({k: rel(got[k], want[k]) for k in want} for got in results[:2])


@cuda
@pytest.mark.parametrize("T", [128, 512])
def test_gpu_base_shaped_training_matches_the_reference(T):
    """ModernBERT-base's layers (12 heads of 64, window +-64, thetas 160k global / 10k local), the
    first four (global, local, local, global), the eager training step under bf16 autocast with
    `apply`'s kernels (at 128 tokens the Triton rotary attention, at 512 the window kernels in the
    local layers and flash in the global ones):
    no error against the float32 reference above twice the reference's own bf16 error (+1e-3).
    Every relative-norm error printed (pytest -s)."""
    torch.manual_seed(0)
    config = ModernBertConfig.from_name("modernbert-base", num_hidden_layers=4)
    float32 = ModernBertForMaskedLM(config).cuda()
    reference, model = copy.deepcopy(float32), copy.deepcopy(float32)
    fast = fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16)
    assert fast.rotary_attention and fast.window_flash
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(5, config.vocab_size, (4, T), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate([T, T - 1, T // 3, 1]):  # one row longer than the window, one of a token
        mask[row, length:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, -100).masked_fill(mask == 0, -100)
    fast_errors, bf16 = bf16_errors(model, reference, float32, ids.cuda(), mask.cuda(), labels.cuda())
    print(f"\nModernBERT-base shape, 4 layers, T={T}, relative error against float32: "
          + ", ".join(f"{k} {fast_errors[k]:.1e} (reference bf16 {bf16[k]:.1e})" for k in fast_errors))
    worse = {k: (fast_errors[k], bf16[k]) for k in fast_errors if not fast_errors[k] <= 2 * bf16[k] + 1e-3}
    assert not worse, worse


@cuda
@pytest.mark.parametrize("T", [300, 8192])
def test_gpu_base_shaped_inference_matches_the_reference(T):
    """ModernBERT-base's first four layers in bf16 weights, eager inference (global layers: `rotate_qk`,
    then flash; local ones: the window kernel) at 300 and 8,192 tokens, padded and unpadded: the reference's bf16 states
    within bf16 rounding of the float32 ones."""
    torch.manual_seed(0)
    config = ModernBertConfig.from_name("modernbert-base", num_hidden_layers=4)
    float32 = ModernBertModel(config).cuda().eval()
    reference = copy.deepcopy(float32).bfloat16()
    model = copy.deepcopy(reference)
    assert fast_path.apply(model, "cuda", training=False, dtype=torch.bfloat16).rotary_attention
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(5, config.vocab_size, (2, T), generator=g).cuda()
    mask = torch.ones_like(ids)
    mask[1, T // 2 + 3:] = 0
    keep = mask.bool()
    with torch.inference_mode():
        want = float32(ids, mask)[keep]
        errors = {"reference bf16": rel(reference(ids, mask)[keep], want)}
        errors.update({f"fast path{' unpadded' if u else ''}": rel(model(ids, mask, unpadded=u)[keep], want)
                       for u in (False, True)})
    print(f"\nModernBERT-base shape, 4 layers, inference T={T}, relative error of the last states against "
          "float32: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert all(e <= 2 * errors["reference bf16"] + 1e-3 for e in errors.values()), errors
