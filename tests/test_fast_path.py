"""Numerics guard: the fast path trains like the plain path.

Fast = encoder on real tokens only (`unpadded=True`) and the MLM decoder at the masked positions
only (`masked_index`); plain = padded batches, full (B, T, V) logits, -100 labels. 300 AdamW
steps from the same seed on variable-length batches (fp32, CPU, tiny model, dropout off so the
two runs consume no random numbers differently) must give the same loss curve.

Run: .venv/bin/python -m pytest tests/test_fast_path.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit import BERTForPreTraining, BertConfig
from bert_kit.heads import MLMHead, masked_index, pad_masked, padded_linear
from bert_kit.training.losses import compute_classification_loss, compute_mlm_loss

CONFIG = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)


def batches(n: int, B: int = 8, T: int = 24, seed: int = 0):
    """A learnable toy task: each sequence repeats a short random motif; 15% of tokens masked."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(6, T + 1, (B,), generator=g)
        motif = torch.randint(5, 120, (B, 4), generator=g)
        ids = motif.repeat(1, T // 4)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = ids * mask
        chosen = (torch.rand(B, T, generator=g) < 0.15) & mask.bool()
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        inputs = torch.where(chosen, torch.full_like(ids, 3), ids)
        out.append((inputs, mask, labels, inputs[:, 0] % 2))
    return out


def train(fast: bool, steps: int = 300) -> list[float]:
    torch.manual_seed(0)
    model = BERTForPreTraining(CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for inputs, mask, labels, nsp in batches(steps):
        if fast:
            index = masked_index(labels)
            index, targets = pad_masked(index, labels.flatten()[index], capacity=inputs.numel() // 4)
            mlm, nsp_logits = model(inputs, mask, unpadded=True, masked_index=index)
            loss = compute_mlm_loss(mlm, targets)
        else:
            mlm, nsp_logits = model(inputs, mask)
            loss = compute_mlm_loss(mlm, labels)
        loss = loss + compute_classification_loss(nsp_logits, nsp)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_fast_path_loss_curve_matches_plain_path():
    plain, fast = train(fast=False), train(fast=True)
    first, last = sum(plain[:20]) / 20, sum(plain[-20:]) / 20
    assert last < first - 0.5, "the toy task must be learnt for the comparison to mean something"
    # identical maths, different summation order: differences stay at float32 rounding level
    assert_close(torch.tensor(fast), torch.tensor(plain), rtol=2e-3, atol=2e-3)


def test_training_step_traces_as_one_graph():
    """torch.compile sees the whole loss (encoder, masked-position head, losses) without a break,
    both padded and unpadded; with static prediction slots the shapes are fixed as well."""
    import torch._dynamo

    model = BERTForPreTraining(CONFIG)
    inputs, mask, labels, nsp = batches(1)[0]
    index = masked_index(labels)
    index, targets = pad_masked(index, labels.flatten()[index], capacity=inputs.numel() // 4)

    def loss_fn(inputs, mask, index, targets, nsp, unpadded):
        mlm, nsp_logits = model(inputs, mask, masked_index=index, unpadded=unpadded)
        return compute_mlm_loss(mlm, targets) + compute_classification_loss(nsp_logits, nsp)

    torch._dynamo.config.capture_dynamic_output_shape_ops = True  # unpadding: nonzero
    torch._dynamo.config.capture_scalar_outputs = True  # unpadding: the longest length
    for unpadded in (False, True):
        explained = torch._dynamo.explain(loss_fn)(inputs, mask, index, targets, nsp, unpadded)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1


def test_low_precision_residual_keeps_the_stream_16_bit_and_close():
    """`set_low_precision_residual`: under bf16 autocast every LayerNorm (so the residual stream
    and the encoder output) is bf16 instead of float32, and the results stay at bf16 rounding."""
    from bert_kit import LayerNorm, set_low_precision_residual

    torch.manual_seed(0)
    model = BERTForPreTraining(CONFIG).eval()
    inputs, mask, _, _ = batches(1)[0]
    with torch.no_grad():
        reference = model.bert(inputs, mask)[0]  # float32, no autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hf_like = model.bert(inputs, mask)[0]
            set_low_precision_residual(model)
            low = model.bert(inputs, mask)[0]
        plain_fp32 = model.bert(inputs, mask)[0]  # outside autocast the switch changes nothing
    assert all(m.autocast_output for m in model.modules() if isinstance(m, LayerNorm))
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
