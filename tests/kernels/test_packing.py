"""Numerics guard: packed batches train like padded ones (bert_kit.kernels.packing).

Packed = encoder on real tokens only (`unpadded=True`) and the MLM decoder at the masked positions
only (`masked_index`); padded = padded batches, full (B, T, V) logits, -100 labels. 300 AdamW
steps from the same seed on variable-length batches (fp32, CPU, tiny model, dropout off so the
two runs consume no random numbers differently) must give the same loss curve. The step traces
as one graph either way, on the reference modules and on the fast path's.

Run: .venv/bin/python -m pytest tests/kernels/test_packing.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit import BERTForPreTraining, BertConfig
from bert_kit.heads import masked_index, pad_masked
from bert_kit.kernels.packing import Packed, pad, unpad
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


def test_packed_loss_curve_matches_padded():
    plain, fast = train(fast=False), train(fast=True)
    first, last = sum(plain[:20]) / 20, sum(plain[-20:]) / 20
    assert last < first - 0.5, "the toy task must be learnt for the comparison to mean something"
    # identical maths, different summation order: differences stay at float32 rounding level
    assert_close(torch.tensor(fast), torch.tensor(plain), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("modules", ["reference", "fast path"])
def test_training_step_traces_as_one_graph(modules, monkeypatch):
    """torch.compile sees the whole loss (encoder, masked-position head, losses) without a break,
    both padded and unpadded; with static prediction slots the shapes are fixed as well. So do the
    fast path's modules (every kernel class put on, here on the CPU, where they run the reference's code)."""
    import torch._dynamo

    from tests.kernels.test_fast_path import install_everything

    model = BERTForPreTraining(CONFIG)
    if modules == "fast path":
        install_everything(model, monkeypatch)
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


def test_unpad_and_pad_are_inverses():
    """`unpad` keeps the real tokens in row-major order; `pad` puts them back with zeros at padding."""
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)  # (B, T, H)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    tokens, layout = unpad(x, mask)
    assert tokens.shape == (5, 3) and layout.cu_seqlens.tolist() == [0, 3, 5] and layout.max_seqlen == 3
    assert torch.equal(tokens, x[mask.bool()])
    assert torch.equal(pad(tokens, layout), x * mask[..., None])
    host = Packed.from_mask(mask)
    assert torch.equal(host.indices, layout.indices) and (host.batch, host.seqlen) == (2, 4)
