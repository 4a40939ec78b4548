"""HF checkpoint interop: real all-MiniLM-L6-v2 weights, round trips both ways, mismatches.

Run: .venv/bin/python -m pytest tests/test_hf.py -q
"""

import pytest
import torch
from torch.testing import assert_close

from bert_kit import BERTForPreTraining, BERTForSequenceClassification, BERTModel, BertConfig
from bert_kit.hf import read_state_dict, to_hf_state_dict

transformers = pytest.importorskip("transformers")
TINY = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=40)


def sst2_sentences(data_dir, n):
    lines = (data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    return [line.split("\t")[0] for line in lines[:n]]


@pytest.fixture(scope="module")
def hf_tokenizer(minilm_path):
    return transformers.BertTokenizerFast.from_pretrained(minilm_path)


def test_minilm_hidden_states_match_transformers(minilm_path, hf_tokenizer, data_dir):
    texts = sst2_sentences(data_dir, 48)
    enc = hf_tokenizer(texts, padding=True, return_tensors="pt")
    ours = BERTModel.from_pretrained(minilm_path)
    ref = transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        expect = ref(**enc).last_hidden_state
        unpadded = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], unpadded=True)
    keep = enc["attention_mask"].bool()
    assert_close(hidden[keep], expect[keep], rtol=1e-5, atol=1e-5)
    assert_close(unpadded[keep], expect[keep], rtol=1e-5, atol=1e-5)
    assert_close(ours.pool(hidden), ref.pooler(expect), rtol=1e-5, atol=1e-5)


def test_minilm_embeddings_match_sentence_transformers(minilm_path, hf_tokenizer, data_dir):
    st = pytest.importorskip("sentence_transformers")
    texts = sst2_sentences(data_dir, 32)
    expect = st.SentenceTransformer(str(minilm_path), device="cpu").encode(texts, convert_to_tensor=True)
    model = BERTModel.from_pretrained(minilm_path)
    enc = hf_tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    mask = enc["attention_mask"][..., None].float()
    mean = (hidden * mask).sum(1) / mask.sum(1)
    assert_close(torch.nn.functional.normalize(mean, dim=-1), expect, rtol=1e-5, atol=1e-5)


def test_round_trip_through_transformers_and_back(tmp_path):
    torch.manual_seed(0)
    model = BERTForPreTraining(TINY).eval()
    model.save_pretrained(tmp_path / "ours")
    assert not (tmp_path / "ours" / "pytorch_model.bin").exists()  # safetensors only
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours").eval()
    ids = torch.randint(1, 120, (2, 12))
    with torch.no_grad():
        assert_close(hf(ids).prediction_logits, model(ids)[0], rtol=1e-5, atol=1e-5)
    hf.save_pretrained(tmp_path / "hf")  # and back: transformers' own folder into bert-kit
    back = BERTForPreTraining.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        assert_close(back(ids)[0], model(ids)[0], rtol=0, atol=0)
        assert_close(back(ids)[1], model(ids)[1], rtol=0, atol=0)


def test_pytorch_model_bin_and_legacy_names(tmp_path):
    torch.manual_seed(1)
    model = BERTModel(TINY).eval()
    state = {("bert." + k).replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in to_hf_state_dict(model).items()}
    state["bert.embeddings.position_ids"] = torch.arange(40)[None]
    TINY.save(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = BERTModel.from_pretrained(tmp_path)
    ids = torch.randint(1, 120, (2, 12))
    with torch.no_grad():
        assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_fine_tuning_head_on_pretrained_encoder(minilm_path):
    model = BERTForSequenceClassification.from_pretrained(minilm_path, num_labels=3)
    encoder = BERTModel.from_pretrained(minilm_path)
    assert_close(model.bert.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight)
    assert model.classifier.weight.shape == (3, 384)


def test_saved_classifier_reloads_with_its_num_labels(tmp_path):
    model = BERTForSequenceClassification(TINY, num_labels=5)
    model.save_pretrained(tmp_path)
    assert BERTForSequenceClassification.from_pretrained(tmp_path).num_labels == 5
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    assert hf.config.num_labels == 5


def test_mismatched_checkpoint_lists_keys_and_shapes(tmp_path):
    BERTModel(TINY).save_pretrained(tmp_path / "a")
    bigger = BertConfig(**{**TINY.to_dict(), "intermediate_size": 80})
    state = read_state_dict(tmp_path / "a")
    del state["encoder.layer.1.output.dense.bias"]
    state["encoder.layer.0.extra.weight"] = torch.zeros(2)
    from safetensors.torch import save_file

    bigger.save(tmp_path / "b")
    save_file(state, str(tmp_path / "b" / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        BERTModel.from_pretrained(tmp_path / "b")
    msg = str(err.value)
    assert "shape mismatch bert" not in msg  # base model: no prefix
    assert "shape mismatch encoder.layers.0.ffn.up.weight: checkpoint (64, 32), model (80, 32)" in msg
    assert "missing encoder.layers.1.ffn.down.bias (32,)" in msg
    assert "unexpected encoder.layer.0.extra.weight" in msg


def test_missing_folder_and_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        BERTModel.from_pretrained(tmp_path)
    TINY.save(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        BERTModel.from_pretrained(tmp_path)
