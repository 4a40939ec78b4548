"""The torch model against `transformers` on random init, its unpadded and packed paths against
the padded one, parameter counts and input validation (the kernels: tests/kernels/).

Run: .venv/bin/python -m pytest tests/test_model.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit import (BERTForMaskedLM, BERTForPreTraining, BERTForQuestionAnswering,
                      BERTForSequenceClassification, BERTForTokenClassification, BERTModel,
                      BertConfig, create_model_config)
from bert_kit.input_checks import unchecked_inputs
from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=211, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=80, max_position_embeddings=64)


def batch(vocab: int, B: int = 4, T: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for b, length in enumerate([T, T - 7, 5, T - 1][:B]):
        mask[b, length:] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2:] = 1
    return ids, mask, types


def hf_twin(model, hf_cls, tmp_path, **kw):
    model.save_pretrained(tmp_path)
    return hf_cls.from_pretrained(tmp_path, attn_implementation="eager", **kw).eval()


@pytest.mark.parametrize("config", [BertConfig(**TINY), create_model_config("bert-base-uncased (110M)")],
                         ids=["tiny", "base"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_pretraining_parity_with_transformers(config, with_mask, tmp_path):
    torch.manual_seed(0)
    model = BERTForPreTraining(config).eval()
    hf = hf_twin(model, transformers.BertForPreTraining, tmp_path)
    ids, mask, types = batch(config.vocab_size, T=16 if config.hidden_size > 100 else 24)
    mask = mask if with_mask else None
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    labels[0, 7] = ids[0, 7]
    nsp_labels = torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels, next_sentence_label=nsp_labels,
                 output_hidden_states=True)
        hidden = model.bert(ids, mask, types)
        mlm, nsp = model(ids, mask, types)
        mlm_masked, _ = model(ids, mask, types, labels=labels)
    keep = mask.bool() if mask is not None else torch.ones_like(ids, dtype=torch.bool)
    assert_close(hidden[keep], ref.hidden_states[-1][keep], rtol=1e-5, atol=1e-5)
    assert_close(model.bert.pool(hidden), hf.bert.pooler(ref.hidden_states[-1]), rtol=1e-5, atol=1e-5)
    assert_close(mlm[keep], ref.prediction_logits[keep], rtol=1e-5, atol=1e-5)
    assert_close(nsp, ref.seq_relationship_logits, rtol=1e-5, atol=1e-5)
    # logits only at labelled positions line up with labels[labels != -100]
    assert_close(mlm_masked, ref.prediction_logits[labels != -100], rtol=1e-5, atol=1e-5)
    from bert_kit.training.losses import compute_mlm_loss, compute_classification_loss

    loss = compute_mlm_loss(mlm_masked, labels) + compute_classification_loss(nsp, nsp_labels)
    assert_close(loss, ref.loss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ours,theirs,kw", [
    (BERTForSequenceClassification, "BertForSequenceClassification", {"num_labels": 3}),
    (BERTForSequenceClassification, "BertForSequenceClassification", {"num_labels": 1}),
    (BERTForTokenClassification, "BertForTokenClassification", {"num_labels": 5}),
    (BERTForQuestionAnswering, "BertForQuestionAnswering", {}),
    (BERTForMaskedLM, "BertForMaskedLM", {}),
])
def test_head_parity_with_transformers(ours, theirs, kw, tmp_path):
    torch.manual_seed(1)
    model = ours(BertConfig(**TINY), **kw).eval()
    hf = hf_twin(model, getattr(transformers, theirs), tmp_path)
    ids, mask, types = batch(TINY["vocab_size"])
    with torch.no_grad():
        out = model(ids, mask, types)
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    if ours is BERTForQuestionAnswering:
        keep = mask.bool()
        assert_close(out[0][keep], ref.start_logits[keep], rtol=1e-5, atol=1e-5)
        assert_close(out[1][keep], ref.end_logits[keep], rtol=1e-5, atol=1e-5)
    elif out.dim() == 3:
        keep = mask.bool()
        assert_close(out[keep], ref.logits[keep], rtol=1e-5, atol=1e-5)
    else:
        assert_close(out, ref.logits, rtol=1e-5, atol=1e-5)


def test_parameter_counts():
    base = create_model_config("bert-base-uncased (110M)")
    assert BERTModel(base).num_parameters() == 109_482_240  # the "110M" of the BERT paper
    assert BERTForPreTraining(base).num_parameters() == 110_106_428  # decoder tied: counted once
    model = BERTForPreTraining(BertConfig(**TINY))
    assert model.mlm.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_unpadded_path_equals_padded():
    torch.manual_seed(2)
    model = BERTForSequenceClassification(BertConfig(**TINY), num_labels=2).eval()
    ids, mask, types = batch(TINY["vocab_size"])
    with torch.no_grad():
        padded = model.bert(ids, mask, types)
        unpadded = model.bert(ids, mask, types, unpadded=True)
    keep = mask.bool()
    assert_close(unpadded[keep], padded[keep], rtol=1e-5, atol=1e-5)
    assert (unpadded[~keep] == 0).all()


def test_row_layout_gives_the_padded_results_at_every_real_token():
    """`Packed.of_rows`: each row's tokens and its padding as separate sequences (a full row's padding
    is empty); the real tokens' states equal the padded model's, the shapes stay (B, T, H)."""
    torch.manual_seed(2)
    model = BERTModel(BertConfig(**TINY)).eval()
    ids, mask, types = batch(TINY["vocab_size"])  # lengths 24, 17, 5, 23 of T = 24
    layout = Packed.of_rows(mask)
    assert layout.cu_seqlens.tolist() == [0, 24, 24, 41, 48, 53, 72, 95, 96]
    assert (layout.max_seqlen, layout.batch, layout.seqlen, layout.indices) == (24, 4, 24, None)
    with torch.no_grad():
        padded = model(ids, mask, types)
        rows = model(ids, mask, types, unpadded=layout)
    assert rows.shape == padded.shape
    keep = mask.bool()
    assert_close(rows[keep], padded[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_row_layout_trains_like_the_masked_path_on_cuda_and_in_a_cuda_graph():
    """bf16 on a GPU, dropout off: the loss and gradients through flash attention over
    `Packed.of_rows` match the masked kernel's; recorded in a CUDA graph and replayed on another
    batch of the same shape, it gives the eager result (the layout is made on the device)."""
    torch.manual_seed(4)
    model = BERTForSequenceClassification(BertConfig(**TINY), num_labels=3).cuda().eval()  # eval: no dropout
    fast_path.apply(model, "cuda", training=True, dtype=torch.bfloat16)  # CUDA's attention kernels

    labels = torch.tensor([0, 1, 2, 1], device="cuda")

    def loss_and_grads(ids, mask, types, unpadded):
        model.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16), unchecked_inputs():  # (its check reads values back)
            logits = model(ids, mask, types, unpadded=Packed.of_rows(mask) if unpadded == "rows" else unpadded)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        return loss.detach().clone(), [p.grad.clone() for p in model.parameters()]

    first = [t.cuda() for t in batch(TINY["vocab_size"], seed=0)]
    masked_loss, masked_grads = loss_and_grads(*first, unpadded=False)
    rows_loss, rows_grads = loss_and_grads(*first, unpadded="rows")
    assert abs(rows_loss.item() - masked_loss.item()) <= 1e-2 * masked_loss.item()
    for a, b in zip(rows_grads, masked_grads):
        assert torch.isfinite(a).all()
        assert (a - b).norm() <= 0.05 * b.norm() + 1e-6

    static = [t.clone() for t in first]
    loss_and_grads(*static, unpadded="rows")  # warm-up before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed_loss, _ = loss_and_grads(*static, unpadded="rows")
    second = [t.cuda() for t in batch(TINY["vocab_size"], seed=1)]
    second[1] = second[1].flip(0)  # other lengths per row
    for buffer, value in zip(static, second):
        buffer.copy_(value)
    graph.replay()
    graphed_grads = [p.grad.clone() for p in model.parameters()]
    eager_loss, eager_grads = loss_and_grads(*second, unpadded="rows")
    assert_close(graphed_loss, eager_loss, rtol=1e-3, atol=1e-3)
    for a, b in zip(graphed_grads, eager_grads):
        assert (a - b).norm() <= 1e-2 * b.norm() + 1e-6


def test_packed_sequences_attend_only_to_themselves():
    torch.manual_seed(3)
    model = BERTModel(BertConfig(**TINY)).eval()
    a, b = torch.randint(5, 200, (1, 9)), torch.randint(5, 200, (1, 14))
    with torch.no_grad():
        packed = model.forward_packed(torch.cat([a, b], 1)[0], torch.tensor([0, 9, 23]), max_seqlen=14)
        assert_close(packed[:9], model(a)[0], rtol=1e-5, atol=1e-5)
        assert_close(packed[9:], model(b)[0], rtol=1e-5, atol=1e-5)


def test_sinusoidal_and_relu_variants_run_and_train():
    config = BertConfig(**{**TINY, "position_embedding_type": "sinusoidal", "hidden_act": "relu"})
    model = BERTForMaskedLM(config)
    assert not any("position" in n for n, _ in model.named_parameters())
    ids, mask, types = batch(config.vocab_size)
    model(ids, mask, types).sum().backward()
    assert model.bert.embeddings.word_embeddings.weight.grad is not None


def test_dropout_active_only_in_train_mode():
    model = BERTModel(BertConfig(**TINY))
    ids, mask, _ = batch(TINY["vocab_size"])
    model.train()
    assert not torch.equal(model(ids, mask), model(ids, mask))
    model.eval()
    assert torch.equal(model(ids, mask), model(ids, mask))


def test_bad_inputs_give_clear_errors():
    model = BERTModel(BertConfig(**TINY)).eval()
    ids = torch.randint(0, 200, (2, 10))
    with pytest.raises(ValueError, match="token id 211 out of range for vocab_size 211"):
        model(torch.full((2, 10), 211))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.full((2, 10), -1))
    with pytest.raises(ValueError, match="sequence length 65 exceeds max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(TypeError, match="integer tensor"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len\)"):
        model(ids[0])
    with pytest.raises(ValueError, match="token_type id 2 out of range for type_vocab_size 2"):
        model(ids, token_type_ids=torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model(ids, attention_mask=torch.ones(2, 9, dtype=torch.long))
