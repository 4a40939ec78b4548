"""Long texts in windows (`classification.long_text: chunks`): every window trained on with its
text's label; evaluation, predict, the Python API and /classify pool a text's window logits (mean
or max) into one prediction; the folder records how, and evaluate may ask for it.

Tiny models are random 2-layer, width-32 BERTs with MiniLM's vocabulary.
Run: .venv/bin/python -m pytest tests/tasks/test_long_documents.py -q -n 0
"""

import json

import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.tasks.classification import pool_windows
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tokenizer import get_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_pool_windows_takes_the_mean_or_the_max_of_each_texts_windows():
    logits = torch.tensor([[1.0, -2.0], [3.0, 0.0], [5.0, 4.0], [-1.0, 2.0], [0.5, 0.5]])  # (N=5, C=2)
    documents = [0, 0, 1, 2, 2]
    assert_close(pool_windows(logits, documents, "mean"), torch.tensor([[2.0, -1.0], [5.0, 4.0], [-0.25, 1.25]]),
                 rtol=0, atol=0)
    assert_close(pool_windows(logits, documents, "max"), torch.tensor([[3.0, 0.0], [5.0, 4.0], [0.5, 2.0]]),
                 rtol=0, atol=0)


@pytest.fixture(scope="module")
def documents(data_dir, tmp_path_factory):
    """A TSV of 24 'documents' of SST-2 sentences (8 each, 50 to 150 tokens) labelled by their first
    sentence, and a copy of its first 8 rows."""
    rows = [line.split("\t") for line in (data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    folder = tmp_path_factory.mktemp("documents")
    docs = [(" ".join(r[0].strip() for r in rows[8 * i: 8 * i + 8]), rows[8 * i][1]) for i in range(24)]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in docs))
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in docs[:8]))
    return folder / "train.tsv", folder / "dev.tsv", [t for t, _ in docs[:8]]


def run_config(tiny_encoder, out, train, dev, **kw) -> FinetuneConfig:
    settings = dict(model=str(tiny_encoder), output_dir=str(out), batch_size=8, lr=1e-3, precision="fp32",
                    device="cpu", seed=3, train_file=str(train), validation_file=str(dev), max_length=32,
                    max_steps=4, eval_every=2, label_names=["negative", "positive"])
    return FinetuneConfig(**{**settings, **kw})


@pytest.fixture(scope="module")
def chunked(tiny_encoder, documents, tmp_path_factory):
    train, dev, _ = documents
    out = tmp_path_factory.mktemp("chunks") / "run"
    results = finetune(run_config(tiny_encoder, out, train, dev, classification={
        "long_text": "chunks", "chunk_stride": 8, "chunk_pooling": "max"}))
    return results, out


def windows_of(folder, texts, max_length=32, stride=8):
    """(N windows, C) logits of the folder's model, and each window's text, computed here."""
    tokenizer = get_tokenizer(folder)
    enc = tokenizer(texts, max_length=max_length, stride=stride, return_overflowing_tokens=True)
    model = BERTForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    return logits, enc["overflow_to_sample_mapping"]


def test_training_reads_every_window_and_evaluation_scores_each_text_once(chunked, documents, capsys):
    results, out = chunked
    assert results["num_eval_examples"] > 8 * 3  # the items are windows...
    assert results["history"][0]["num_examples"] == 8  # ...scored as the 8 texts they came from
    meta = json.loads((out / "best" / "config.json").read_text())["bert_kit"]
    assert meta["long_text"] == {"mode": "chunks", "stride": 8, "pooling": "max"}


def test_predict_pools_the_windows_and_says_how_many_each_text_took(chunked, documents, tmp_path):
    from bert_kit.serving.operations import Classify, load_torch
    from bert_kit.tasks.inference import TextClassifier

    _, out = chunked
    texts = documents[2][:4] + ["short"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert cli_main(["predict", "--model", str(out / "best"), "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "preds.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    logits, doc = windows_of(out / "best", texts)
    pooled = pool_windows(logits, doc, "max")
    assert [p["windows"] for p in preds] == torch.bincount(torch.tensor(doc)).tolist()
    assert preds[-1]["windows"] == 1 and all(p["windows"] > 1 for p in preds[:4])
    assert not any(p["truncated"] for p in preds)
    for p, row in zip(preds, pooled):
        assert p["label"] == ["negative", "positive"][int(row.argmax())]
        assert p["probabilities"]["positive"] == pytest.approx(float(row.softmax(-1)[1]), abs=1e-5)
    api = TextClassifier.from_pretrained(out / "best", device="cpu").predict(texts)
    assert [(r["label"], r["windows"]) for r in api] == [(p["label"], p["windows"]) for p in preds]
    _, ops = load_torch(out / "best", device="cpu")
    classify = next(op for op in ops if isinstance(op, Classify))
    served = classify.run(classify.prepare(texts, {}))
    assert [(r["label"], r["windows"]) for r in served] == [(p["label"], p["windows"]) for p in preds]
    assert_close(torch.tensor([r["probabilities"]["positive"] for r in served]),
                 torch.tensor([p["probabilities"]["positive"] for p in preds]), rtol=0, atol=1e-5)


def test_evaluate_pools_as_the_folder_says_or_as_asked(chunked, documents, tmp_path):
    _, out = chunked
    dev = documents[1]
    for flags, name in (([], "recorded"), (["--long-text", "truncate"], "truncated"),
                        (["--chunk-pooling", "mean"], "mean")):
        assert cli_main(["evaluate", "--model", str(out / "best"), "--data", str(dev), "--output",
                         str(tmp_path / f"{name}.json"), *flags]) == 0
    recorded, truncated, mean = (json.loads((tmp_path / f"{n}.json").read_text())
                                 for n in ("recorded", "truncated", "mean"))
    logits, doc = windows_of(out / "best", documents[2])
    gold = torch.tensor([int(line.split("\t")[1]) for line in dev.read_text().splitlines()[1:]])
    for metrics, pooled in ((recorded, pool_windows(logits, doc, "max")), (mean, pool_windows(logits, doc, "mean")),
                            (truncated, logits[[doc.index(i) for i in range(8)]])):  # the first window of each
        assert metrics["num_examples"] == 8
        assert metrics["accuracy"] == pytest.approx(float((pooled.argmax(-1) == gold).float().mean()), abs=1e-9)


def test_window_flags_for_a_truncated_reading_are_refused(chunked, documents, tmp_path, capsys):
    _, out = chunked
    assert cli_main(["evaluate", "--model", str(out / "best"), "--data", str(documents[1]), "--output",
                     str(tmp_path / "e.json"), "--long-text", "truncate", "--chunk-stride", "4"]) == 2
    assert "--chunk-stride sets how long texts are read in windows, but --long-text truncate asks to cut them" in (
        capsys.readouterr().err)
    assert not (tmp_path / "e.json").exists()


def test_chunks_of_short_texts_are_the_texts_themselves(tiny_encoder, documents, tmp_path):
    """Texts that fit one window: chunks trains and scores exactly as truncation does."""
    train, dev, _ = documents
    short = dict(max_length=256, max_steps=2, eval_every=2)
    truncated = finetune(run_config(tiny_encoder, tmp_path / "t", train, dev, **short))
    chunks = finetune(run_config(tiny_encoder, tmp_path / "c", train, dev, **short,
                                 classification={"long_text": "chunks"}))
    assert chunks["history"][0]["accuracy"] == truncated["history"][0]["accuracy"]
    assert chunks["history"][0]["loss"] == pytest.approx(truncated["history"][0]["loss"], abs=1e-6)


def test_a_stride_must_leave_room_in_a_window():
    from bert_kit.checks import ConfigError

    with pytest.raises(ConfigError, match=r"chunk_stride=40 is out of range: .* expected an integer < 29"):
        FinetuneConfig(max_length=32, classification={"long_text": "chunks", "chunk_stride": 40})


def test_a_pairs_first_text_too_long_for_its_windows_is_named_by_its_line(tiny_encoder, tmp_path):
    """Windows of pairs run over the second text: a first text that fills the window is an error
    naming its file and line (the tokenizer alone fails naming no row)."""
    rows = [("a short premise .", "a hypothesis", "yes"), ("word " * 40, "another hypothesis", "no"),
            ("fine", "fine too", "yes")]
    path = tmp_path / "pairs.tsv"
    path.write_text("premise\thypothesis\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    config = run_config(tiny_encoder, tmp_path / "run", path, path, label_names=["no", "yes"],
                        text_column="premise", text_pair_column="hypothesis",
                        classification={"long_text": "chunks", "chunk_stride": 4})
    with pytest.raises(ValueError, match=r"pairs\.tsv:3: its first text holds 40 tokens, which leaves 0 of a window "
                                         r"of max_length 32 to the second; .* chunk_stride 4"):
        finetune(config)
