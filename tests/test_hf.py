"""HF checkpoint interop: real all-MiniLM-L6-v2 weights, round trips both ways, mismatches;
what loading refuses (NaN weights, decoders, untied MLM decoders) and what it warns about
(weights it initialises).

Run: .venv/bin/python -m pytest tests/test_hf.py -q
"""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from bert_kit import (BERTForMaskedLM, BERTForPreTraining, BERTForQuestionAnswering, BERTForSequenceClassification,
                      BERTForTokenClassification, BERTModel, BertConfig)
from bert_kit.checks import ConfigError, CorruptFileError
from bert_kit.hf import NewWeightsWarning, load_into, to_hf_state_dict
from bert_kit.weight_files import read_state_dict

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


def test_read_state_dict_as_numpy_gives_the_same_weights_without_torch_for_safetensors(tmp_path):
    """The JAX engine's reading (`as_numpy`): the same names and values as torch tensors, a
    bfloat16 pytorch_model.bin as float32, the same errors; safetensors read without importing torch."""
    import subprocess
    import sys

    import numpy as np

    torch.manual_seed(5)
    BERTModel(TINY).save_pretrained(tmp_path / "st")
    (tmp_path / "bin").mkdir()
    TINY.save(tmp_path / "bin")
    state = {k: v.to(torch.bfloat16) for k, v in read_state_dict(tmp_path / "st").items()}
    state["embeddings.position_ids"] = torch.arange(40)[None]
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bf16").mkdir()  # a bfloat16 model.safetensors: NumPy has no such type (it failed)
    TINY.save(tmp_path / "bf16")
    save_file({k: v for k, v in state.items() if k != "embeddings.position_ids"}, tmp_path / "bf16" / "model.safetensors")
    for folder, dtype in (("st", torch.float32), ("bin", torch.bfloat16), ("bf16", torch.bfloat16)):
        tensors, arrays = read_state_dict(tmp_path / folder), read_state_dict(tmp_path / folder, as_numpy=True)
        assert tensors.keys() == arrays.keys() and all(isinstance(a, np.ndarray) for a in arrays.values())
        assert tensors["embeddings.word_embeddings.weight"].dtype == dtype
        for name, tensor in tensors.items():
            expected = tensor.float() if tensor.is_floating_point() else tensor
            assert_close(torch.from_numpy(arrays[name]), expected, rtol=0, atol=0)

    code = ("import sys; from bert_kit.weight_files import read_state_dict; "
            f"arrays = read_state_dict({str(tmp_path / 'st')!r}, as_numpy=True); "
            "assert arrays and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)
    # with ml_dtypes loaded (JAX loads it) NumPy reads bfloat16 itself: float32 all the same
    code = ("import ml_dtypes; from bert_kit.weight_files import read_state_dict; "
            f"arrays = read_state_dict({str(tmp_path / 'bf16')!r}, as_numpy=True); "
            "assert {str(a.dtype) for a in arrays.values()} == {'float32'}, {str(a.dtype) for a in arrays.values()}")
    if __import__("importlib").util.find_spec("ml_dtypes"):
        subprocess.run([sys.executable, "-c", code], check=True)

    file = tmp_path / "st" / "model.safetensors"
    file.write_bytes(file.read_bytes()[:100])
    for as_numpy in (False, True):
        with pytest.raises(CorruptFileError, match=rf"^{file} is not a readable safetensors file \(.*\): it is "
                                                   "truncated or corrupt; copy or save the model again$"):
            read_state_dict(tmp_path / "st", as_numpy=as_numpy)


def test_fine_tuning_head_on_pretrained_encoder(minilm_path):
    with pytest.warns(NewWeightsWarning, match="classifier.bias, classifier.weight are newly initialised"):
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


@pytest.mark.parametrize("cls", [BERTForSequenceClassification, BERTForTokenClassification, BERTForQuestionAnswering,
                                 BERTForMaskedLM, BERTForPreTraining])
def test_only_the_new_weights_are_drawn_and_they_get_berts_init(tmp_path, cls):
    """Loading draws no random numbers for the weights it overwrites: the generator moves exactly
    as far as drawing the new head does, and the head has BERT's init (linear weights N(0, 0.02),
    biases 0, LayerNorm 1/0); everything else equals the folder's weights."""
    config = BertConfig(**{**TINY.to_dict(), "hidden_size": 64, "intermediate_size": 128})
    BERTModel(config).save_pretrained(tmp_path)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewWeightsWarning)
        model = cls.from_pretrained(tmp_path)
    after_load = torch.get_rng_state()
    params = dict(model.named_parameters())
    new = sorted(k for k in model.state_dict() if not k.startswith("bert.") and k != "mlm.decoder.weight")
    torch.manual_seed(0)
    for name in new:  # the draws `initialise` makes, in its order
        if name.endswith("weight") and params[name].dim() == 2:
            torch.empty_like(params[name]).normal_(0.0, 0.02)
    assert torch.equal(after_load, torch.get_rng_state())
    for name in new:
        value = params[name].detach()
        assert torch.isfinite(value).all(), name
        if name.endswith("weight") and value.dim() == 2:
            assert abs(value.std().item() - 0.02) < 0.005, name
        elif "LayerNorm" in name or name.endswith("norm.weight"):
            assert torch.equal(value, torch.ones_like(value) if name.endswith("weight") else torch.zeros_like(value))
        else:
            assert torch.equal(value, torch.zeros_like(value)), name
    folder = read_state_dict(tmp_path)
    own = to_hf_state_dict(model.bert if hasattr(model, "bert") else model)
    for name, value in folder.items():
        assert torch.equal(own[name], value), name


# ---- what loading warns about, and refuses ------------------------------------------------------

@pytest.mark.parametrize("cls", [BERTForSequenceClassification, BERTForTokenClassification, BERTForQuestionAnswering,
                                 BERTForMaskedLM, BERTForPreTraining])
def test_from_pretrained_warns_about_every_weight_it_initialises(tmp_path, cls):
    """A head class on a folder without that head's weights came back with a random head and no
    word (the CLI refuses such folders): one warning line names every weight the folder lacks."""
    BERTModel(TINY).save_pretrained(tmp_path)  # an encoder: no head weights
    with pytest.warns(NewWeightsWarning) as caught:
        model = cls.from_pretrained(tmp_path)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    new = [k for k in model.state_dict() if not k.startswith("bert.") and k != "mlm.decoder.weight"]  # tied
    assert len(new) >= 2
    message = str(caught[0].message)
    assert message.startswith(f"{cls.__name__}: ") and f"(not in {tmp_path}): train them before use" in message
    assert sorted(message.split(": ")[1].split(" are ")[0].split(", ")) == sorted(new)
    assert caught[0].filename == __file__  # it points at the caller's line
    model.save_pretrained(tmp_path / "with_head")  # a folder that holds the head: nothing to say
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls.from_pretrained(tmp_path / "with_head")
        BERTModel.from_pretrained(tmp_path / "with_head")  # weights of other heads are not new ones


def hf_config_with(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("key, value", [("is_decoder", True), ("add_cross_attention", True),
                                        ("position_embedding_type", "relative_key"),
                                        ("position_embedding_type", "relative_key_query")])
def test_configs_of_models_bert_kit_does_not_build_are_refused(tmp_path, key, value):
    """is_decoder and add_cross_attention in config.json were dropped: a decoder loaded as an encoder."""
    BERTModel(TINY).save_pretrained(tmp_path)
    hf_config_with(tmp_path, **{key: value})
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'config.json'}: {key}: {json.dumps(value)} makes .*"
                                          "bert-kit does not implement: it builds BERT encoders only"):
        BERTModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh", "silu", "quick_gelu"])
def test_activations_other_than_exact_gelu_and_relu_are_refused(tmp_path, act):
    BERTModel(TINY).save_pretrained(tmp_path)
    hf_config_with(tmp_path, hidden_act=act)
    with pytest.raises(ConfigError, match=rf"config.json: hidden_act '{act}' is not supported"):
        BERTModel.from_pretrained(tmp_path)


def test_hf_settings_that_give_the_same_outputs_are_accepted(tmp_path):
    """gelu_python is HF's exact GELU under another name; chunk_size_feed_forward only splits the
    feed-forward over the sequence: transformers' outputs equal ours."""
    hf_config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=40, hidden_act="gelu_python",
                                        chunk_size_feed_forward=3, is_decoder=False)
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config).eval()
    hf.save_pretrained(tmp_path)
    ours = BERTModel.from_pretrained(tmp_path)
    ids = torch.randint(1, 120, (2, 12))  # 4 chunks of 3 positions
    with torch.no_grad():
        assert_close(ours(ids), hf(ids).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_an_mlm_decoder_that_is_not_the_word_embeddings_is_refused(tmp_path):
    """bert-kit ties the MLM decoder to the word embeddings; a checkpoint with its own decoder
    (tie_word_embeddings: false) would predict differently."""
    BERTForMaskedLM(TINY).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"] + 0.5
    save_file(state, str(tmp_path / "model.safetensors"))
    hf_config_with(tmp_path, tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"decoder \(cls.predictions.decoder.weight\) is not the word embeddings"):
        BERTForMaskedLM.from_pretrained(tmp_path)
    BERTModel.from_pretrained(tmp_path)  # the encoder alone is what the folder says it is
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
    save_file(state, str(tmp_path / "model.safetensors"))
    BERTForMaskedLM.from_pretrained(tmp_path)  # a decoder stored equal to the embeddings is tied


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_an_error_naming_the_file_and_tensor(tmp_path, bad):
    """NaN weights gave NaN probabilities (invalid JSON) and NaN embeddings with exit 0."""
    BERTForMaskedLM(TINY).save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    state = load_file(file)
    state["bert.encoder.layer.1.output.dense.weight"][3, 5] = bad
    save_file(state, str(file))
    message = rf"^{file}: tensor bert.encoder.layer.1.output.dense.weight holds 1 NaN or infinite value\(s\) of 2048"
    with pytest.raises(CorruptFileError, match=message):
        read_state_dict(tmp_path)
    with pytest.raises(CorruptFileError, match=message):
        BERTForMaskedLM.from_pretrained(tmp_path)
    torch.save(state, tmp_path / "pytorch_model.bin")  # the legacy format too
    file.unlink()
    with pytest.raises(CorruptFileError, match=f"^{tmp_path / 'pytorch_model.bin'}: tensor bert.encoder"):
        BERTModel.from_pretrained(tmp_path)
    with pytest.raises(CorruptFileError, match="^mine: tensor bert.encoder.layer.1.output.dense.weight"):
        load_into(BERTModel(TINY), dict(state), source="mine")  # tensors from anywhere else


def test_large_half_precision_weights_are_not_mistaken_for_non_finite(tmp_path):
    """The check sums each tensor; a float16 sum can overflow where every value is finite."""
    model = BERTModel(TINY).half()
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.fill_(60000.0)  # finite, but 120 x 32 of them sum past 65504
    model.save_pretrained(tmp_path)
    loaded = BERTModel.from_pretrained(tmp_path, dtype=torch.float16)
    assert loaded.embeddings.word_embeddings.weight.dtype == torch.float16


def test_integer_weights_are_refused_naming_the_tensor(tmp_path):
    """An int32 tensor was cast to float silently by from_pretrained and convert (the codes of a
    quantized checkpoint read as weights); every BERT weight is floating point."""
    from bert_kit.cli import main

    BERTForMaskedLM(TINY).save_pretrained(tmp_path / "model")
    file = tmp_path / "model" / "model.safetensors"
    state = load_file(file)
    state["bert.encoder.layer.0.attention.self.query.weight"] = torch.ones(32, 32, dtype=torch.int32)
    state["bert.embeddings.position_ids"] = torch.arange(40)[None]  # an integer buffer HF stores: fine
    save_file(state, str(file))
    message = rf"^{file}: tensor bert.encoder.layer.0.attention.self.query.weight holds int32 values, not floating"
    with pytest.raises(CorruptFileError, match=message):
        BERTForMaskedLM.from_pretrained(tmp_path / "model")
    with pytest.raises(CorruptFileError, match="^mine: tensor bert.encoder.layer.0.attention.self.query.weight holds"):
        load_into(BERTForMaskedLM(TINY), dict(state), source="mine")
    assert main(["convert", "--input", str(tmp_path / "model"), "--output", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_sharded_checkpoint_loads_as_the_whole_one(tmp_path, capsys):
    """HF writes a large model as shards and model.safetensors.index.json: from_pretrained, convert
    and every command read it as the one file (it was 'no model.safetensors')."""
    from bert_kit.cli import main
    from bert_kit.weight_files import read_state_dict

    torch.manual_seed(2)
    model = BERTForPreTraining(TINY).eval()
    model.save_pretrained(tmp_path / "whole")
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "whole")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    whole, sharded = read_state_dict(tmp_path / "whole"), read_state_dict(tmp_path / "sharded")
    assert set(sharded) >= set(whole)
    for key in whole:
        assert_close(sharded[key], whole[key], rtol=0, atol=0)
    ids = torch.randint(1, 120, (2, 12))
    with torch.no_grad():
        assert_close(BERTForPreTraining.from_pretrained(tmp_path / "sharded")(ids)[0], model(ids)[0], rtol=0, atol=0)
    assert main(["convert", "--input", str(tmp_path / "sharded"), "--output", str(tmp_path / "converted")]) == 0
    with torch.no_grad():
        assert_close(BERTForPreTraining.from_pretrained(tmp_path / "converted")(ids)[0], model(ids)[0], rtol=0,
                     atol=0)

    (tmp_path / "sharded" / shards[1]).unlink()  # a shard left behind when copying
    with pytest.raises(FileNotFoundError, match=rf"model.safetensors.index.json names the shard {shards[1]}, which "
                                                "is not in"):
        BERTModel.from_pretrained(tmp_path / "sharded")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {k: "../whole/model.safetensors" for k in data["weight_map"]}
    index.write_text(json.dumps(data))
    with pytest.raises(CorruptFileError, match=r"shard '../whole/model.safetensors' is not a .safetensors file "
                                               "beside it"):
        BERTModel.from_pretrained(tmp_path / "sharded")


def test_a_shard_short_of_a_tensor_its_index_names(tmp_path):
    torch.manual_seed(3)
    transformers.BertModel(transformers.BertConfig(**{k: v for k, v in TINY.to_hf_dict().items()})).save_pretrained(
        tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["encoder.layer.9.output.dense.weight"] = next(iter(index["weight_map"].values()))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CorruptFileError, match=r"names 1 tensor\(s\) its shards do not hold \(first "
                                               r"encoder.layer.9.output.dense.weight"):
        BERTModel.from_pretrained(tmp_path)


def test_label_names_load_and_round_trip(tmp_path):
    """A loaded classifier has its label names (config.id2label, as in transformers), and saving it
    again keeps them (it wrote LABEL_0, LABEL_1); names that do not fit the head are dropped."""
    model = BERTForSequenceClassification(TINY, num_labels=2)
    model.id2label = {"0": "neg", "1": "pos"}
    model.save_pretrained(tmp_path / "a")
    loaded = BERTForSequenceClassification.from_pretrained(tmp_path / "a")
    assert loaded.config.id2label == loaded.id2label == {0: "neg", 1: "pos"}
    assert loaded.config.label2id == {"neg": 0, "pos": 1}
    loaded.save_pretrained(tmp_path / "b")
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}
    assert transformers.BertForSequenceClassification.from_pretrained(tmp_path / "b").config.id2label == \
        {0: "neg", 1: "pos"}
    # an encoder saved by transformers names two LABEL_i: a new 3-class head on it gets LABEL_0..2
    transformers.BertModel(transformers.BertConfig(**{k: v for k, v in TINY.to_hf_dict().items()
                                                      if k != "architectures"})).save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewWeightsWarning)
        head = BERTForSequenceClassification.from_pretrained(tmp_path / "hf", num_labels=3)
    assert head.config.id2label is None and list(head.id2label.values()) == ["LABEL_0", "LABEL_1", "LABEL_2"]
    with pytest.raises(ValueError, match=r"id2label names 3 labels \['a', 'b', 'c'\] but the head has 2 outputs"):
        loaded.id2label = ["a", "b", "c"]
    with pytest.raises(ConfigError, match=r"id2label must number the outputs 0\.\.1, got ids \[0, 2\]"):
        BertConfig(id2label={"0": "a", "2": "b"})


@pytest.mark.parametrize("id2label, needle", [({"a": "neg", "1": "pos"}, "id2label: 'a': 'neg' is not an output id"),
                                              ({"0": "neg", "2": "pos"}, "id2label must number the outputs 0..1"),
                                              (["neg", "pos"], None)])
def test_an_id2label_that_names_no_outputs_is_a_corrupt_config(tmp_path, id2label, needle):
    """Keys that are no output ids gave "invalid literal for int() with base 10: 'a'"."""
    from bert_kit.model_folder import read_model_metadata

    model = BERTForSequenceClassification(TINY, num_labels=2)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = id2label
    (tmp_path / "config.json").write_text(json.dumps(config))
    if needle is None:  # a list of names, as some tools write it, is read too
        assert read_model_metadata(tmp_path)["label_names"] == ["neg", "pos"]
        assert BERTForSequenceClassification.from_pretrained(tmp_path).config.id2label == {0: "neg", 1: "pos"}
        return
    for load in (read_model_metadata, BERTForSequenceClassification.from_pretrained):
        with pytest.raises(CorruptFileError, match=f"{tmp_path / 'config.json'}.*{needle}"):
            load(tmp_path)


def test_undrawn_init_skips_the_draws_of_its_own_thread_only():
    """`bert-kit embed` loads its model in a thread: the loader replaced torch's initialisers for
    every thread, so a model built meanwhile elsewhere held uninitialised memory, and two loads at
    once could leave the no-ops in place for good (a test run's later models all NaN)."""
    import threading

    import torch.nn.init as init

    from bert_kit.hf import undrawn_init

    own, inside, done = init.normal_, threading.Event(), threading.Event()

    def loader() -> None:
        with undrawn_init():
            inside.set()
            done.wait(30)

    thread = threading.Thread(target=loader)
    thread.start()
    inside.wait(30)
    weight = torch.full((64, 64), float("nan"))
    init.normal_(weight)  # another thread draws as ever
    assert torch.isfinite(weight).all() and weight.std() > 0.5
    with undrawn_init():  # overlapping blocks, ending in the other order
        kept = torch.full((3,), 7.0)
        init.normal_(kept)
        assert kept.tolist() == [7.0, 7.0, 7.0]
        done.set()
        thread.join()
    assert init.normal_ is own  # the last block to end put torch's own back
