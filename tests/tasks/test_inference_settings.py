"""`evaluate`, `predict` and `embed` on what users hand them: a fine-tuned folder reads files the way
it was fine-tuned (its recorded columns, header, delimiter and encoding are the flags' defaults,
and messages name flags, not run-config keys); inputs that are pipes; texts of control characters
flagged; a model whose outputs are NaN stops with one line; an exported folder says why it runs fp32.

Run: .venv/bin/python -m pytest tests/tasks/test_inference_settings.py -q
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.model_folder import read_model_metadata, write_model_metadata
from bert_kit.tasks.finetuning import FinetuneConfig, finetune

WORDS = "the a cat dog sat ran on mat rug and is good bad very film caf\u00e9 sure".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
CONFIG = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64)
# MRPC's release layout (msr_paraphrase_train.txt): tab-separated named columns in a .txt file
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
MRPC_SETTINGS = {"text_column": "#1 String", "text_pair_column": "#2 String", "label_column": "Quality"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def save(folder, model, **meta):
    model.eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    if meta:
        write_model_metadata(folder, meta)
    return folder


def mrpc_txt(path, n: int = 12):
    rows = [MRPC_HEADER] + [f"{i % 2}\t{100 + i}\t{200 + i}\tthe {WORDS[i % 12]} caf\u00e9 sat\tthe {WORDS[(i + 3) % 12]} "
                            f"dog ran" for i in range(n)]
    path.write_bytes(("\n".join(rows) + "\n").encode("latin-1"))
    return path


@pytest.fixture(scope="module")
def mrpc_model(tmp_path_factory):
    """A tiny classifier fine-tuned on an MRPC-layout .txt file in ISO-8859-1 (named columns, encoding)."""
    root = tmp_path_factory.mktemp("mrpc")
    torch.manual_seed(0)
    save(root / "tiny", BERTModel(CONFIG))
    data = mrpc_txt(root / "msr_paraphrase_train.txt")
    finetune(FinetuneConfig(model=str(root / "tiny"), train_file=str(data), output_dir=str(root / "run"), max_steps=2,
                            batch_size=4, precision="fp32", device="cpu", max_length=32, encoding="latin-1",
                            **MRPC_SETTINGS))
    return root / "run" / "best", data


def test_the_folder_records_how_its_files_were_read(mrpc_model):
    best, _ = mrpc_model
    assert read_model_metadata(best)["data"] == {**MRPC_SETTINGS, "encoding": "latin-1"}


def test_evaluate_and_predict_read_files_as_the_model_was_fine_tuned(mrpc_model, tmp_path, capsys):
    """Before, `evaluate --model best --data file` read column 'sentence' (and as UTF-8) and failed."""
    best, data = mrpc_model
    capsys.readouterr()
    assert cli_main(["evaluate", "--model", str(best), "--data", str(data), "--output", str(tmp_path / "e.json"),
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert (f"{best}: reading files as it was fine-tuned: --text-column '#1 String', --text-pair-column '#2 String', "
            "--label-column 'Quality', --encoding 'latin-1' (a flag overrides each)") in err
    by_folder = json.loads((tmp_path / "e.json").read_text())
    assert by_folder["num_examples"] == 12
    flags = ["--text-column", "#1 String", "--text-pair-column", "#2 String", "--label-column", "Quality",
             "--encoding", "latin-1"]
    assert cli_main(["evaluate", "--model", str(best), "--data", str(data), "--output", str(tmp_path / "f.json"),
                     "--device", "cpu", *flags]) == 0
    by_flags = json.loads((tmp_path / "f.json").read_text())
    assert by_flags["accuracy"] == by_folder["accuracy"] and by_flags["loss"] == by_folder["loss"]

    assert cli_main(["predict", "--model", str(best), "--input", str(data), "--output", str(tmp_path / "p.jsonl"),
                     "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 12 and records[0]["text"] == "the the caf\u00e9 sat" and records[0]["text_pair"] == "the dog dog ran"

    # a flag still wins, and what to change is said as a flag, not as a run-config key
    capsys.readouterr()
    assert cli_main(["evaluate", "--model", str(best), "--data", str(data), "--output", str(tmp_path / "g.json"),
                     "--device", "cpu", "--label-column", "label"]) != 0
    err = capsys.readouterr().err
    assert "header has no column 'label'" in err and "set --no-header and give columns by 0-based index" in err
    assert "header=false" not in err


def test_predict_flags_texts_of_control_characters(tmp_path, capsys):
    torch.manual_seed(0)
    model = BERTForSequenceClassification(CONFIG, num_labels=2)
    model.id2label = {"0": "negative", "1": "positive"}
    folder = save(tmp_path / "clf", model, task="classification", max_length=24)
    texts = tmp_path / "texts.txt"
    texts.write_text("the film is good\n\x01\x02\x03\na bad film\n\u200b\u200b\n")
    assert cli_main(["predict", "--model", str(folder), "--input", str(texts), "--output", str(tmp_path / "p.jsonl"),
                     "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "texts.txt: 2 line(s) blank or of control characters only (line 2, 4) scored as empty texts" in err
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 4  # still one output per line
    encoder = save(tmp_path / "enc", BERTModel(CONFIG))
    assert cli_main(["embed", "--model", str(encoder), "--input", str(texts), "--output", str(tmp_path / "v.npy"),
                     "--device", "cpu"]) == 0
    assert "texts.txt: 2 line(s) blank or of control characters only (line 2, 4)" in capsys.readouterr().err


def feed_fifo(path, data: bytes) -> threading.Thread:
    os.mkfifo(path)

    def feed() -> None:
        with open(path, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_pipe_is_an_input_file(tmp_path, capsys):
    """A FIFO (as /dev/stdin or `<(command)` are) was refused: 'input file not found'."""
    torch.manual_seed(0)
    model = BERTForSequenceClassification(CONFIG, num_labels=2)
    model.id2label = {"0": "negative", "1": "positive"}
    folder = save(tmp_path / "clf", model, task="classification", max_length=24)
    encoder = save(tmp_path / "enc", BERTModel(CONFIG))
    data = b"sentence\tlabel\nthe film is good\tpositive\na bad film\tnegative\n"
    runs = [("predict", folder, "--input", "in.tsv", "p.jsonl"), ("evaluate", folder, "--data", "dev.tsv", "e.json"),
            ("embed", encoder, "--input", "in.txt", "v.npy")]
    for command, model_folder, flag, name, out in runs:
        thread = feed_fifo(tmp_path / name, data if command != "embed" else b"the cat\na dog\n")
        argv = [command, "--model", str(model_folder), flag, str(tmp_path / name), "--output", str(tmp_path / out),
                "--device", "cpu"]
        assert cli_main(argv) == 0, capsys.readouterr().err
        thread.join(timeout=10)
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "e.json").read_text())["num_examples"] == 2
    assert np.load(tmp_path / "v.npy").shape == (2, 16)
    capsys.readouterr()
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path), "--output", "x.jsonl"]) != 0
    assert "input file is a folder, not a file" in capsys.readouterr().err
    assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "nope"), "--output", "x.jsonl"]) != 0
    assert "input file not found" in capsys.readouterr().err


def test_nan_weights_are_an_error_not_nan_outputs(tmp_path, capsys):
    """Before, predict wrote NaN probabilities (not even valid JSON) and embed NaN vectors, with exit 0.
    A folder's weights are checked when they are read: the error names the file and the tensor."""
    torch.manual_seed(0)
    model = BERTForSequenceClassification(CONFIG, num_labels=2)
    model.id2label = {"0": "negative", "1": "positive"}
    with torch.no_grad():
        model.bert.encoder.layers[0].ffn.up.weight[0, 0] = float("nan")
    folder = save(tmp_path / "clf", model, task="classification", max_length=24)
    encoder = BERTModel(CONFIG)
    with torch.no_grad():
        encoder.embeddings.word_embeddings.weight[7, 3] = float("inf")
    encoder = save(tmp_path / "enc", encoder)
    (tmp_path / "t.txt").write_text("the cat sat\nthe dog ran\n")
    (tmp_path / "d.tsv").write_text("sentence\tlabel\nthe cat sat\tpositive\n")
    runs = [["predict", "--model", str(folder), "--input", str(tmp_path / "t.txt"), "--output", str(tmp_path / "p.jsonl")],
            ["evaluate", "--model", str(folder), "--data", str(tmp_path / "d.tsv"), "--output", str(tmp_path / "e.json")],
            ["embed", "--model", str(encoder), "--input", str(tmp_path / "t.txt"), "--output", str(tmp_path / "v.npy")]]
    for argv in runs:
        capsys.readouterr()
        assert cli_main(argv + ["--device", "cpu"]) == 2  # a broken model folder: the input is wrong
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert len(errors) == 1 and "NaN or infinite value(s)" in errors[0] and "Traceback" not in errors[0]
        assert "model.safetensors: tensor " in errors[0]
    assert not any((tmp_path / name).exists() for name in ("p.jsonl", "e.json", "v.npy"))


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_an_exported_folder_says_which_graph_it_runs(tmp_path, capsys, quantize):
    pytest.importorskip("onnxruntime")
    from bert_kit.onnx_export import export_onnx

    torch.manual_seed(0)
    model = BERTForSequenceClassification(CONFIG, num_labels=2)
    model.id2label = {"0": "negative", "1": "positive"}
    save(tmp_path / "clf", model, task="classification", max_length=24)
    export_onnx(tmp_path / "clf", tmp_path / "onnx", quantize=quantize)
    (tmp_path / "d.tsv").write_text("sentence\tlabel\nthe cat sat\tpositive\n")
    graph = quantize or "fp32"
    for extra, reason in (([], f"(onnx runs the exported {graph} graph on the cpu)"),
                          (["--precision", "bf16"],
                           f"(onnx runs the exported {graph} graph on the cpu; --precision bf16 does not apply)")):
        capsys.readouterr()
        assert cli_main(["evaluate", "--model", str(tmp_path / "onnx"), "--data", str(tmp_path / "d.tsv"),
                         "--output", str(tmp_path / "e.json"), *extra]) == 0
        out = capsys.readouterr().out
        assert f"precision: fp32 on cpu {reason}" in out and "requested" not in out
