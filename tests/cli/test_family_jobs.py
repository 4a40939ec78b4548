"""Every job on the other families' folders: `bert-kit finetune` (classification, token
classification, QA, similarity as a cross-encoder and a bi-encoder) from tiny random ModernBERT,
RoBERTa and DistilBERT folders as transformers writes them, then `evaluate` (the run's own metric),
`predict` (transformers' probabilities), `export` (ONNX and int8, checked in ONNX Runtime against the
torch model past the window and the traced length), `serve`, `glue` and `fill-mask` on ModernBERT,
and inputs far longer than ModernBERT's window up to its context.

Run: .venv/bin/python -m pytest tests/cli/test_family_jobs.py -q
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main
from tests.cli.test_families import SENTENCES, hf_folder
from tests.tasks.glue_files import write_task

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ["modernbert", "roberta", "distilbert"]
TASKS = ["classification", "token-classification", "qa", "similarity", "bi-encoder"]
WORDS = "the quick brown fox jumps over a lazy dog while hello world numbers appear in tiny corpus".split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """A small file of each task's format (each also its validation file)."""
    root, rng = tmp_path_factory.mktemp("data"), random.Random(0)
    texts = [text(rng, rng.randint(3, 30)) for _ in range(24)]
    files = {"classification": root / "cls.tsv", "token-classification": root / "ner.txt", "qa": root / "qa.json",
             "similarity": root / "sts.tsv"}
    files["classification"].write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(texts)))
    tags = ["O", "B-PER", "I-PER", "B-LOC"]
    files["token-classification"].write_text("\n".join(
        "\n".join(f"{w} {tags[(i + j) % 4]}" for j, w in enumerate(t.split())) + "\n" for i, t in enumerate(texts)))
    paragraphs = []
    for i, context in enumerate(texts[:12]):
        answer = context.split()[len(context.split()) // 2]
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"where is {answer}?",
                                                        "answers": [{"text": answer,
                                                                     "answer_start": context.index(answer)}]}]})
    files["qa"].write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    files["similarity"].write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{(i * 0.7) % 5:.2f}\n" for i, (a, b) in enumerate(zip(texts, texts[1:]))))
    return files


@pytest.fixture(scope="module")
def mlm_folders(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module, object]]:
    """family -> (transformers' MLM folder with its tokenizer, the model, the tokenizer)."""
    return {family: hf_folder(tmp_path_factory, family, "ForMaskedLM") for family in FAMILIES}


def finetune_args(task: str, model: Path, files: dict[str, Path], out: Path) -> list[str]:
    name, mode = ("similarity", ["similarity_mode=bi-encoder"]) if task == "bi-encoder" else (task, [])
    qa = ["max_length=64", "doc_stride=16", "max_query_length=16"] if task == "qa" else ["max_length=48"]
    return ["finetune", "--task", name, f"model={model}", f"train_file={files[name]}", f"validation_file={files[name]}",
            "epochs=1", "batch_size=8", "lr=1e-3", f"output_dir={out}", "device=cpu", *mode, *qa]


@pytest.fixture(scope="module")
def tuned(mlm_folders, data, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(family, task) -> the run folder of a fine-tune from that family's folder."""
    root, runs = tmp_path_factory.mktemp("runs"), {}
    for family in FAMILIES:
        for task in TASKS:
            out = root / f"{family}-{task}"
            assert main(finetune_args(task, mlm_folders[family][0], data, out)) == 0, (family, task)
            runs[family, task] = out
    return runs


HEADS = {"classification": "ForSequenceClassification", "token-classification": "ForTokenClassification",
         "qa": "ForQuestionAnswering", "similarity": "ForSequenceClassification", "bi-encoder": "Model"}
PREFIX = {"modernbert": "ModernBert", "roberta": "Roberta", "distilbert": "DistilBert"}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("task", TASKS)
def test_finetune_saves_the_familys_head_and_evaluate_scores_it_as_the_run_did(tuned, data, family, task, tmp_path):
    run = tuned[family, task]
    best = json.loads((run / "best" / "config.json").read_text())
    assert best["architectures"] == [PREFIX[family] + HEADS[task]]
    results = json.loads((run / "results.json").read_text())
    name = "similarity" if task == "bi-encoder" else task
    assert main(["evaluate", "--model", str(run), "--data", str(data[name]), "--output", str(tmp_path / "e.json"),
                 "--device", "cpu"]) == 0
    scored = json.loads((tmp_path / "e.json").read_text())
    assert scored[results["metric"]] == pytest.approx(results["best_value"], abs=1e-9)


def test_predict_gives_transformers_probabilities_for_a_modernbert_classifier(tuned, tmp_path):
    best = tuned["modernbert", "classification"] / "best"
    texts = [s for s in SENTENCES if s.strip() == s and s and "\t" not in s]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["predict", "--model", str(best), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "p.jsonl"), "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    model = transformers.ModernBertForSequenceClassification.from_pretrained(best).eval()
    enc = transformers.AutoTokenizer.from_pretrained(best)(texts, padding=True, truncation=True, max_length=48,
                                                           return_tensors="pt")
    with torch.no_grad():
        want = model(**enc).logits.softmax(-1)
    got = torch.tensor([[r["probabilities"][n] for n in ("0", "1")] for r in rows])
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family, task", [("modernbert", t) for t in TASKS] + [("roberta", "classification"),
                                                                           ("distilbert", "qa")])
def test_export_runs_in_onnx_runtime_with_the_torch_models_outputs(tuned, family, task, tmp_path):
    """fp32 within 1e-4 of torch on inputs past the window (+-4) and the traced length (12)."""
    pytest.importorskip("onnxruntime")
    from bert_kit.families import load_model
    from bert_kit.onnx_runtime import OnnxModel

    best = tuned[family, task] / "best"
    assert main(["export", "--model", str(best), "--output", str(tmp_path / "onnx")]) == 0
    graph = OnnxModel(tmp_path / "onnx")
    model = load_model(HEADS[task], best)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 25:], mask[2, 6:] = 0, 0
    types = torch.zeros_like(ids)
    with torch.no_grad():
        want = model(ids, mask, types)
    got = graph(ids, mask, types)
    want, got = (w if isinstance(w, tuple) else (w,) for w in (want, got))
    for w, h in zip(want, got):
        if w.dim() >= 2 and w.shape[:2] == mask.shape:
            w, h = w[mask.bool()], h[mask.bool()]
        elif w.shape == mask.shape:  # QA's (B, T) logits
            w, h = w[mask.bool()], h[mask.bool()]
        assert_close(h, w.float(), rtol=1e-4, atol=1e-4)


def test_int8_export_of_a_modernbert_classifier_agrees_with_fp32(tuned, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    best = tuned["modernbert", "classification"] / "best"
    assert main(["export", "--model", str(best), "--output", str(tmp_path / "int8"), "--quantize", "int8"]) == 0
    out = capsys.readouterr().out
    assert "exported ModernBertForSequenceClassification (int8)" in out and "same argmax" in out
    meta = json.loads((tmp_path / "int8" / "config.json").read_text())["bert_kit"]["onnx"]
    assert meta["precision"] == "int8" and meta["architecture"] == "ModernBertForSequenceClassification"
    agreement = float(out.split("same argmax ")[1].split("%")[0])
    assert agreement >= 90.0
    (tmp_path / "in.txt").write_text("the quick brown fox\nhello world\n")
    assert main(["predict", "--model", str(tmp_path / "int8"), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "p.jsonl")]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2


def test_serve_answers_what_predict_and_embed_compute(tuned, tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.serving.server import ServeConfig, build

    best = tuned["modernbert", "classification"] / "best"
    info, operations, app = build(ServeConfig(model=str(best), device="cpu", max_wait_ms=1))
    assert info["task"] == "classification" and [op.path for op in operations] == ["/embed", "/classify"]
    texts = ["the quick brown fox jumps", "hello world"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["predict", "--model", str(best), "--input", str(tmp_path / "in.txt"), "--output",
                 str(tmp_path / "p.jsonl"), "--device", "cpu"]) == 0
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    with TestClient(app) as client:
        classified = client.post("/classify", json={"inputs": texts}).json()["predictions"]
        embedded = np.array(client.post("/embed", json={"inputs": texts}).json()["embeddings"])
    assert [c["label"] for c in classified] == [p["label"] for p in predicted]
    for c, p in zip(classified, predicted):
        assert c["probabilities"] == pytest.approx(p["probabilities"], abs=1e-5)
    np.testing.assert_allclose(embedded, SentenceEncoder.from_pretrained(best, device="cpu").encode(texts),
                               rtol=1e-5, atol=1e-5)


def test_glue_runs_on_a_modernbert_folder(mlm_folders, tmp_path):
    for task in ("rte", "stsb"):
        write_task(tmp_path / "glue", task)
    assert main(["glue", "--model", str(mlm_folders["modernbert"][0]), "--tasks", "rte,stsb", "--gpus", "cpu",
                 "--data", str(tmp_path / "glue"), "--output-dir", str(tmp_path / "runs"), "epochs=1",
                 "batch_size=8", "max_length=32"]) == 0
    results = json.loads((tmp_path / "runs" / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"rte", "stsb"} and not results["failed"]
    assert sorted(results["score_tasks"]) == ["rte", "stsb"] and -100 <= results["score"] <= 100


def test_fill_mask_gives_transformers_top_predictions(mlm_folders, capsys):
    folder, model, tokenizer = mlm_folders["modernbert"]
    text_in = "the quick brown [MASK] jumps over the dog"
    assert main(["fill-mask", "--model", str(folder), "--device", "cpu", "--top-k", "3", "--json", text_in]) == 0
    got = json.loads(capsys.readouterr().out)
    predictions = got["predictions"][0]  # the one mask of the one text
    enc = tokenizer(text_in, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0, enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)]
    top = logits.softmax(-1).topk(3)
    assert [p["token_id"] for p in predictions] == top.indices.tolist()
    assert [p["score"] for p in predictions] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_inputs_far_past_the_window_up_to_the_context(tmp_path_factory, tmp_path):
    """A ModernBERT of 1,024 positions and a +-8 window: fine-tuned at max_length 1024, its
    embeddings of 1,000-token texts equal transformers' (its sdpa mask holds the window)."""
    folder, model, tokenizer = hf_folder(tmp_path_factory, "modernbert", "Model", max_position_embeddings=1024,
                                         local_attention=16)
    rng = random.Random(1)
    long_texts = [text(rng, 400 + 150 * i) for i in range(4)]
    (tmp_path / "long.txt").write_text("\n".join(long_texts) + "\n")
    assert main(["embed", "--model", str(folder), "--input", str(tmp_path / "long.txt"), "--output",
                 str(tmp_path / "v.npy"), "--device", "cpu", "--max-length", "1024"]) == 0
    enc = tokenizer(long_texts, padding=True, truncation=True, max_length=1024, return_tensors="pt")
    assert enc["input_ids"].shape[1] == 1024 and enc["attention_mask"].sum(1).min() > 400
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    keep = enc["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((hidden * keep).sum(1) / keep.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), want, rtol=1e-5, atol=1e-5)

    rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(long_texts))
    (tmp_path / "long.tsv").write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "run"
    assert main(["finetune", "--task", "classification", f"model={folder}", f"train_file={tmp_path / 'long.tsv'}",
                 f"validation_file={tmp_path / 'long.tsv'}", "max_length=1024", "epochs=1", "batch_size=2",
                 f"output_dir={out}", "device=cpu"]) == 0
    assert json.loads((out / "best" / "config.json").read_text())["bert_kit"]["max_length"] == 1024
    assert main(["finetune", "--task", "classification", f"model={folder}", f"train_file={tmp_path / 'long.tsv'}",
                 "max_length=1025", f"output_dir={tmp_path / 'too-long'}", "device=cpu"]) == 2
