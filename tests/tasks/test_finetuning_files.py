"""Fine-tuning, evaluating and predicting on files as users have them: a pair file with its own
column names, a 1-5 score range and a split column; a headerless TSV with a byte-order mark and
CRLF line ends; labels written into the text. Tiny random models with MiniLM's vocabulary, a
few steps each: these check that the right rows, labels and scores reach the model.

Run: .venv/bin/python -m pytest tests/tasks/test_finetuning_files.py -q
"""

import csv
import json

import pytest

from bert_kit.cli import main as cli_main
from bert_kit.data.sts import read_sts
from bert_kit.model_folder import read_model_metadata
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tasks.similarity import SimilarityTask
from bert_kit.tokenizer import get_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair_file(data_dir, tmp_path_factory):
    """Real STS-B dev pairs in a user's layout: named columns, scores rescaled to 1-5, a split column
    (every third row is 'test'). Returns (path, {split: [(s1, s2, score)]})."""
    s1, s2, scores = read_sts(data_dir / "stsb" / "sts-dev.csv")
    path = tmp_path_factory.mktemp("pairs") / "relatedness.csv"
    rows = {"train": [], "test": []}
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["pair_id", "text_a", "text_b", "relatedness", "split"])
        for i in range(96):
            split = "test" if i % 3 == 2 else "train"
            score = round(1 + 4 * scores[i] / 5, 3)
            rows[split].append((s1[i], s2[i], score))
            writer.writerow([i, s1[i], s2[i], score, split])
    return path, rows


PAIR_SETTINGS = dict(task="similarity", text_column="text_a", text_pair_column="text_b", label_column="relatedness",
                     similarity={"score_range": [1, 5]}, where={"split": "train"}, validation_where={"split": "test"})


def run_config(tiny_encoder, tmp_path, **kw) -> FinetuneConfig:
    settings = dict(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8, lr=1e-3, log_every=1,
                    precision="fp32", device="cpu", seed=3, max_length=64)
    return FinetuneConfig(**{**settings, **kw})


def test_similarity_on_a_pair_file_with_named_columns_and_a_1_to_5_range(tiny_encoder, pair_file, tmp_path, capsys):
    path, rows = pair_file
    results = finetune(run_config(tiny_encoder, tmp_path, train_file=str(path), validation_file=str(path), max_steps=4,
                                  **PAIR_SETTINGS))
    assert (results["num_train_examples"], results["num_eval_examples"]) == (64, 32)  # the split column, read
    assert results["steps"] == 4 and set(results["best_metrics"]) >= {"pearson", "spearman", "mse"}
    best = tmp_path / "run" / "best"
    assert read_model_metadata(best)["score_range"] == [1.0, 5.0]

    # evaluate reads the same rows through the same flags and scores the best model as the run did
    out = tmp_path / "eval.json"
    assert cli_main(["evaluate", "--model", str(best), "--data", str(path), "--text-column", "text_a",
                     "--text-pair-column", "text_b", "--label-column", "relatedness", "--where", "split=test",
                     "--output", str(out), "--device", "cpu"]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["num_examples"] == 32
    assert metrics["spearman"] == pytest.approx(results["best_metrics"]["spearman"], abs=1e-6)
    assert metrics["mse"] == pytest.approx(results["best_metrics"]["mse"], rel=1e-5)

    # predict: one score per kept pair, in file order
    preds = tmp_path / "preds.jsonl"
    assert cli_main(["predict", "--model", str(best), "--input", str(path), "--output", str(preds),
                     "--text-column", "1", "--text-pair-column", "2", "--header", "--where", "split=test",
                     "--device", "cpu"]) == 0
    records = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [(r["sentence1"], r["sentence2"]) for r in records] == [(a, b) for a, b, _ in rows["test"]]

    # a score outside the declared range is an error naming the line, before any training
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text() + "96,a,b,0.4,train\n", encoding="utf-8")
    code = cli_main(["finetune", f"model={tiny_encoder}", f"train_file={bad}", f"output_dir={tmp_path / 'bad_run'}",
                     "task=similarity", "text_column=text_a", "text_pair_column=text_b", "label_column=relatedness",
                     "similarity.score_range=[1, 5]", "max_steps=1", "device=cpu"])
    assert code == 2
    assert f"{bad}:98: score '0.4' is outside the score range [1, 5]" in capsys.readouterr().err


def test_bi_encoder_targets_use_the_declared_range(tiny_encoder, pair_file, tmp_path):
    path, rows = pair_file
    task = SimilarityTask(run_config(tiny_encoder, tmp_path, **{**PAIR_SETTINGS, "similarity": {
        "mode": "bi-encoder", "score_range": [1, 5]}}))
    task.bind(get_tokenizer(tiny_encoder))
    items = task.read_train(path)
    expected = [(score - 1) / 4 for _, _, score in rows["train"]]
    assert [it["labels"] for it in items] == pytest.approx(expected, abs=1e-12)
    assert min(it["labels"] for it in items) >= 0 and max(it["labels"] for it in items) <= 1


def test_classification_from_a_headerless_bom_crlf_tsv_and_labels_in_the_text(tiny_encoder, data_dir, tmp_path):
    lines = (data_dir / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:61]
    examples = [(text.strip(), "pos" if label == "1" else "neg") for text, label in (ln.split("\t") for ln in lines)]
    train = tmp_path / "train.tsv"  # label first, text second, no header: as exported by a spreadsheet
    train.write_bytes("\ufeff".encode() + "".join(f"{y}\t{t}\r\n" for t, y in examples[:40]).encode())
    dev = tmp_path / "dev.txt"  # labels written into the text
    dev.write_text("".join(f"__label__{y} {t}\n" for t, y in examples[40:]), encoding="utf-8")
    pattern = r"__label__(?P<label>\w+) (?P<text>.*)"
    results = finetune(run_config(tiny_encoder, tmp_path, train_file=str(train), text_column=1, label_column=0,
                                  max_steps=3))
    assert results["num_train_examples"] == 40
    best = tmp_path / "run" / "best"
    assert read_model_metadata(best)["label_names"] == ["neg", "pos"]

    out = tmp_path / "eval.json"
    assert cli_main(["evaluate", "--model", str(best), "--data", str(dev), "--label-pattern", pattern,
                     "--output", str(out), "--device", "cpu"]) == 0
    metrics = json.loads(out.read_text())
    preds = tmp_path / "preds.jsonl"
    assert cli_main(["predict", "--model", str(best), "--input", str(dev), "--label-pattern", pattern,
                     "--output", str(preds), "--device", "cpu"]) == 0
    records = [json.loads(line) for line in preds.read_text().splitlines()]
    assert [r["text"] for r in records] == [t for t, _ in examples[40:]]  # the label prefix is not scored
    accuracy = sum(r["label"] == y for r, (_, y) in zip(records, examples[40:])) / 20
    assert metrics["num_examples"] == 20 and metrics["accuracy"] == pytest.approx(accuracy)


@pytest.mark.parametrize("task,kind", [("classification", "classification file"), ("similarity", "STS file"),
                                       ("token-classification", "CoNLL file"), ("qa", "SQuAD file")])
def test_a_missing_data_file_is_named_with_its_setting(task, kind, minilm_path, tmp_path):
    """The readers' own errors name the file and the setting that named it (a file can vanish after
    the run config's checks, and the Python API reads through them too)."""
    from bert_kit.tasks import make_task

    settings = FinetuneConfig(task=task)
    settings.train_file, settings.validation_file = str(tmp_path / "train.x"), str(tmp_path / "dev.x")
    t = make_task(task, settings)
    t.bind(get_tokenizer(minilm_path))
    t.label_names, t.num_labels = ["O", "B-PER"], 2  # as read_train leaves them
    with pytest.raises(FileNotFoundError, match=rf"^{kind} \(train_file\) not found: .*train.x$"):
        t.read_train(settings.train_file)
    with pytest.raises(FileNotFoundError, match=rf"^{kind} \(validation_file\) not found: .*dev.x$"):
        t.read_eval(settings.validation_file)
    with pytest.raises(FileNotFoundError, match=rf"^{kind} is a folder, not a file: "):
        t.read_eval(str(tmp_path))
