"""Weight exchange of the NumPy engine in the HF format: exact round trips in both dtypes, the
config.json keys, base <-> pretraining checkpoints, sinusoidal positions and clear errors.
(Loading into and from ``transformers`` is covered in test_torch_parity.py.)

Run: .venv/bin/python -m pytest tests/numpy_ref/test_checkpoint.py -q
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_kit.numpy_ref import BertBaseModel, BertModel, hf_name_map

ARGS = (30, 16, 4, 32, 2, 12)  # vocab, hidden, heads, ff, layers, max_seq_len


def forward(model, seed: int = 0):
    ids = np.random.default_rng(seed).integers(4, 30, (2, 9))
    if isinstance(model, BertModel):
        return model.forward(ids, None, np.array([[1, 3], [2, -1]]))
    return (model.forward(ids),)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_is_exact(tmp_path, dtype):
    model = BertModel(*ARGS, dtype=dtype, seed=1, activation="relu")
    model.save_pretrained(tmp_path)
    loaded = BertModel.from_pretrained(tmp_path, dtype=dtype)
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert b.dtype == dtype
        np.testing.assert_array_equal(a, b, err_msg=name)
    for a, b in zip(forward(model), forward(loaded)):
        np.testing.assert_array_equal(a, b)
    # The tie survives loading: the decoder still reads the embedding table.
    assert loaded.mlm_head.decoder_weight is loaded.bert.embeddings.word_embeddings.params["weight"]


def test_files_use_hf_names_and_keys(tmp_path):
    model = BertModel(*ARGS, dtype=np.float64)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "bert"
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size", "hidden_act", "max_position_embeddings",
                                   "type_vocab_size", "layer_norm_eps")} == {
        "vocab_size": 30, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 32, "hidden_act": "gelu", "max_position_embeddings": 12,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert set(tensors) == set(hf_name_map(2, pretraining=True).values())
    assert "bert.encoder.layer.1.attention.output.LayerNorm.weight" in tensors
    assert "cls.predictions.decoder.weight" not in tensors  # tied: stored once
    assert tensors["bert.encoder.layer.0.intermediate.dense.weight"].shape == (32, 16)  # (out, in)
    assert tensors["cls.seq_relationship.bias"].dtype == np.float64


def test_base_and_pretraining_checkpoints_cross_load(tmp_path):
    model = BertModel(*ARGS, dtype=np.float64, seed=2)
    model.save_pretrained(tmp_path / "pretraining")
    base = BertBaseModel.from_pretrained(tmp_path / "pretraining", dtype=np.float64)  # heads ignored
    for (name, a), (_, b) in zip(model.bert.named_parameters(), base.named_parameters()):
        np.testing.assert_array_equal(a, b, err_msg=name)

    base.save_pretrained(tmp_path / "base")
    assert "embeddings.word_embeddings.weight" in load_file(str(tmp_path / "base" / "model.safetensors"))
    with pytest.raises(KeyError, match=r"missing tensors \['cls.predictions.transform.dense.weight'"):
        BertModel.from_pretrained(tmp_path / "base")
    partial = BertModel.from_pretrained(tmp_path / "base", dtype=np.float64, strict=False)
    np.testing.assert_array_equal(partial.bert.forward(np.array([[1, 5, 2]])), base.forward(np.array([[1, 5, 2]])))


def test_sinusoidal_positions_round_trip(tmp_path):
    model = BertBaseModel(*ARGS, position_embedding="sinusoidal", dtype=np.float64)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["position_embedding_type"] == "sinusoidal"
    tensors = load_file(str(tmp_path / "model.safetensors"))
    np.testing.assert_array_equal(tensors["embeddings.position_embeddings.weight"],
                                  model.embeddings.position_table())  # written so HF can load it
    loaded = BertBaseModel.from_pretrained(tmp_path, dtype=np.float64)
    assert loaded.embeddings.position_embedding == "sinusoidal"
    np.testing.assert_array_equal(forward(loaded)[0], forward(model)[0])


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json in"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    model = BertModel(*ARGS)
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError, match="no model.safetensors in"):
        BertModel.from_pretrained(tmp_path)

    tensors = load_file(str(tmp_path / "other.safetensors"))
    tensors["bert.pooler.dense.weight"] = np.zeros((16, 15), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"bert.pooler.dense.weight has shape \(16, 15\), model expects \(16, 16\)"):
        BertModel.from_pretrained(tmp_path)
    del tensors["bert.pooler.dense.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match=r"missing tensors \['bert.pooler.dense.weight'\]"):
        BertModel.from_pretrained(tmp_path, strict=False)  # only heads may be missing

    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"hidden_act": "gelu_new"}))
    with pytest.raises(ValueError, match="hidden_act 'gelu_new' is not supported"):
        BertModel.from_pretrained(tmp_path)
    del config["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing keys \['hidden_size'\]"):
        BertModel.from_pretrained(tmp_path)
