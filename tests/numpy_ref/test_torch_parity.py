"""Cross-engine parity in float64: the NumPy engine against ``transformers.BertForPreTraining``
(eager attention, eval mode, exact GELU), the torch reference for HF-format BERT.

Weights travel through the checkpoint format (NumPy ``save_pretrained`` -> HF ``from_pretrained``
and back), so these tests also pin down the weight exchange. Forward outputs must agree within
1e-10 and every parameter gradient within 1e-9; the real all-MiniLM-L6-v2 checkpoint must give the
same hidden states in both engines.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_torch_parity.py -q
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from bert_kit.numpy_ref import BertBaseModel, BertModel, create_mlm_batch, hf_name_map  # noqa: E402

F64 = np.float64
FORWARD_ATOL, GRAD_ATOL = 1e-10, 1e-9
VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN = 40, 16, 4, 32, 2, 16


def numpy_model(activation: str = "gelu") -> BertModel:
    model = BertModel(VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN, activation=activation, dtype=F64, seed=3,
                      initializer_range=0.2)
    rng = np.random.default_rng(4)
    for _, param in model.named_parameters():
        if param.ndim == 1:  # biases and LayerNorm off their 0 / 1 init, so every term shows
            param += rng.standard_normal(param.shape) * 0.1
    return model


def hf_from_folder(folder, cls=None):
    cls = cls or transformers.BertForPreTraining
    model = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64)
    return model.eval()  # no dropout


def batch_inputs():
    """Two segments, [PAD] under the attention mask, masked positions with -1 padding."""
    batch = create_mlm_batch(3, 12, VOCAB, mask_prob=0.3, random_seed=5)
    segments = np.zeros_like(batch.input_ids)
    segments[:, 6:] = 1
    attention = np.ones_like(batch.input_ids)
    attention[1, 9:] = 0
    input_ids = batch.input_ids.copy()
    input_ids[1, 9:] = 0
    assert (batch.masked_positions[:, -1] == -1).any()
    return input_ids, segments, attention, batch.masked_positions, batch.mlm_labels


def torch_outputs(hf, input_ids, segments, attention):
    return hf(input_ids=torch.tensor(input_ids), token_type_ids=torch.tensor(segments),
              attention_mask=torch.tensor(attention), output_hidden_states=True)


def gather_masked(prediction_logits, positions):
    """HF's (B, T, V) logits at the real masked slots -> (N, V), row-major like ``positions >= 0``."""
    rows, slots = np.nonzero(positions >= 0)
    return prediction_logits[torch.tensor(rows), torch.tensor(positions[rows, slots])]


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_forward_matches_transformers(tmp_path, activation):
    model = numpy_model(activation)
    model.save_pretrained(tmp_path)
    hf = hf_from_folder(tmp_path)
    assert hf.config.hidden_act == activation
    input_ids, segments, attention, positions, _ = batch_inputs()
    mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
    with torch.no_grad():
        out = torch_outputs(hf, input_ids, segments, attention)
        pooled = hf.bert.pooler(out.hidden_states[-1])
    valid = positions >= 0
    close = dict(rtol=0, atol=FORWARD_ATOL)
    torch.testing.assert_close(torch.tensor(model.sequence_output),
                               out.hidden_states[-1], **close)
    torch.testing.assert_close(torch.tensor(model.pooled_output), pooled, **close)
    torch.testing.assert_close(torch.tensor(mlm_logits[valid]), gather_masked(out.prediction_logits, positions),
                               **close)
    torch.testing.assert_close(torch.tensor(nsp_logits), out.seq_relationship_logits, **close)


def test_gradients_match_torch_autograd(tmp_path):
    model = numpy_model()
    model.save_pretrained(tmp_path)
    hf = hf_from_folder(tmp_path)
    input_ids, segments, attention, positions, labels = batch_inputs()
    nsp_labels = np.array([1, 0, 1])

    # NumPy: hand-written backward, no update.
    mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
    mlm_loss, grad_mlm = model.mlm_loss_and_grad(mlm_logits, labels)
    nsp_loss, grad_nsp = model.nsp_loss_and_grad(nsp_logits, nsp_labels)
    model.backward(grad_mlm, grad_nsp, lr=0.0)

    # torch: the same mean cross-entropies, autograd.
    out = torch_outputs(hf, input_ids, segments, attention)
    valid = labels >= 0
    torch_mlm = torch.nn.functional.cross_entropy(gather_masked(out.prediction_logits, positions),
                                                  torch.tensor(labels[valid]))
    torch_nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, torch.tensor(nsp_labels))
    (torch_mlm + torch_nsp).backward()
    for ours_loss, torch_loss in ((mlm_loss, torch_mlm), (nsp_loss, torch_nsp)):
        torch.testing.assert_close(torch.tensor(ours_loss, dtype=torch.float64), torch_loss.detach(),
                                   rtol=0, atol=FORWARD_ATOL)

    torch_grads = {name: p.grad for name, p in hf.named_parameters()}
    names = hf_name_map(LAYERS, pretraining=True)
    ours = dict(model.named_grads())
    assert set(names[n] for n in ours) == set(torch_grads), "every torch parameter has a NumPy gradient"
    for name, grad in ours.items():
        hf_name = names[name]
        assert torch_grads[hf_name] is not None, hf_name
        torch.testing.assert_close(torch.tensor(grad), torch_grads[hf_name], rtol=0, atol=GRAD_ATOL,
                                   msg=lambda m, n=hf_name: f"{n}: {m}")


def test_transformers_checkpoint_loads_into_numpy(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FF, max_position_embeddings=MAX_LEN)
    hf = transformers.BertForPreTraining(config).double().eval()
    with torch.no_grad():  # HF zero-inits biases; random values make the check meaningful
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    model = BertModel.from_pretrained(tmp_path, dtype=F64)
    input_ids, segments, attention, positions, _ = batch_inputs()
    mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
    with torch.no_grad():
        out = torch_outputs(hf, input_ids, segments, attention)
    torch.testing.assert_close(torch.tensor(mlm_logits[positions >= 0]),
                               gather_masked(out.prediction_logits, positions), rtol=0, atol=FORWARD_ATOL)
    torch.testing.assert_close(torch.tensor(nsp_logits), out.seq_relationship_logits, rtol=0, atol=FORWARD_ATOL)


def test_real_minilm_hidden_states_match(minilm_path):
    model = BertBaseModel.from_pretrained(minilm_path, dtype=F64)
    hf = hf_from_folder(minilm_path, transformers.BertModel)
    # [CLS] the cat sat on the mat . [SEP] [PAD] [PAD] and a second row
    input_ids = np.array([[101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102, 0, 0],
                          [101, 7592, 2088, 999, 102, 2129, 2024, 2017, 1029, 102, 0]])
    segments = np.array([[0] * 11, [0] * 5 + [1] * 5 + [0]])
    attention = (input_ids != 0).astype(np.int64)
    sequence = model.forward(input_ids, segments, attention)
    pooled = model.pool(sequence)
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(input_ids), token_type_ids=torch.tensor(segments),
                 attention_mask=torch.tensor(attention))
    torch.testing.assert_close(torch.tensor(sequence), out.last_hidden_state, rtol=0, atol=FORWARD_ATOL)
    torch.testing.assert_close(torch.tensor(pooled), out.pooler_output, rtol=0, atol=FORWARD_ATOL)


def test_forward_and_gradients_match_bert_kit_torch_model(tmp_path):
    """The same checks against bert_kit's own torch model, loaded from the NumPy engine's folder."""
    from bert_kit import BERTForPreTraining
    from bert_kit.hf import to_hf_state_dict

    model = numpy_model()
    model.save_pretrained(tmp_path)
    ours = BERTForPreTraining.from_pretrained(tmp_path, dtype=torch.float64)
    input_ids, segments, attention, positions, labels = batch_inputs()
    nsp_labels = np.array([1, 0, 1])
    mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
    mlm_loss, grad_mlm = model.mlm_loss_and_grad(mlm_logits, labels)
    nsp_loss, grad_nsp = model.nsp_loss_and_grad(nsp_logits, nsp_labels)
    model.backward(grad_mlm, grad_nsp, lr=0.0)

    ids, types, mask = (torch.tensor(a) for a in (input_ids, segments, attention))
    hidden = ours.bert(ids, mask, types)
    torch.testing.assert_close(torch.tensor(model.sequence_output), hidden.detach(), rtol=0, atol=FORWARD_ATOL)
    full_logits, torch_nsp_logits = ours(ids, mask, types)
    torch.testing.assert_close(torch.tensor(mlm_logits[positions >= 0]), gather_masked(full_logits, positions).detach(),
                               rtol=0, atol=FORWARD_ATOL)
    torch.testing.assert_close(torch.tensor(nsp_logits), torch_nsp_logits.detach(), rtol=0, atol=FORWARD_ATOL)
    valid = labels >= 0
    loss = (torch.nn.functional.cross_entropy(gather_masked(full_logits, positions), torch.tensor(labels[valid]))
            + torch.nn.functional.cross_entropy(torch_nsp_logits, torch.tensor(nsp_labels)))
    loss.backward()
    torch.testing.assert_close(loss.detach(), torch.tensor(mlm_loss + nsp_loss, dtype=torch.float64),
                               rtol=0, atol=FORWARD_ATOL)
    torch_grads = to_hf_state_dict(ours, {n: p.grad for n, p in ours.named_parameters()})
    names = hf_name_map(LAYERS, pretraining=True)
    grads = dict(model.named_grads())
    assert {names[n] for n in grads} == set(torch_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(torch.tensor(grad), torch_grads[names[name]], rtol=0, atol=GRAD_ATOL,
                                   msg=lambda m, n=names[name]: f"{n}: {m}")
