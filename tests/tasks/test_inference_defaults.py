"""Inference commands take their defaults from the model and write where the user says:
max_length is the model's own (fine-tuning length, else its positions), outputs go to --output
or the working directory (never into the model folder), blank input lines are flagged, and the
printed precision reason speaks of inference.

Run: .venv/bin/python -m pytest tests/tasks/test_inference_defaults.py -q
"""

import json

import numpy as np
import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.model_folder import write_model_metadata

WORDS = "the a cat dog sat ran on mat rug and is good bad very film".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config(positions):
    return BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=positions)


def save(folder, model, **meta):
    model.eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    if meta:
        write_model_metadata(folder, meta)
    return folder


@pytest.fixture
def classifier(tmp_path):
    torch.manual_seed(0)
    model = BERTForSequenceClassification(tiny_config(64), num_labels=2)
    model.id2label = {"0": "negative", "1": "positive"}
    return save(tmp_path / "clf", model, task="classification", max_length=24)


def test_evaluate_writes_to_the_working_directory_not_the_model(classifier, tmp_path, monkeypatch, capsys):
    data = tmp_path / "reviews.tsv"
    data.write_text("sentence\tlabel\nthe film is good\tpositive\na very bad film\tnegative\nthe cat sat\tpositive\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p.name for p in classifier.iterdir())
    assert cli_main(["evaluate", "--model", str(classifier), "--data", str(data), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in classifier.iterdir()) == before  # nothing written into the model
    result = json.loads((work / "eval_classification_reviews.json").read_text())
    assert (work / "eval_classification_reviews_confusion_matrix.png").is_file()
    assert result["num_examples"] == 3 and result["max_length"] == 24  # the fine-tuning length
    assert "autocast would not speed up inference" in out and "training" not in out
    assert "fast path: none (CPU: eager SDPA)" in out.splitlines()  # what runs the model, said once
    target = tmp_path / "elsewhere" / "m.json"
    assert cli_main(["evaluate", "--model", str(classifier), "--data", str(data), "--output", str(target)]) == 0
    assert json.loads(target.read_text())["accuracy"] == result["accuracy"]


def test_max_length_defaults_to_the_models_positions(tmp_path, capsys):
    """A plain encoder with 128 positions: similarity and embed run with 128 tokens (a fixed
    default of 256 would fail on it); asking for more than it has is a clear error."""
    torch.manual_seed(1)
    encoder = save(tmp_path / "enc", BERTModel(tiny_config(128)))
    pairs = tmp_path / "pairs.tsv"  # STS-B release layout: genre file year id score s1 s2
    pairs.write_text("".join(f"g\tf\t2012\t{i}\t{s}\tthe cat sat\t{t}\n"
                             for i, (s, t) in enumerate([(4.0, "the cat sat on a mat"), (1.0, "a bad film"),
                                                         (2.5, "the dog ran")])))
    out = tmp_path / "sim.json"
    assert cli_main(["evaluate", "--task", "similarity", "--model", str(encoder), "--data", str(pairs),
                     "--output", str(out)]) == 0
    assert json.loads(out.read_text())["max_length"] == 128
    texts = tmp_path / "texts.txt"
    texts.write_text(" ".join(["the cat sat on the mat"] * 40) + "\nthe dog\n")  # 240 words: cut at 128 tokens
    assert cli_main(["embed", "--model", str(encoder), "--input", str(texts), "--output", str(tmp_path / "e.npy"),
                     "--device", "cpu"]) == 0
    assert np.load(tmp_path / "e.npy").shape == (2, 16)
    capsys.readouterr()
    assert cli_main(["evaluate", "--task", "similarity", "--model", str(encoder), "--data", str(pairs),
                     "--output", str(out), "--max-length", "256"]) == 2
    assert "--max-length 256 exceeds the 128 positions of" in capsys.readouterr().err


def test_predict_flags_blank_lines_and_keeps_one_output_per_line(classifier, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good\n\na bad film\n   \nthe cat\n")
    out = tmp_path / "p.jsonl"
    assert cli_main(["predict", "--model", str(classifier), "--input", str(texts), "--output", str(out),
                     "--device", "cpu"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in records] == ["the film is good", "", "a bad film", "   ", "the cat"]
    err = capsys.readouterr().err
    assert "texts.txt: 2 blank line(s) (line 2, 4) scored as empty texts" in err
    texts.write_text("the film is good\nthe cat\n")
    assert cli_main(["predict", "--model", str(classifier), "--input", str(texts), "--output", str(out)]) == 0
    assert "blank" not in capsys.readouterr().err
