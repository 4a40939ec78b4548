"""ONNX export (`bert-kit export`) and inference from the exported folder.

- fp32 graphs equal the PyTorch model on real weights: all-MiniLM-L6-v2's states and pooled
  embeddings, and a classification head on MiniLM, within 1e-4 on 200 real sentences of varied
  lengths (STS-B, SST-2);
- every head exports with dynamic batch and sequence axes and matches PyTorch at other shapes;
- int8: the quantised MiniLM is fused, its weights (word embeddings included) in 8 bits, at most
  25 MB, and keeps its STS-B ranking; the agreement with fp32 the export prints is the folder's;
- the exported folder alone serves inference: SentenceEncoder, `bert-kit embed/evaluate/predict`
  (a fine-tuned SST-2 classifier) give the PyTorch folder's outputs;
- clear one-line errors: a folder that cannot be exported, the missing extra, a graph used for
  another task, the PyTorch backend on an exported folder, an opset torch cannot write (and no
  library output on the terminal when an export fails);
- the output folder: an earlier export's recorded files are replaced, a folder holding anything
  else (or the model being exported) is refused; SIGTERM/SIGINT mid-export leaves no temporary
  folder; a hub name with a local copy is exported like a folder.

Tests that need onnx/onnxruntime skip with the reason when the extra is not installed.
Run: .venv/bin/python -m pytest tests/test_export.py -q
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.data.sts import read_sts
from bert_kit.embeddings import SentenceEncoder, pool
from bert_kit.heads import HEAD_CLASSES, BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.outputs import RECORD, read_record, write_record
from bert_kit.tokenizer import get_tokenizer

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128)
TOLERANCE = 1e-4  # the bar for fp32 graphs on real weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ort():
    pytest.importorskip("onnx", reason="the [onnx] extra (onnx) is not installed")
    return pytest.importorskip("onnxruntime", reason="the [onnx] extra (onnxruntime) is not installed")


@pytest.fixture(scope="module")
def export(ort):
    from bert_kit.onnx_export import export_onnx

    return export_onnx


@pytest.fixture(scope="module")
def minilm_onnx(export, minilm_path, tmp_path_factory):
    return export(minilm_path, tmp_path_factory.mktemp("onnx") / "minilm").folder


def varied(sentences: list[str], tokenizer, n: int = 200) -> list[str]:
    """n distinct sentences spread evenly over the range of token lengths (shortest to longest)."""
    unique = sorted(set(sentences), key=lambda s: (len(tokenizer.encode(s)), s))
    picks = np.linspace(0, len(unique) - 1, n).round().astype(int)
    return [unique[i] for i in picks]


@pytest.fixture(scope="module")
def sts_sentences(data_dir, minilm_path):
    s1, s2, _ = read_sts(data_dir / "stsb" / "sts-dev.csv")
    return varied(s1 + s2, get_tokenizer(minilm_path))


@pytest.fixture(scope="module")
def sst2_sentences(data_dir, minilm_path):
    lines = (data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    return varied([ln.split("\t")[0] for ln in lines], get_tokenizer(minilm_path))


def batches(texts: list[str], tokenizer, size: int = 32):
    """Padded (input_ids, attention_mask, token_type_ids) batches of mixed lengths, in text order."""
    for start in range(0, len(texts), size):
        enc = tokenizer(texts[start: start + size], padding=True, truncation=True, max_length=128,
                        return_tensors="pt")
        yield enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]


def test_minilm_graph_equals_pytorch_on_200_real_sentences(minilm_path, minilm_onnx, sts_sentences):
    from bert_kit.onnx_runtime import OnnxModel

    torch_model = BERTModel.from_pretrained(minilm_path)
    onnx_model = OnnxModel(minilm_onnx)
    tokenizer = get_tokenizer(minilm_onnx)
    lengths = set()
    with torch.no_grad():
        for ids, mask, types in batches(sts_sentences, tokenizer):
            lengths.update(mask.sum(1).tolist())
            hidden, vectors = (torch.from_numpy(a) for a in onnx_model.run(ids, mask, types))
            want = torch_model(ids, mask, types)
            real = mask.bool()
            assert_close(hidden[real], want[real], atol=TOLERANCE, rtol=0)
            assert_close(vectors, F.normalize(pool(want, mask, "mean"), dim=-1), atol=TOLERANCE, rtol=0)
            assert_close(onnx_model(ids, mask, types, unpadded=True)[real], want[real], atol=TOLERANCE, rtol=0)
    assert min(lengths) <= 8 and max(lengths) >= 40 and len(lengths) >= 25  # really varied lengths


def test_sentence_encoder_on_the_exported_folder_equals_pytorch(minilm_path, minilm_onnx, sts_sentences):
    onnx_encoder = SentenceEncoder.from_pretrained(minilm_onnx)
    assert onnx_encoder.device.type == "cpu" and type(onnx_encoder.model).__name__ == "OnnxModel"
    got = onnx_encoder.encode(sts_sentences, batch_size=16)
    want = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(sts_sentences, batch_size=16)
    assert got.shape == want.shape == (200, 384)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    with pytest.raises(ValueError, match="compile applies to PyTorch models"):
        SentenceEncoder.from_pretrained(minilm_onnx, compile=True)


def test_classification_head_on_real_weights_equals_pytorch(export, minilm_path, sst2_sentences, tmp_path):
    from bert_kit.onnx_runtime import OnnxModel

    torch.manual_seed(0)  # MiniLM's encoder with a seeded 3-way head
    model = BERTForSequenceClassification.from_pretrained(minilm_path, num_labels=3)
    model.save_pretrained(tmp_path / "pt")
    get_tokenizer(minilm_path).save(tmp_path / "pt")
    report = export(tmp_path / "pt", tmp_path / "onnx", fuse=True)  # ONNX Runtime's fused ops, this time
    assert report.architecture == "BertForSequenceClassification" and report.outputs == ["logits", "last_hidden_state"]
    assert report.fused.get("Attention") == 6  # every layer's attention fused
    onnx_model = OnnxModel(report.folder)
    with torch.no_grad():
        for ids, mask, types in batches(sst2_sentences, get_tokenizer(report.folder)):
            logits = onnx_model(ids, mask, types)
            assert logits.shape == (ids.shape[0], 3)
            assert_close(logits, model(ids, mask, types), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("architecture", sorted(HEAD_CLASSES))
def test_every_head_exports_with_dynamic_batch_and_sequence_axes(export, architecture, minilm_path, tmp_path):
    import onnx

    from bert_kit.onnx_runtime import OnnxModel

    torch.manual_seed(1)
    model = HEAD_CLASSES[architecture](TINY).eval()
    model.save_pretrained(tmp_path / "pt")
    get_tokenizer(minilm_path).save(tmp_path / "pt")
    report = export(tmp_path / "pt", tmp_path / "onnx")
    graph = onnx.load(str(report.folder / "model.onnx"))
    for value in graph.graph.input:
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    onnx_model = OnnxModel(report.folder)
    g = torch.Generator().manual_seed(2)
    for batch, seqlen in ((1, 5), (4, 23)):  # neither is the traced shape (3, 12)
        ids = torch.randint(1000, 30000, (batch, seqlen), generator=g)
        mask = (torch.arange(seqlen)[None, :] < torch.linspace(seqlen, 2, batch).long()[:, None]).long()
        types = torch.randint(0, 2, (batch, seqlen), generator=g) * mask
        with torch.no_grad():
            want = model(ids * mask, mask, types)
        got = onnx_model(ids * mask, mask, types)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert len(got) == len(want)
        for w, o in zip(want, got):
            assert o.shape == w.shape and o.dtype == torch.float32
            real = mask.bool() if w.shape[:2] == mask.shape else slice(None)  # padding rows are don't-care
            assert_close(o[real], w[real], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def minilm_int8(export, minilm_path, tmp_path_factory):
    return export(minilm_path, tmp_path_factory.mktemp("int8") / "minilm", quantize="int8")


def test_int8_minilm_is_fused_and_stores_every_weight_matrix_in_8_bits(minilm_int8, minilm_onnx):
    import onnx
    from onnx import numpy_helper

    report = minilm_int8
    meta = json.loads((report.folder / "config.json").read_text())["bert_kit"]["onnx"]
    assert meta["precision"] == "int8" and meta["outputs"] == ["last_hidden_state", "sentence_embedding"]
    # ONNX Runtime's BERT fusions run before quantising: one attention op per layer, add + LayerNorm, bias + GELU
    assert report.fused["Attention"] == 6 and report.fused["BiasGelu"] == 6, report.fused
    assert report.fused["SkipLayerNormalization"] >= 12 and meta["fused"] == report.fused
    graph = onnx.load(str(report.folder / "model.onnx")).graph
    ops = Counter(node.op_type for node in graph.node)
    assert ops["QAttention"] == 6  # Q, K, V of each layer on int8 weights
    assert ops["MatMulInteger"] == 6 * 3  # attention output, FFN up and down of each layer
    # the word embeddings (30522 x 384, half the weights) are 8-bit too; what stays fp32 is small
    weights = {w.name: numpy_helper.to_array(w) for w in graph.initializer}
    assert any(w.shape == (30522, 384) and w.dtype == np.uint8 for w in weights.values())
    float_elements = sum(w.size for w in weights.values() if w.dtype == np.float32)
    assert float_elements < 0.02 * sum(w.size for w in weights.values()), float_elements
    assert report.folder_bytes() <= 25e6  # the bound: 25 MB, against 91 MB for fp32
    assert report.folder_bytes() < 0.3 * sum(f.stat().st_size for f in minilm_onnx.iterdir())
    summary = report.summary()
    assert f"size: {report.folder_bytes() / 1e6:.1f} MB folder" in summary and "fused: 6 Attention" in summary


def test_int8_minilm_keeps_the_sts_ranking(minilm_int8, minilm_onnx, data_dir):
    from bert_kit.metrics import spearman

    s1, s2, gold = read_sts(data_dir / "stsb" / "sts-test.csv")
    s1, s2, gold = s1[:300], s2[:300], gold[:300]
    scores, vectors = {}, {}
    for name, folder in (("fp32", minilm_onnx), ("int8", minilm_int8.folder)):
        encoder = SentenceEncoder.from_pretrained(folder)
        a, b = encoder.encode(s1), encoder.encode(s2)
        scores[name], vectors[name] = spearman((a * b).sum(1), gold), a
    cosine = (vectors["int8"] * vectors["fp32"]).sum(1)  # each vector stays close in direction to its fp32 twin
    assert cosine.mean() > 0.985 and cosine.min() > 0.9, (cosine.mean(), cosine.min())
    assert abs(scores["int8"] - scores["fp32"]) < 0.01, scores  # under 1 Spearman point on 300 pairs


def test_int8_export_reports_its_agreement_with_fp32(minilm_int8, minilm_path):
    """The figures the export prints for an int8 graph are the ones its folder gives: the cosine of
    each built-in sentence's vector to PyTorch's (one batch of 16, as the export runs them)."""
    from bert_kit.onnx_export import INT8_CHECK_SENTENCES

    check = minilm_int8.int8_check
    assert set(check) == {"last_hidden_state", "sentence_embedding"}
    texts = list(INT8_CHECK_SENTENCES)
    got = SentenceEncoder.from_pretrained(minilm_int8.folder).encode(texts, batch_size=len(texts))
    want = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(texts, batch_size=len(texts))
    cosine = (got * want).sum(1)
    vectors = check["sentence_embedding"]
    assert vectors["cosine_mean"] == pytest.approx(cosine.mean(), abs=1e-4)
    assert vectors["cosine_min"] == pytest.approx(cosine.min(), abs=1e-4)
    assert vectors["max_abs_diff"] == pytest.approx(np.abs(got - want).max(), abs=1e-4)
    assert vectors["cosine_mean"] > 0.98 and vectors["cosine_min"] > 0.95, vectors
    assert check["last_hidden_state"]["cosine_mean"] > 0.97, check
    assert (f"int8 against fp32 on {len(texts)} built-in sentences: last_hidden_state max |diff| "
            f"{check['last_hidden_state']['max_abs_diff']:.1e}") in minilm_int8.summary()
    assert f"cosine mean {vectors['cosine_mean']:.4f} (min {vectors['cosine_min']:.4f})" in minilm_int8.summary()


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForQuestionAnswering", "BertForTokenClassification"])
def test_int8_heads_export_and_report_their_argmax_agreement(export, architecture, minilm_path, tmp_path):
    """Heads quantise too: the MLM decoder (tied to the word embeddings, which are quantised
    twice: as a lookup and as a matmul), QA's per-position logits, per-token labels."""
    from bert_kit.onnx_runtime import OnnxModel

    torch.manual_seed(1)
    model = HEAD_CLASSES[architecture](TINY).eval()
    model.save_pretrained(tmp_path / "pt")
    get_tokenizer(minilm_path).save(tmp_path / "pt")
    report = export(tmp_path / "pt", tmp_path / "onnx", quantize="int8")
    assert report.fused["Attention"] == 2 and set(report.int8_check) == set(report.outputs)
    for name, m in report.int8_check.items():
        if name.endswith("logits"):
            assert m["same_argmax"] > 0.8, (name, m)  # random tiny heads: near ties flip, most do not
        else:
            assert m["cosine_mean"] > 0.99, (name, m)
    ids = torch.randint(1000, 30000, (4, 23), generator=torch.Generator().manual_seed(2))
    mask = (torch.arange(23)[None, :] < torch.tensor([23, 17, 9, 2])[:, None]).long()
    with torch.no_grad():
        want = model(ids * mask, mask, torch.zeros_like(ids))
    got = OnnxModel(report.folder)(ids * mask, mask, torch.zeros_like(ids))
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, o in zip(want, got):
        assert o.shape == w.shape and o.dtype == torch.float32


@pytest.fixture(scope="module")
def sst2_classifier(ort, minilm_path, data_dir, tmp_path_factory):
    """A tiny classifier fine-tuned on 64 SST-2 rows (as `bert-kit finetune` leaves it), and its export."""
    from bert_kit.onnx_export import export_onnx
    from bert_kit.tasks.finetuning import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("sst2")
    lines = (data_dir / "sst2" / "train.tsv").read_text().splitlines()
    (root / "train.tsv").write_text("\n".join(lines[:65]) + "\n")
    torch.manual_seed(0)
    BERTModel(TINY).save_pretrained(root / "tiny")
    get_tokenizer(minilm_path).save(root / "tiny")
    finetune(FinetuneConfig(model=str(root / "tiny"), train_file=str(root / "train.tsv"), output_dir=str(root / "run"),
                            max_steps=4, batch_size=16, lr=1e-3, precision="fp32", device="cpu",
                            label_names=["negative", "positive"], max_length=64))
    export_onnx(root / "run", root / "onnx")  # a run folder stands for its final model
    return root / "run", root / "onnx"


def test_evaluate_and_predict_on_the_exported_folder_equal_pytorch(sst2_classifier, data_dir, tmp_path, capsys):
    run, exported = sst2_classifier
    meta = json.loads((exported / "config.json").read_text())
    assert meta["bert_kit"]["task"] == "classification" and meta["id2label"] == {"0": "negative", "1": "positive"}
    dev = tmp_path / "dev.tsv"
    dev.write_text("\n".join((data_dir / "sst2" / "dev.tsv").read_text().splitlines()[:101]) + "\n")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(ln.split("\t")[0] for ln in dev.read_text().splitlines()[1:]) + "\n")
    results = {}
    for name, folder, backend in (("pt", run, "torch"), ("onnx", exported, "auto"), ("fly", run, "onnx")):
        argv = ["--model", str(folder), "--backend", backend, "--device", "cpu"]
        assert cli_main(["evaluate", *argv, "--data", str(dev), "--output", str(tmp_path / f"{name}.json")]) == 0
        assert cli_main(["predict", *argv, "--input", str(texts), "--output", str(tmp_path / f"{name}.jsonl")]) == 0
        metrics = json.loads((tmp_path / f"{name}.json").read_text())
        predictions = [json.loads(ln) for ln in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        results[name] = metrics, predictions
    assert "exported" in capsys.readouterr().out  # the on-the-fly export says what it did
    (pt_metrics, pt_pred) = results["pt"]
    for name in ("onnx", "fly"):
        metrics, pred = results[name]
        assert metrics["num_examples"] == pt_metrics["num_examples"] == 100
        assert metrics["accuracy"] == pt_metrics["accuracy"]
        assert metrics["loss"] == pytest.approx(pt_metrics["loss"], abs=TOLERANCE)
        assert [p["label"] for p in pred] == [p["label"] for p in pt_pred]
        for p, q in zip(pred, pt_pred):
            for label in ("negative", "positive"):
                assert p["probabilities"][label] == pytest.approx(q["probabilities"][label], abs=TOLERANCE)


def test_embed_cli_on_exported_folder_equals_pytorch(minilm_path, minilm_onnx, sts_sentences, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(sts_sentences[::4]) + "\n")
    for name, folder in (("pt", minilm_path), ("onnx", minilm_onnx)):
        assert cli_main(["embed", "--model", str(folder), "--input", str(texts), "--output",
                         str(tmp_path / f"{name}.npy"), "--device", "cpu"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "onnx.npy"), np.load(tmp_path / "pt.npy"), atol=TOLERANCE, rtol=0)


def test_export_cli_and_its_errors(ort, minilm_path, minilm_onnx, sst2_classifier, tmp_path, capsys):
    # a folder whose head cannot be exported: named with its file, nothing left behind
    folder = tmp_path / "multiple-choice"
    BERTModel(TINY).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMultipleChoice"]}))
    assert cli_main(["export", "--model", str(folder), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "BertForMultipleChoice" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    # an exported folder is not exported again; --output must not overwrite a model folder
    assert cli_main(["export", "--model", str(minilm_onnx), "--output", str(tmp_path / "again")]) == 2
    assert "already an exported ONNX folder" in capsys.readouterr().err
    assert cli_main(["export", "--model", str(folder), "--output", str(folder)]) == 2
    assert "the model folder itself" in capsys.readouterr().err
    # the PyTorch backend on an exported folder; an exported graph used for another task
    texts = tmp_path / "t.txt"
    texts.write_text("a line\n")
    assert cli_main(["embed", "--model", str(minilm_onnx), "--backend", "torch", "--input", str(texts),
                     "--output", str(tmp_path / "v.npy")]) == 2
    assert "no PyTorch weights" in capsys.readouterr().err
    _, exported = sst2_classifier
    assert cli_main(["predict", "--model", str(exported), "--task", "qa", "--input", str(texts),
                     "--output", str(tmp_path / "p.jsonl")]) == 2
    assert "holds an exported BertForSequenceClassification graph" in capsys.readouterr().err
    vectors = SentenceEncoder.from_pretrained(exported).encode(["a line"])  # from the encoder states it outputs
    assert vectors.shape[0] == 1 and np.isfinite(vectors).all()
    from bert_kit.onnx_runtime import OnnxModel

    with pytest.raises(ValueError, match="runs on the CPU"):
        OnnxModel(minilm_onnx).to("cuda")
    # a clean export through the command line prints what it wrote and how close it is
    assert cli_main(["export", "--model", str(folder.parent / "roberta"), "--output", str(tmp_path / "x")]) == 2
    capsys.readouterr()
    assert cli_main(["export", "--model", str(sst2_classifier[0]), "--output", str(tmp_path / "int8"),
                     "--quantize", "int8"]) == 0
    out = capsys.readouterr().out
    assert "exported BertForSequenceClassification (int8)" in out and "max |ONNX - PyTorch|" in out
    assert "MB folder" in out and "int8 against fp32 on 16 built-in sentences: logits max |diff|" in out
    assert "same argmax" in out


def test_missing_extra_is_a_clear_error(monkeypatch, minilm_path, tmp_path, capsys):
    """Runs without the extra too: onnxruntime is hidden from the import system."""
    from bert_kit.onnx_runtime import require_onnxruntime

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "bert-kit\[onnx\]"'):
        require_onnxruntime()
    assert cli_main(["export", "--model", str(minilm_path), "--output", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert 'pip install "bert-kit[onnx]"' in err and "Traceback" not in err and not (tmp_path / "out").exists()


# ---- the output folder, stop signals, hub names, opsets -------------------------------------------

@pytest.fixture(scope="module")
def tiny_classifier(minilm_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "model"
    torch.manual_seed(0)
    BERTForSequenceClassification(TINY, num_labels=2).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    return folder


def test_export_replaces_only_what_an_earlier_export_wrote(ort, tiny_classifier, tmp_path, capsys):
    out = tmp_path / "onnx"
    assert cli_main(["export", "--model", str(tiny_classifier), "--output", str(out)]) == 0
    written = sorted(read_record(out))
    assert written == sorted(p.name for p in out.iterdir() if p.name != RECORD)
    assert {"model.onnx", "config.json", "tokenizer.json", "vocab.txt"} <= set(written)
    # an earlier export's own file that this one does not write again goes; the rest is replaced
    (out / "old-graph.onnx").write_bytes(b"an earlier export's graph")
    write_record(out, [*written, "old-graph.onnx"], "bert-kit export")
    assert cli_main(["export", "--model", str(tiny_classifier), "--output", str(out), "--quantize", "int8"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*written, RECORD])
    assert json.loads((out / "config.json").read_text())["bert_kit"]["onnx"]["precision"] == "int8"
    # a user's file in it: refused, named, nothing touched
    (out / "notes.txt").write_text("mine\n")
    graph = (out / "model.onnx").read_bytes()
    assert cli_main(["export", "--model", str(tiny_classifier), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--output {out} holds files that no earlier bert-kit export wrote there (notes.txt)" in err
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "model.onnx").read_bytes() == graph
    # an export from before records: its graph, config.json and tokenizer files are its own
    (out / "notes.txt").unlink()
    (out / RECORD).unlink()
    assert cli_main(["export", "--model", str(tiny_classifier), "--output", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["bert_kit"]["onnx"]["precision"] == "fp32"


def test_export_refuses_an_output_folder_holding_its_model(ort, tiny_classifier, tmp_path, capsys):
    out = tmp_path / "onnx"
    assert cli_main(["export", "--model", str(tiny_classifier), "--output", str(out)]) == 0
    inside = out / "source-model"
    import shutil

    shutil.copytree(tiny_classifier, inside)
    assert cli_main(["export", "--model", str(inside), "--output", str(out)]) == 2
    assert f"--output {out} holds the model folder being exported" in capsys.readouterr().err
    assert sorted(p.name for p in inside.iterdir()) == sorted(p.name for p in tiny_classifier.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_mid_export_leaves_no_temporary_folder(ort, tiny_classifier, tmp_path, sig):
    """A real process, stopped while its graph is written into the temporary folder: the export
    waits there (in place of the rest of its work) until the signal comes."""
    marker = tmp_path / "traced"
    script = tmp_path / "export_and_wait.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        import bert_kit.onnx_export as export
        real = export.trace_to_onnx

        def trace_and_wait(*args, **kwargs):
            real(*args, **kwargs)
            open({str(marker)!r}, "w").close()
            time.sleep(600)

        export.trace_to_onnx = trace_and_wait
        from bert_kit.cli import main
        sys.exit(main(sys.argv[1:]))
    """))
    out = tmp_path / "onnx"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), "export", "--model", str(tiny_classifier), "--output",
                             str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300  # a guard against a hang, not a measure of speed
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the export did not start"
            time.sleep(0.05)
        temporary = list(tmp_path.glob(".onnx.*"))
        assert len(temporary) == 1 and (temporary[0] / "traced.onnx").is_file()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and f"stopped by {signal.Signals(sig).name}: nothing was written" in err, err
    assert not list(tmp_path.glob(".onnx.*")) and not out.exists()


def test_export_takes_a_hub_name(ort, minilm_path, capfd):
    """The hub name resolves to its local copy (here the packaged folder, refused as the output)."""
    code = cli_main(["export", "--model", "sentence-transformers/all-MiniLM-L6-v2", "--output", str(minilm_path)])
    out, err = capfd.readouterr()
    assert code == 2 and f"--output {minilm_path} is the model folder itself" in err, err


def test_an_opset_out_of_range_is_one_line_and_nothing_else(tiny_classifier, tmp_path, capfd):
    from bert_kit.onnx_export import MIN_OPSET, max_opset

    for opset in (99, MIN_OPSET - 1):
        code = cli_main(["export", "--model", str(tiny_classifier), "--output", str(tmp_path / "x"),
                         "--opset", str(opset)])
        out, err = capfd.readouterr()
        assert code == 2 and out == "", out[:500]
        assert err.splitlines() == [f"bert-kit export: error: opset {opset} is out of range: expected an integer in "
                                    f"[{MIN_OPSET}, {max_opset()}] " + err.split("] ", 1)[1].strip()], err
    assert not (tmp_path / "x").exists()


def test_library_output_of_a_failed_export_stays_off_the_terminal(ort, tiny_classifier, tmp_path, monkeypatch, capfd):
    def noisy_failure(*args, **kwargs):  # as torch.onnx does: the whole graph on stdout, then the error
        os.write(1, b"graph(%input_ids : Long(3, 12)):\n" * 150)
        print("%2140 : Float(3, 2) = onnx::Gemm(...)")
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(torch.onnx, "export", noisy_failure)
    code = cli_main(["export", "--model", str(tiny_classifier), "--output", str(tmp_path / "x")])
    out, err = capfd.readouterr()
    assert code == 1 and out == "" and "graph(" not in err, (out[:300], err[:300])
    assert len(err.splitlines()) == 1 and "the exporter failed" in err
    assert not list(tmp_path.glob(".x.*")) and not (tmp_path / "x").exists()
