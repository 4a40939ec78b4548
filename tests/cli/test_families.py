"""The commands that take a model take the folders of the BERT family's other members and of
ModernBERT: RoBERTa, XLM-RoBERTa, DistilBERT and ModernBERT folders as transformers writes them
(tiny, random init, with their own tokenizers) through `bert-kit embed`, `evaluate`, `predict`,
`convert` and `models`, with the outputs transformers computes; a family bert-kit does not build
is refused in one line. The jobs that train and serve them: tests/cli/test_family_jobs.py.

Run: .venv/bin/python -m pytest tests/cli/test_families.py -q
"""

import json

import numpy as np
import pytest
import torch

from bert_kit.cli import main
from bert_kit.model_folder import write_model_metadata
from tests.tokenizer_folders import ALL_FOLDERS, SENTENCES

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
CONFIGS = {  # family -> (HF class prefix, config for a vocabulary of n tokens)
    "roberta": ("Roberta", lambda n: transformers.RobertaConfig(vocab_size=n, **SHAPE, max_position_embeddings=66,
                                                                  type_vocab_size=1, pad_token_id=1)),
    "xlm-roberta": ("XLMRoberta", lambda n: transformers.XLMRobertaConfig(vocab_size=n, **SHAPE, type_vocab_size=1,
                                                                          max_position_embeddings=66, pad_token_id=1)),
    "distilbert": ("DistilBert", lambda n: transformers.DistilBertConfig(vocab_size=n, dim=32, n_layers=2, n_heads=4,
                                                                         hidden_dim=37, max_position_embeddings=64)),
    "modernbert": ("ModernBert", lambda n: transformers.ModernBertConfig(
        vocab_size=n, **SHAPE, max_position_embeddings=64, local_attention=8, pad_token_id=3, bos_token_id=1,
        eos_token_id=2, cls_token_id=1, sep_token_id=2)),
}
TEXTS = [s for s in SENTENCES if s.strip() == s and s and "\t" not in s] * 3  # as a line of a file reads back
LABELS = [i % 2 for i in range(len(TEXTS))]


def hf_folder(tmp_path_factory, family: str, role: str, **config_changes):
    """transformers' class `role` of `family`, random init, saved with the family's tokenizer."""
    prefix, make = CONFIGS[family]
    folder = ALL_FOLDERS[family](tmp_path_factory.mktemp(f"{family}-{role}"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    config = make(len(tokenizer))
    for key, value in config_changes.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = getattr(transformers, prefix + role)(config).eval()
    model.save_pretrained(folder)
    return folder, model, tokenizer


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta", "distilbert", "modernbert"])
def encoder(request, tmp_path_factory):
    return request.param, *hf_folder(tmp_path_factory, request.param, "Model")


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta", "distilbert", "modernbert"])
def classifier(request, tmp_path_factory):
    family = request.param
    folder, model, tokenizer = hf_folder(tmp_path_factory, family, "ForSequenceClassification",
                                         id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    write_model_metadata(folder, {"task": "classification", "max_length": 32})
    return family, folder, model, tokenizer


def test_embed_equals_transformers_mean_pooling(encoder, tmp_path):
    family, folder, model, tokenizer = encoder
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "vectors.npy"
    assert main(["embed", "--model", str(folder), "--input", str(texts), "--output", str(out), "--device", "cpu",
                 "--max-length", "24"]) == 0
    enc = tokenizer(TEXTS, padding=True, truncation=True, max_length=24, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    expect = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(np.load(out), expect, rtol=1e-5, atol=1e-5)


def test_evaluate_and_predict_equal_transformers_predictions(classifier, tmp_path):
    family, folder, model, tokenizer = classifier
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(TEXTS, LABELS)))
    enc = tokenizer(TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        probabilities = model(**enc).logits.softmax(-1)
    predicted = probabilities.argmax(-1)

    assert main(["evaluate", "--model", str(folder), "--data", str(dev), "--output", str(tmp_path / "e.json"),
                 "--device", "cpu"]) == 0
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["accuracy"] == pytest.approx((predicted == torch.tensor(LABELS)).float().mean().item(), abs=1e-12)

    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    assert main(["predict", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "p.jsonl"),
                 "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["label_id"] for r in rows] == predicted.tolist()
    assert [r["label"] for r in rows] == [["negative", "positive"][i] for i in predicted.tolist()]
    got = torch.tensor([[r["probabilities"][name] for name in ("negative", "positive")] for r in rows])
    torch.testing.assert_close(got, probabilities, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_convert_keeps_the_mlm_head_and_the_tokenizer(family, tmp_path_factory, tmp_path, capsys):
    folder, model, tokenizer = hf_folder(tmp_path_factory, family, "ForMaskedLM")
    assert main(["convert", "--input", str(folder), "--output", str(tmp_path / "out")]) == 0
    assert f"wrote {tmp_path / 'out'} (mlm model, model.safetensors)" in capsys.readouterr().out
    prefix, _ = CONFIGS[family]
    again = getattr(transformers, prefix + "ForMaskedLM").from_pretrained(tmp_path / "out").eval()
    enc = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(TEXTS, padding=True, return_tensors="pt")
    assert enc["input_ids"].tolist() == tokenizer(TEXTS, padding=True)["input_ids"]
    with torch.no_grad():
        keep = enc["attention_mask"].bool()
        torch.testing.assert_close(again(**enc).logits[keep], model(**enc).logits[keep], rtol=1e-5, atol=1e-5)


def test_models_names_each_local_copys_family(tmp_path, monkeypatch, capsys):
    hub = tmp_path / "hub"
    for name, model_type in [("FacebookAI--roberta-base", "roberta"), ("distilbert--distilbert-base-uncased",
                                                                       "distilbert"),
                             ("answerdotai--ModernBERT-base", "modernbert"), ("google-t5--t5-small", "t5")]:
        snap = hub / f"models--{name}" / "snapshots" / "r1"
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps({"model_type": model_type}))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert main(["models", "--json"]) == 0
    families = {r["name"]: r["family"] for r in json.loads(capsys.readouterr().out)["local_copies"]
                if str(hub) in r["folder"]}  # (and the copies installed packages ship)
    assert families == {"FacebookAI/roberta-base": "roberta", "distilbert/distilbert-base-uncased": "distilbert",
                        "answerdotai/ModernBERT-base": "modernbert", "google-t5/t5-small": "t5: not built by bert-kit"}


@pytest.mark.parametrize("model_type", ["t5", "gpt2"])
def test_a_family_bert_kit_does_not_build_is_refused_in_one_line(model_type, tmp_path, capsys):
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "model.safetensors").write_bytes(b"")
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\n")
    expect = (f"{folder / 'config.json'}: model_type {model_type!r} is a model family bert-kit does not build; "
              "it builds bert, roberta, xlm-roberta, distilbert, modernbert")
    for argv in (["embed", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "v.npy")],
                 ["convert", "--input", str(folder), "--output", str(tmp_path / "out")],
                 ["predict", "--model", str(folder), "--task", "classification", "--input", str(texts),
                  "--output", str(tmp_path / "p.jsonl")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expect in err[0], (argv, err)
