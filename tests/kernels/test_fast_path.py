"""bert_kit.kernels.fast_path: which kernels `apply` puts on a model for a device and a job (decided
by `plan`, a pure function, tested here without a GPU), and that every kernel class it swaps in
keeps the parameters and gives the reference model's numbers where its kernels do not run.

Run: .venv/bin/python -m pytest tests/kernels/test_fast_path.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit import BERTForPreTraining, BERTForSequenceClassification, BertConfig, create_model_config
from bert_kit.heads import MLMHead
from bert_kit.kernels import dropout, fast_path, fused_backward, short_attention
from bert_kit.kernels.attention import CudaAttention
from bert_kit.kernels.fast_path import FastPath, plan
from bert_kit.kernels.fused_backward import FusedFeedForward
from bert_kit.kernels.padded_decoder import PaddedDecoderMLMHead, padded_linear
from bert_kit.kernels.residual import LowPrecisionLayerNorm
from bert_kit.kernels.short_attention import ShortAttention
from bert_kit.model import FeedForward, LayerNorm, MultiHeadAttention

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
BASE = create_model_config("bert-base-uncased (110M)")
EVERYTHING = FastPath("cuda", cuda_attention=True, varlen_flash=True, dropout_masks=True, fused_ffn=True,
                      fused_qkv=True, short_attention=True, padded_decoder=True, low_precision_residual=True)
PRETRAINING = dict(training=True, dtype=torch.bfloat16, compile=True, mlm_head=True, low_precision_residual=True)


def batch(B: int = 4, T: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CONFIG.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for b, length in enumerate([T, 13, 4, T - 1][:B]):
        mask[b, length:] = 0
    return ids, mask


def install_everything(model: torch.nn.Module, monkeypatch) -> FastPath:
    """Every kernel class on `model`, here on the CPU: as if Triton were present (its kernels are
    never called off CUDA; each class runs the reference's code there)."""
    monkeypatch.setattr(fused_backward, "triton_ops", object())
    monkeypatch.setattr(short_attention, "triton_ops", object())
    monkeypatch.setattr(dropout, "dropout_mask", object())
    return fast_path.install(model, EVERYTHING)


# ---- the plan: which kernels for which device, dtype and job ---------------------------------------

def test_cpu_runs_the_reference():
    fast = plan("cpu", BASE, **PRETRAINING)
    assert fast == FastPath("cpu", low_precision_residual=True)  # autocast's rule, not a kernel
    assert str(plan("cpu", BASE, training=False)) == "fast path: none (CPU: eager SDPA)"
    assert str(plan("mps", BASE, training=False, dtype=torch.float16)) == "fast path: none (MPS: eager SDPA)"


def test_pretraining_compiled_on_cuda_takes_every_kernel():
    fast = plan("cuda", BASE, **PRETRAINING)
    assert fast == EVERYTHING
    assert str(fast) == ("fast path: flash varlen attention, SDPA with safe mask kernels, Triton dropout masks, "
                         "fused FFN/QKV backward, short attention (T <= 128), padded MLM decoder, 16-bit residual stream")
    assert plan("cuda", BASE, **{**PRETRAINING, "dtype": torch.float16}) == EVERYTHING


@pytest.mark.parametrize("change, lost", [
    ({"compile": False}, {"dropout_masks", "fused_ffn", "fused_qkv", "short_attention", "padded_decoder"}),
    ({"training": False}, {"dropout_masks", "fused_ffn", "fused_qkv", "short_attention"}),
    ({"triton": False}, {"dropout_masks", "fused_ffn", "fused_qkv", "short_attention"}),
    ({"low_precision_residual": False}, {"fused_ffn", "fused_qkv", "short_attention", "low_precision_residual"}),
    ({"dtype": torch.float32}, {"varlen_flash", "fused_ffn", "fused_qkv", "short_attention",
                                "low_precision_residual"}),
    ({"compile_heads": False}, {"padded_decoder"}),
    ({"mlm_head": False}, {"padded_decoder"}),
    ({"triton_dropout": False}, {"dropout_masks"}),
    ({"fused_backward": False}, {"fused_ffn", "fused_qkv", "short_attention"}),
    ({"short_attention": False}, {"short_attention"}),
])
def test_each_condition_takes_away_exactly_its_kernels(change, lost):
    fast = plan("cuda", BASE, **{**PRETRAINING, **change})
    off = {name for name in vars(EVERYTHING) if getattr(EVERYTHING, name) is True and getattr(fast, name) is False}
    assert off == lost


ALL_FOUR = {"varlen_flash", "fused_ffn", "fused_qkv", "short_attention"}


@pytest.mark.parametrize("shape, kept", [
    (dict(hidden_size=384, num_attention_heads=12, intermediate_size=1536), ALL_FOUR),  # MiniLM: head size 32
    (dict(hidden_size=384, num_attention_heads=8, intermediate_size=1536), ALL_FOUR - {"short_attention"}),  # 48
    (dict(hidden_size=512, num_attention_heads=2, intermediate_size=2048), ALL_FOUR - {"short_attention"}),  # 256
    (dict(hidden_size=1024, num_attention_heads=2, intermediate_size=4096), {"fused_ffn", "fused_qkv"}),  # 512
    (dict(hidden_size=96, num_attention_heads=3, intermediate_size=384), {"varlen_flash"}),  # 96: not 64k
    (dict(hidden_size=128, num_attention_heads=2, intermediate_size=200), ALL_FOUR - {"fused_ffn"}),
    (dict(hidden_size=128, num_attention_heads=2, intermediate_size=512, hidden_act="relu"), ALL_FOUR - {"fused_ffn"}),
])
def test_model_shapes_the_kernels_tile(shape, kept):
    """Head sizes and widths decide the shape-bound parts: flash varlen (head size <= 256), the
    fused backward (widths in multiples of 64, GELU for the FFN's), short attention (head sizes
    16-128, powers of two)."""
    fast = plan("cuda", BertConfig(vocab_size=120, **shape), **PRETRAINING)
    assert {name for name in ALL_FOUR if getattr(fast, name)} == kept


def test_fine_tuning_and_inference_on_cuda():
    """Fine-tuning keeps float32 LayerNorm outputs, so compiled it takes the dropout masks only;
    inference takes CUDA's attention kernels, flash varlen in 16 bits."""
    tune = plan("cuda", BASE, training=True, dtype=torch.bfloat16, compile=True, compile_heads=False)
    assert tune == FastPath("cuda", cuda_attention=True, varlen_flash=True, dropout_masks=True)
    assert str(plan("cuda", BASE, training=False, dtype=torch.bfloat16)) == (
        "fast path: flash varlen attention, SDPA with safe mask kernels")
    assert str(plan("cuda", BASE, training=False)) == "fast path: SDPA with safe mask kernels"


# ---- apply and install: the classes swapped in, the numbers kept ----------------------------------

def test_apply_on_cpu_leaves_the_reference_and_its_outputs():
    torch.manual_seed(0)
    model = BERTForSequenceClassification(CONFIG, num_labels=3).eval()
    ids, mask = batch()
    with torch.no_grad():
        before = model(ids, mask), model(ids, mask, unpadded=True)
    fast = fast_path.apply(model, "cpu", training=False)
    assert str(fast) == "fast path: none (CPU: eager SDPA)"
    assert all(type(m) in (MultiHeadAttention, FeedForward, LayerNorm) for m in model.modules()
               if isinstance(m, (MultiHeadAttention, FeedForward, LayerNorm)))
    with torch.no_grad():
        after = model(ids, mask), model(ids, mask, unpadded=True)
    for a, b in zip(after, before):
        assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("train", [False, True])
def test_every_kernel_class_keeps_the_state_dict_and_the_reference_numbers_off_cuda(train, monkeypatch):
    """All of the fast path's classes put on a model on the CPU (as if Triton were present): the same
    state dict, and the reference's outputs padded and packed, in eval and in train mode (dropout
    drawn by F.dropout from the same seed)."""
    config = BertConfig(**{**vars(CONFIG), "hidden_dropout_prob": 0.1})
    torch.manual_seed(0)
    model = BERTForPreTraining(config).train(train)
    reference = BERTForPreTraining(config).train(train)
    reference.load_state_dict(model.state_dict())
    assert install_everything(model, monkeypatch) == EVERYTHING
    kinds = {type(m) for m in model.modules()}
    assert {ShortAttention, FusedFeedForward, dropout.MaskDropout, LowPrecisionLayerNorm, PaddedDecoderMLMHead} <= kinds
    assert list(model.state_dict()) == list(reference.state_dict())
    ids, mask = batch()
    for unpadded in (False, True):
        outputs = []
        for m in (model, reference):
            torch.manual_seed(1)
            outputs.append(m(ids, mask, unpadded=unpadded))
        for a, b in zip(*outputs):
            assert_close(a, b, rtol=0, atol=0)


def test_install_keeps_the_heads_classifier_dropout_and_what_is_already_on(monkeypatch):
    model = BERTForSequenceClassification(CONFIG, num_labels=2)
    install_everything(model, monkeypatch)
    assert type(model.dropout) is torch.nn.Dropout  # the head's: never compiled, never Triton's
    assert type(model.bert.embeddings.dropout) is dropout.MaskDropout
    fast_path.apply(model, "cpu", training=False)  # (an evaluation applying its own): changes nothing
    assert type(model.bert.encoder.layers[0].attention) is ShortAttention


def test_apply_without_triton_leaves_the_triton_kernels_out(monkeypatch):
    """Where the Triton modules find no Triton to import, `install` reports them absent."""
    monkeypatch.setattr(fused_backward, "triton_ops", None)
    monkeypatch.setattr(dropout, "dropout_mask", None)
    model = BERTForPreTraining(CONFIG)
    fast = fast_path.install(model, EVERYTHING)
    assert not (fast.fused_ffn or fast.fused_qkv or fast.short_attention or fast.dropout_masks)
    assert type(model.bert.encoder.layers[0].attention) is CudaAttention
    assert type(model.bert.encoder.layers[0].ffn) is FeedForward


def test_without_the_short_attention_kernels_the_fused_projection_stays(monkeypatch):
    monkeypatch.setattr(fused_backward, "triton_ops", object())
    monkeypatch.setattr(short_attention, "triton_ops", None)
    model = BERTForPreTraining(CONFIG)
    fast = fast_path.install(model, EVERYTHING)
    assert fast.fused_qkv and fast.fused_ffn and not fast.short_attention
    assert type(model.bert.encoder.layers[0].attention) is fused_backward.FusedQKVAttention
    assert type(model.bert.encoder.layers[0].ffn) is FusedFeedForward


def test_low_precision_residual_keeps_the_stream_16_bit_and_close():
    """`set_low_precision_residual`: under bf16 autocast every LayerNorm (so the residual stream
    and the encoder output) is bf16 instead of float32, and the results stay at bf16 rounding."""
    from bert_kit import set_low_precision_residual

    torch.manual_seed(0)
    model = BERTForPreTraining(CONFIG).eval()
    inputs, mask = batch()
    with torch.no_grad():
        reference = model.bert(inputs, mask)[0]  # float32, no autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hf_like = model.bert(inputs, mask)[0]
            set_low_precision_residual(model)
            low = model.bert(inputs, mask)[0]
        plain_fp32 = model.bert(inputs, mask)[0]  # outside autocast the switch changes nothing
    assert all(type(m) is LowPrecisionLayerNorm for m in model.modules() if isinstance(m, LayerNorm))
    assert hf_like.dtype == torch.float32 and low.dtype == torch.bfloat16
    assert_close(plain_fp32, reference)
    # LayerNorm outputs are O(1): bf16 keeps 8 bits of mantissa, two layers of rounding
    assert_close(low.float(), reference, rtol=0, atol=0.1)
    assert (low.float() - reference).abs().mean() < 0.02
    set_low_precision_residual(model, enabled=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.bert(inputs, mask)[0].dtype == torch.float32


def test_padded_linear_gives_the_linear_layers_outputs_and_gradients():
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 120)  # 120 outputs: padded to 128
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = padded_linear(x, linear)
    assert y.shape == (3, 5, 120)
    assert_close(y, linear(x))
    dy = torch.randn_like(y)
    fast = torch.autograd.grad(y, [x, linear.weight, linear.bias], dy)
    plain = torch.autograd.grad(linear(x), [x, linear.weight, linear.bias], dy)
    for a, b in zip(fast, plain):
        assert a.shape == b.shape
        assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_mlm_head_on_cuda_pads_the_vocabulary_with_the_same_results():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=64, intermediate_size=128, num_attention_heads=1)
    head = MLMHead(cfg).cuda()
    head.__class__ = PaddedDecoderMLMHead  # as `fast_path.apply` does for heads compiled on CUDA
    x = torch.randn(300, 64, device="cuda", requires_grad=True)

    def run(fn):
        for t in (x, *head.parameters()):
            t.grad = None
        y = fn(x)
        y.square().mean().backward()
        return [y, x.grad, *(p.grad for p in head.parameters())]

    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(head, fullgraph=True, backend=lambda gm, _: graphs.append(gm) or gm)
    fast, plain = run(compiled), run(head)
    assert any("pad" in str(n.target) for g in graphs for n in g.graph.nodes)  # took the padded decoder
    for a, b in zip(fast, plain, strict=True):
        assert a.shape == b.shape
        assert_close(a, b, rtol=1e-4, atol=1e-5)
