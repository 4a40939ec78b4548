"""Model folders between the JAX engine, bert-kit's PyTorch side and `transformers`: a folder saved
from JAX loads in both with the JAX model's outputs (1e-5); torch-saved folders (safetensors or a
legacy pytorch_model.bin) load into JAX and save back unchanged; mismatches are listed.

Run: .venv/bin/python -m pytest tests/jax/test_weights.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import bert_kit.jax as bj  # noqa: E402
from bert_kit import BERTForPreTraining, BERTForSequenceClassification, BERTModel  # noqa: E402
from bert_kit.checks import CorruptFileError  # noqa: E402
from bert_kit.hf import NewWeightsWarning, to_hf_state_dict  # noqa: E402
from bert_kit.jax.weights import torch_state_dict  # noqa: E402
from tests.jax.common import max_abs, padded_batch, random_model, tiny  # noqa: E402


def test_a_folder_saved_from_jax_loads_in_transformers_and_torch(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = tiny(num_hidden_layers=1)
    pretraining = random_model(bj.BERTForPreTraining, config, seed=1)
    classifier = random_model(bj.BERTForSequenceClassification, config, seed=2, num_labels=3)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(config.vocab_size)) + "\n")
    pretraining.save_pretrained(tmp_path / "pt", tokenizer=tokenizer)
    classifier.save_pretrained(tmp_path / "cls")
    assert (tmp_path / "pt" / "vocab.txt").read_text() == (tokenizer / "vocab.txt").read_text()

    batch = padded_batch(config, [9, 4, 6], 9)

    @nnx.jit
    def outputs(pretraining, classifier, batch):
        hidden = pretraining.bert(**batch)
        mlm, nsp = pretraining(**batch)
        return hidden, pretraining.bert.pool(hidden), mlm, nsp, classifier(**batch)

    hidden, pooled, mlm, nsp, logits = outputs(pretraining, classifier, batch)
    inputs = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        hf_base = transformers.BertModel.from_pretrained(tmp_path / "pt", attn_implementation="eager").eval()(**inputs)
        assert max_abs(hf_base.last_hidden_state, hidden) <= 1e-5
        assert max_abs(hf_base.pooler_output, pooled) <= 1e-5
        hf_mlm = transformers.BertForMaskedLM.from_pretrained(tmp_path / "pt", attn_implementation="eager").eval()
        assert max_abs(hf_mlm(**inputs).logits, mlm) <= 1e-5
        hf_cls = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "cls",
                                                                            attn_implementation="eager").eval()
        assert max_abs(hf_cls(**inputs).logits, logits) <= 1e-5
        ours_mlm, ours_nsp = BERTForPreTraining.from_pretrained(tmp_path / "pt")(**inputs)
        assert max_abs(ours_mlm, mlm) <= 1e-5 and max_abs(ours_nsp, nsp) <= 1e-5
        assert max_abs(BERTForSequenceClassification.from_pretrained(tmp_path / "cls")(**inputs), logits) <= 1e-5


def test_a_torch_folder_round_trips_through_jax(tmp_path):
    torch.manual_seed(0)
    source = BERTForSequenceClassification(tiny(), num_labels=3)
    source.id2label = ["neg", "neutral", "pos"]
    source.save_pretrained(tmp_path / "torch")
    model = bj.BERTForSequenceClassification.from_pretrained(tmp_path / "torch")  # num_labels from the folder
    assert model.num_labels == 3 and model.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    expected = {k: v.numpy() for k, v in source.state_dict().items()}
    got = torch_state_dict(model)
    assert got.keys() == expected.keys()
    assert all(np.array_equal(got[k], expected[k]) for k in expected)

    model.save_pretrained(tmp_path / "jax")
    before = load_file(str(tmp_path / "torch" / "model.safetensors"))
    after = load_file(str(tmp_path / "jax" / "model.safetensors"))
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert json.loads((tmp_path / "jax" / "config.json").read_text()) == \
        json.loads((tmp_path / "torch" / "config.json").read_text())  # the label names too: not LABEL_0, ...


def test_a_legacy_pytorch_model_bin_folder_loads(tmp_path):
    torch.manual_seed(1)
    source = BERTForPreTraining(tiny())
    folder = tmp_path / "legacy"
    folder.mkdir()
    torch.save(to_hf_state_dict(source), folder / "pytorch_model.bin")
    source.config.save(folder)
    got = torch_state_dict(bj.BERTForPreTraining.from_pretrained(folder))
    expected = {k: v.numpy() for k, v in source.state_dict().items() if k != "mlm.decoder.weight"}
    assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in expected)


def test_a_sharded_folder_and_integer_weights(tmp_path):
    """Shards and their index (as HF writes a large model) load as the one file would; a weight of
    integers is refused, as on the torch side, not cast."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(4)
    source = BERTForPreTraining(tiny())
    source.save_pretrained(tmp_path / "whole")
    transformers.BertForPreTraining.from_pretrained(tmp_path / "whole").save_pretrained(tmp_path / "sharded",
                                                                                          max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 2
    got = torch_state_dict(bj.BERTForPreTraining.from_pretrained(tmp_path / "sharded"))
    expected = {k: v.numpy() for k, v in source.state_dict().items() if k != "mlm.decoder.weight"}
    assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in expected)

    state = load_file(str(tmp_path / "whole" / "model.safetensors"))
    state["bert.pooler.dense.bias"] = np.zeros(state["bert.pooler.dense.bias"].shape, np.int32)
    save_file(state, str(tmp_path / "whole" / "model.safetensors"))
    with pytest.raises(CorruptFileError, match="tensor bert.pooler.dense.bias holds int32 values, not floating"):
        bj.BERTForPreTraining.from_pretrained(tmp_path / "whole")


def test_a_new_head_is_drawn_and_strict_refuses_it(tmp_path):
    config = tiny(num_hidden_layers=1)
    torch.manual_seed(2)
    base = BERTModel(config)
    base.save_pretrained(tmp_path / "base")
    with pytest.warns(NewWeightsWarning, match="classifier.bias, classifier.weight are newly initialised"):
        model = bj.BERTForSequenceClassification.from_pretrained(tmp_path / "base", num_labels=4, seed=3)
    got = torch_state_dict(model)
    for name, value in base.state_dict().items():
        assert np.array_equal(got["bert." + name], value.numpy()), name
    weight = got["classifier.weight"]
    assert weight.shape == (4, config.hidden_size) and 0.01 < weight.std() < 0.03  # N(0, 0.02), BERT's init
    with pytest.raises(ValueError, match="missing classifier.weight"):
        bj.BERTForSequenceClassification.from_pretrained(tmp_path / "base", num_labels=4, strict=True)


def test_mismatches_are_listed_together_and_corrupt_files_named(tmp_path):
    torch.manual_seed(3)
    BERTModel(tiny()).save_pretrained(tmp_path / "bad")
    file = tmp_path / "bad" / "model.safetensors"
    tensors = load_file(str(file))
    tensors["embeddings.word_embeddings.weight"] = tensors["embeddings.word_embeddings.weight"][:-1]
    tensors["encoder.layer.0.attention.self.gate.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(file))
    with pytest.raises(ValueError) as error:
        bj.BERTModel.from_pretrained(tmp_path / "bad")
    assert "shape mismatch embeddings.word_embeddings.weight" in str(error.value)
    assert "unexpected encoder.layer.0.attention.self.gate.weight" in str(error.value)
    file.write_bytes(file.read_bytes()[:100])
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        bj.BERTModel.from_pretrained(tmp_path / "bad")


def test_nan_weights_and_an_untied_decoder_are_refused(tmp_path):
    torch.manual_seed(4)
    BERTForPreTraining(tiny()).save_pretrained(tmp_path / "pt")
    file = tmp_path / "pt" / "model.safetensors"
    good = load_file(str(file))
    untied = dict(good, **{"cls.predictions.decoder.weight": good["bert.embeddings.word_embeddings.weight"] + 1.0})
    save_file(untied, str(file))
    with pytest.raises(ValueError, match="MLM decoder .* is not the word embeddings"):
        bj.BERTForMaskedLM.from_pretrained(tmp_path / "pt")
    broken = dict(good)
    broken["bert.encoder.layer.0.output.dense.weight"] = good["bert.encoder.layer.0.output.dense.weight"].copy()
    broken["bert.encoder.layer.0.output.dense.weight"][0, :3] = np.nan
    save_file(broken, str(file))
    with pytest.raises(CorruptFileError, match="tensor bert.encoder.layer.0.output.dense.weight holds 3 NaN"):
        bj.BERTModel.from_pretrained(tmp_path / "pt")


def test_the_twin_trains_with_the_dropout_the_torch_model_was_set_to():
    from bert_kit.model import set_dropout
    from bert_kit.jax.weights import from_torch

    model = BERTForPreTraining(tiny(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    twin = from_torch(model, bj.HEAD_CLASSES[model.hf_architecture])
    assert twin.bert.encoder.layers[0].dropout_rate == model.config.hidden_dropout_prob > 0
    set_dropout(model, 0.0)  # pretraining's `dropout: 0`; the config keeps its rates
    twin = from_torch(model, bj.HEAD_CLASSES[model.hf_architecture])
    assert model.config.hidden_dropout_prob > 0
    assert twin.bert.encoder.layers[0].dropout_rate == 0.0
    assert twin.bert.encoder.layers[0].attention.dropout_rate == 0.0
    assert twin.bert.embeddings.dropout.rate == 0.0


def test_a_family_member_the_jax_engine_does_not_build_is_refused(tmp_path):
    """A RoBERTa encoder has BERT's weight names but other positions: JAX would run it as BERT."""
    from bert_kit import BertConfig

    roberta = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=20, model_type="roberta", pad_token_id=1,
                         type_vocab_size=1)
    BERTModel(roberta).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a roberta model: the JAX engine builds BERT models only"):
        bj.BERTModel.from_pretrained(tmp_path)
