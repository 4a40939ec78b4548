"""The BERT family's other members through BERT's classes: RoBERTa, XLM-RoBERTa and DistilBERT
folders written by transformers (random init, tiny) load into BERTModel and every head with the
outputs of transformers' own classes within 1e-5 (padded and unpadded, left padding and padding
inside a row for RoBERTa's positions), and what bert-kit saves loads in transformers unchanged.
Also: their config.json in and out, and the one-line refusal of a family bert-kit does not build.

Run: .venv/bin/python -m pytest tests/test_hf_families.py -q
"""

import dataclasses
import json
import warnings

import pytest
import torch
from torch.testing import assert_close

from bert_kit import (BERTForMaskedLM, BERTForPreTraining, BERTForQuestionAnswering, BERTForSequenceClassification,
                      BERTForTokenClassification, BERTModel, BertConfig)
from bert_kit.checks import ConfigError
from bert_kit.config import UnsupportedModelError, load_hf_config
from bert_kit.hf import NewWeightsWarning
from bert_kit.weight_files import read_state_dict

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
HF_CONFIGS = {  # model_type -> (HF class prefix, its config)
    "roberta": ("Roberta", lambda: transformers.RobertaConfig(**SHAPE, max_position_embeddings=40, type_vocab_size=1,
                                                               pad_token_id=1, layer_norm_eps=1e-5)),
    "xlm-roberta": ("XLMRoberta", lambda: transformers.XLMRobertaConfig(**SHAPE, max_position_embeddings=40,
                                                                         type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("DistilBert", lambda: transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                                       hidden_dim=37, max_position_embeddings=40)),
    "distilbert-sinusoidal": ("DistilBert", lambda: transformers.DistilBertConfig(
        vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40,
        sinusoidal_pos_embds=True, activation="relu")),
}
HEADS = {"Model": BERTModel, "ForMaskedLM": BERTForMaskedLM, "ForSequenceClassification": BERTForSequenceClassification,
         "ForTokenClassification": BERTForTokenClassification, "ForQuestionAnswering": BERTForQuestionAnswering}


def batch(pad_token_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 20) ids and mask: one full row, two padded ones (on the right, or the left)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 99, (3, 20), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 12:], mask[2, 5:] = 0, 0
    if left:
        mask = mask.flip(1)
    return ids.masked_fill(mask == 0, pad_token_id), mask


def outputs(result, role: str) -> torch.Tensor:
    """Ours or HF's output as one tensor: hidden states, logits, or (start, end) stacked."""
    if isinstance(result, tuple):
        return torch.stack(result)
    if not isinstance(result, torch.Tensor):
        if role == "Model":
            return result.last_hidden_state
        if role == "ForQuestionAnswering":
            return torch.stack([result.start_logits, result.end_logits])
        return result.logits
    return result


def real(t: torch.Tensor, mask: torch.Tensor, role: str) -> torch.Tensor:
    """The positions that hold tokens (per-token outputs); sequence outputs whole."""
    if role == "ForSequenceClassification":
        return t
    return t[:, mask.bool()] if role == "ForQuestionAnswering" else t[mask.bool()]


# every head of RoBERTa and DistilBERT; XLM-R (RoBERTa's classes under another name) and DistilBERT's
# sinusoidal positions with the encoder and the head that differs most
CASES = [(family, role) for family in ("roberta", "distilbert") for role in HEADS] + [
    ("xlm-roberta", "Model"), ("xlm-roberta", "ForSequenceClassification"), ("distilbert-sinusoidal", "Model"),
    ("distilbert-sinusoidal", "ForMaskedLM")]


@pytest.mark.parametrize("family, role", CASES)
def test_transformers_folders_load_with_the_same_outputs_and_back(tmp_path, family, role):
    prefix, make_config = HF_CONFIGS[family]
    config = make_config()
    torch.manual_seed(0)
    hf = getattr(transformers, prefix + role)(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NewWeightsWarning)  # every weight is in the folder
        ours = HEADS[role].from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == family.split("-sinusoidal")[0]
    ids, mask = batch(config.pad_token_id)
    with torch.no_grad():
        expect = outputs(hf(input_ids=ids, attention_mask=mask), role)
        got = outputs(ours(ids, mask), role)
        unpadded = outputs(ours(ids, mask, unpadded=True), role)
    assert expect.abs().max() > 1e-3  # outputs that say something
    assert_close(real(got, mask, role), real(expect, mask, role), rtol=1e-5, atol=1e-5)
    assert_close(real(unpadded, mask, role), real(expect, mask, role), rtol=1e-5, atol=1e-5)

    ours.save_pretrained(tmp_path / "ours")  # and back: transformers loads bert-kit's folder unchanged
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == config.model_type and saved["architectures"] == [prefix + role]
    back = getattr(transformers, "Auto" + ("Model" if role == "Model" else "Model" + role)).from_pretrained(
        tmp_path / "ours").eval()
    assert type(back).__name__ == prefix + role
    with torch.no_grad():
        assert_close(outputs(back(input_ids=ids, attention_mask=mask), role), expect, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_robertas_positions_skip_the_padding_wherever_it_is(tmp_path, family):
    """HF's create_position_ids_from_input_ids: positions count the non-pad tokens from
    pad_token_id + 1, so left padding and a pad id inside a row move them."""
    prefix, make_config = HF_CONFIGS[family]
    torch.manual_seed(0)
    hf = getattr(transformers, prefix + "Model")(make_config()).eval()
    hf.save_pretrained(tmp_path)
    ours = BERTModel.from_pretrained(tmp_path)
    assert ours.config.position_offset == 2 and ours.config.max_length == 38
    ids, mask = batch(1, left=True)
    ids[0, 7] = 1  # a pad id in a row without padding
    with torch.no_grad():
        expect = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got, unpadded = ours(ids, mask), ours(ids, mask, unpadded=True)
    assert_close(got[mask.bool()], expect[mask.bool()], rtol=1e-5, atol=1e-5)
    assert_close(unpadded[mask.bool()], expect[mask.bool()], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="sequence length 39 exceeds max_position_embeddings \\(40\\) past "
                                         "position_offset 2"):
        ours(torch.full((1, 39), 5))
    clean = torch.arange(3, 23)
    with torch.no_grad():  # two sequences end to end, positions from 2 in each
        packed = ours.forward_packed(torch.cat([clean, clean[:9]]), torch.tensor([0, 20, 29]), 20)
        assert_close(packed[:20], ours(clean[None])[0], rtol=1e-5, atol=1e-5)
        assert_close(packed[20:], ours(clean[None, :9])[0], rtol=1e-5, atol=1e-5)


def test_bert_kits_own_models_of_each_family_load_in_transformers(tmp_path):
    """The other direction: a model bert-kit built (its own init) and saved."""
    for family, prefix, extra in [("roberta", "Roberta", dict(pad_token_id=1, type_vocab_size=1)),
                                  ("xlm-roberta", "XLMRoberta", dict(pad_token_id=1, type_vocab_size=1)),
                                  ("distilbert", "DistilBert", dict(type_vocab_size=0))]:
        config = BertConfig(**SHAPE, max_position_embeddings=40, model_type=family, **extra)
        torch.manual_seed(0)
        ours = BERTForSequenceClassification(config, num_labels=3).eval()
        ours.save_pretrained(tmp_path / family)
        hf = getattr(transformers, prefix + "ForSequenceClassification").from_pretrained(tmp_path / family).eval()
        ids, mask = batch(config.pad_token_id)
        with torch.no_grad():
            assert_close(ours(ids, mask), hf(input_ids=ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-5)
        # a classifier's folder names its outputs (LABEL_i, as transformers writes them)
        assert load_hf_config(tmp_path / family) == dataclasses.replace(config, id2label=ours.id2label)


def test_distilbert_ignores_segment_ids_and_has_no_pooler(tmp_path):
    torch.manual_seed(0)
    transformers.DistilBertModel(HF_CONFIGS["distilbert"][1]()).save_pretrained(tmp_path)
    model = BERTModel.from_pretrained(tmp_path)
    assert model.pooler is None and not hasattr(model.embeddings, "token_type_embeddings")
    ids, mask = batch(0)
    with torch.no_grad():
        assert_close(model(ids, mask, torch.ones_like(ids)), model(ids, mask), rtol=0, atol=0)
    with pytest.raises(ValueError, match="a distilbert encoder has no pooler"):
        model.pool(model(ids, mask))
    with pytest.raises(ValueError, match="next-sentence prediction"):
        BERTForPreTraining(model.config)


def test_a_robertamodel_folders_pooler_is_not_read(tmp_path):
    """HF's RobertaModel keeps a pooler that no head of RoBERTa reads: bert-kit drops it."""
    prefix, make_config = HF_CONFIGS["roberta"]
    transformers.RobertaModel(make_config()).save_pretrained(tmp_path)
    assert any(k.startswith("pooler.") for k in read_state_dict(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BERTModel.from_pretrained(tmp_path)


def test_a_stored_sinusoidal_table_must_be_the_configs(tmp_path):
    from safetensors.torch import load_file, save_file

    transformers.DistilBertModel(HF_CONFIGS["distilbert-sinusoidal"][1]()).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["embeddings.position_embeddings.weight"] += 0.1
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="is not the sinusoidal one of the config"):
        BERTModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", list(HF_CONFIGS))
def test_configs_round_trip_through_transformers(family):
    _, make_config = HF_CONFIGS[family]
    hf = make_config()
    ours = BertConfig.from_hf_dict(hf.to_diff_dict())  # what save_pretrained writes
    assert (ours.hidden_size, ours.num_hidden_layers, ours.intermediate_size) == (32, 2, 37)
    again = transformers.AutoConfig.for_model(**{k: v for k, v in ours.to_hf_dict().items() if k != "architectures"})
    assert type(again) is type(hf)
    for key in ("vocab_size", "max_position_embeddings", "pad_token_id", "initializer_range"):
        assert getattr(again, key) == getattr(hf, key), key
    assert BertConfig.from_hf_dict(ours.to_hf_dict()) == ours


@pytest.mark.parametrize("model_type", ["t5", "gpt2", "llama"])
def test_a_family_bert_kit_does_not_build_is_refused_in_one_line(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "d_model": 32}))
    with pytest.raises(UnsupportedModelError) as info:
        load_hf_config(tmp_path)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ConfigError)
    assert message == (f"{tmp_path / 'config.json'}: model_type {model_type!r} is a model family bert-kit does not "
                       "build; it builds bert, roberta, xlm-roberta, distilbert, modernbert")
