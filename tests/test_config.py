"""BertConfig: presets, validation messages, YAML and HF config.json round trips.

Run: .venv/bin/python -m pytest tests/test_config.py -q
"""

import json
import subprocess
import sys

import pytest

from bert_kit.config import PRESETS, BertConfig, create_model_config, load_hf_config


def test_presets_have_documented_sizes():
    expect = {"bert-tiny": (2, 128, 2), "bert-mini": (4, 256, 4), "bert-small": (4, 512, 8),
              "bert-medium": (8, 512, 8), "bert-base-uncased (110M)": (12, 768, 12),
              "bert-large-uncased (340M)": (24, 1024, 16), "bert-teaching": (4, 256, 4)}
    for name, (layers, hidden, heads) in expect.items():
        c = create_model_config(name)
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
        assert c.intermediate_size == 4 * hidden and c.layer_norm_eps == 1e-12
    assert create_model_config("bert-tiny", vocab_size=1000).vocab_size == 1000


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="bert-tiny"):
        create_model_config("bert-huge")


def test_validation_names_both_numbers():
    with pytest.raises(ValueError, match=r"hidden_size \(100\).*num_attention_heads \(12\)"):
        BertConfig(hidden_size=100, num_attention_heads=12)
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig(hidden_act="swish")
    with pytest.raises(ValueError, match="vocab_size"):
        BertConfig(vocab_size=0)
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig(position_embedding_type="rotary")


def test_yaml_round_trip_and_bad_key(tmp_path):
    c = create_model_config("bert-mini", hidden_act="relu", position_embedding_type="sinusoidal")
    path = c.save(tmp_path / "model.yaml")
    assert BertConfig.from_file(path) == c
    (tmp_path / "bad.yaml").write_text("hidden_size: 64\nnum_layers: 3\n")
    with pytest.raises(ValueError, match=r"bad.yaml.*num_layers.*valid keys.*num_hidden_layers"):
        BertConfig.from_file(tmp_path / "bad.yaml")
    (tmp_path / "preset.yaml").write_text("preset: bert-tiny\nvocab_size: 500\n")
    assert BertConfig.from_file(tmp_path / "preset.yaml").vocab_size == 500
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        BertConfig.from_file(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("hidden_size: [1,\n")
    with pytest.raises(ValueError, match="broken.yaml.*invalid YAML"):
        BertConfig.from_file(tmp_path / "broken.yaml")


def test_model_yaml_is_read_as_run_configs_are(tmp_path):
    """A model YAML took the last of two equal keys, expanded alias bombs and read YAML 1.1 numbers."""
    (tmp_path / "twice.yaml").write_text("hidden_size: 64\nnum_attention_heads: 2\nhidden_size: 128\n")
    with pytest.raises(ValueError, match=r"twice.yaml:3: duplicate key 'hidden_size' \(first on line 1\)"):
        BertConfig.from_file(tmp_path / "twice.yaml")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    (tmp_path / "bomb.yaml").write_text(bomb)
    with pytest.raises(ValueError, match=r"bomb.yaml:\d+: the alias \*\w+ expands this YAML past"):
        BertConfig.from_file(tmp_path / "bomb.yaml")
    (tmp_path / "decimal.yaml").write_text("preset: bert-tiny\nvocab_size: 0500\n")  # YAML 1.1: octal 320
    assert BertConfig.from_file(tmp_path / "decimal.yaml").vocab_size == 500


def test_hf_config_json_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    c = create_model_config("bert-small", vocab_size=1234)
    c.save(tmp_path)
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.vocab_size) == (512, 4, 1234)
    assert hf.position_embedding_type == "absolute"
    hf.save_pretrained(tmp_path / "hf")
    assert load_hf_config(tmp_path / "hf") == c
    sin = create_model_config("bert-tiny", position_embedding_type="sinusoidal")
    sin.save(tmp_path / "sin")
    assert load_hf_config(tmp_path / "sin").position_embedding_type == "sinusoidal"


def test_real_minilm_config(minilm_path):
    c = load_hf_config(minilm_path)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (6, 384, 12, 1536)
    assert json.loads((minilm_path / "config.json").read_text())["position_embedding_type"] == "absolute"


def test_config_imports_without_torch():
    code = "import sys; import bert_kit.config as c; c.create_model_config('bert-tiny'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("preset", ["bert-tiny", "modernbert-tiny"])
def test_both_configs_write_and_check_label_names_and_keys_alike(tmp_path, preset):
    """What BertConfig and ModernBertConfig share (`config_base.ConfigBase`): label names keyed by
    text with label2id beside them in config.json and none without names, read back equal; an
    unknown key named with the source; heads that do not divide the width, a pad id past the
    vocabulary and bad label ids refused with the same messages."""
    from bert_kit.config import config_from_name

    c = config_from_name(preset, id2label=["neg", "pos"])
    assert c.id2label == {0: "neg", 1: "pos"} and c.label2id == {"neg": 0, "pos": 1}
    written = json.loads(c.save(tmp_path / "labels").read_text())
    assert (written["id2label"], written["label2id"]) == ({"0": "neg", "1": "pos"}, {"neg": 0, "pos": 1})
    assert load_hf_config(tmp_path / "labels") == c
    plain = json.loads(config_from_name(preset).save(tmp_path / "plain").read_text())
    assert "id2label" not in plain and "label2id" not in plain and "id2label" not in config_from_name(preset).to_dict()
    with pytest.raises(ValueError, match=rf"preset '{preset}': unknown config key\(s\) \['hidden'\]; valid keys:"):
        config_from_name(preset, hidden=64)
    with pytest.raises(ValueError, match=r"hidden_size \(64\) must be divisible by num_attention_heads \(3\)"):
        config_from_name(preset, hidden_size=64, num_attention_heads=3)
    with pytest.raises(ValueError, match=r"pad_token_id=600 is out of range: expected an integer in \[0, vocab_size="):
        config_from_name(preset, vocab_size=512, pad_token_id=600)
    with pytest.raises(ValueError, match=r"id2label must number the outputs 0..1, got ids \[0, 2\]"):
        config_from_name(preset, id2label={0: "a", 2: "b"})
    # YAML reads 1e-5 (no dot) as text: a number in text is a number for both (ModernBERT refused it)
    eps = "layer_norm_eps" if preset.startswith("bert") else "norm_eps"
    texts = config_from_name(preset, **{eps: "1e-5", "num_hidden_layers": "2"})
    assert getattr(texts, eps) == 1e-5 and texts.num_hidden_layers == 2 and isinstance(texts.num_hidden_layers, int)


def test_preset_aliases_point_to_same_sizes():
    assert PRESETS["bert-base"] == PRESETS["bert-base-uncased (110M)"]


def test_a_model_too_large_to_build_is_refused_first():
    """model.num_hidden_layers=99999999999 passed every check and was killed for memory when built."""
    with pytest.raises(ValueError, match=r"describe a 7.09e\+17-parameter encoder \(num_hidden_layers=99999999999, "
                                         r".*at most 2e10 parameters: check those sizes"):
        BertConfig(num_hidden_layers=99_999_999_999)
    assert create_model_config("bert-large-uncased (340M)").num_parameters() < 4e8  # the real ones pass
    BertConfig(hidden_size=8192, num_attention_heads=64, intermediate_size=32768, num_hidden_layers=24)  # 19.6B
