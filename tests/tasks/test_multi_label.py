"""Multi-label classification end to end, on slices of GoEmotions as distributed: fine-tune (sigmoid
outputs, BCE, tuned thresholds), the folder transformers loads the same, evaluate against
scikit-learn, predict, the Python API, /classify and the exported ONNX graph; class weights and the
warning about rare classes, for single- and multi-label.

Tiny models are random 2-layer, width-32 BERTs with MiniLM's vocabulary.
Run: .venv/bin/python -m pytest tests/tasks/test_multi_label.py -q -n 0
"""

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main as cli_main
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tokenizer import get_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def goemotions(data_dir, tmp_path_factory):
    """(train.tsv with 160 rows, dev.tsv with 60 rows, emotions.txt): GoEmotions' files, cut."""
    folder = tmp_path_factory.mktemp("goemotions")
    for name, n in (("train.tsv", 160), ("dev.tsv", 60)):
        lines = (data_dir / "goemotions" / name).read_text(encoding="utf-8").splitlines()
        (folder / name).write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    return folder / "train.tsv", folder / "dev.tsv", data_dir / "goemotions" / "emotions.txt"


def config(tiny_encoder, out, train, dev, names, **kw) -> FinetuneConfig:
    settings = dict(model=str(tiny_encoder), output_dir=str(out), batch_size=16, lr=1e-3, precision="fp32",
                    device="cpu", seed=3, train_file=str(train), validation_file=str(dev), text_column=0,
                    label_column=1, header=False, log_every=1,
                    classification={"label_names_file": str(names), "multi_label": True})
    settings.update(kw)
    return FinetuneConfig(**settings)


@pytest.fixture(scope="module")
def run(tiny_encoder, goemotions, tmp_path_factory):
    """A short multi-label fine-tune with thresholds tuned on the validation set: (results, run folder)."""
    train, dev, names = goemotions
    out = tmp_path_factory.mktemp("multi") / "run"
    cfg = config(tiny_encoder, out, train, dev, names, max_steps=6, eval_every=3,
                 classification={"label_names_file": str(names), "threshold": "tune", "multi_label": True})
    return finetune(cfg), out


def test_the_run_picks_best_by_macro_f1_and_saves_problem_type_and_thresholds(run, goemotions):
    results, out = run
    assert results["metric"] == "f1" and [h["step"] for h in results["history"]] == [3, 6]
    history = results["history"][0]
    for key in ("f1", "f1_micro", "f1_samples", "precision_samples", "subset_accuracy", "hamming_loss", "loss",
                "f1_admiration", "f1_neutral"):
        assert isinstance(history[key], float)
    config_json = json.loads((out / "best" / "config.json").read_text())
    names = goemotions[2].read_text().split("\n")
    assert config_json["problem_type"] == "multi_label_classification"
    assert config_json["id2label"] == {str(i): n for i, n in enumerate(names)}
    thresholds = config_json["bert_kit"]["thresholds"]
    assert len(thresholds) == 28 and all(round(t * 20) == t * 20 and 0 < t < 1 for t in thresholds)


def test_transformers_loads_the_folder_as_multi_label_and_computes_the_same_loss(run):
    transformers = pytest.importorskip("transformers")
    _, out = run
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out / "best").eval()
    assert hf.config.problem_type == "multi_label_classification"
    ours = BERTForSequenceClassification.from_pretrained(out / "best").eval()
    enc = get_tokenizer(out / "best")(["I love this so much", "that is awful and sad", "ok"])
    targets = torch.zeros(3, 28)
    targets[0, [0, 17]] = targets[1, [2, 25]] = 1.0
    from bert_kit.training.losses import compute_multi_label_loss

    with torch.no_grad():
        got = hf(**enc, labels=targets)  # transformers' BCEWithLogitsLoss, as problem_type asks
        logits = ours(**enc)
    assert_close(got.logits, logits, rtol=1e-5, atol=1e-5)
    assert_close(got.loss, compute_multi_label_loss(logits, targets), rtol=1e-6, atol=1e-6)


def predicted_sets(folder, texts):
    """(sigmoid probabilities (N, C), thresholds (C,)) of the folder's model, computed here."""
    model = BERTForSequenceClassification.from_pretrained(folder).eval()
    enc = get_tokenizer(folder)(texts, max_length=128)
    with torch.no_grad():
        probs = torch.sigmoid(model(**enc)).numpy()
    return probs, np.asarray(json.loads((folder / "config.json").read_text())["bert_kit"]["thresholds"])


def test_evaluate_scores_the_saved_thresholds_as_scikit_learn(run, goemotions, tmp_path, data_dir):
    import sklearn.metrics as skm

    _, out = run
    dev = goemotions[1]
    assert cli_main(["evaluate", "--model", str(out / "best"), "--data", str(dev),
                     "--output", str(tmp_path / "eval.json")]) == 0
    metrics = json.loads((tmp_path / "eval.json").read_text())
    rows = [line.split("\t") for line in dev.read_text(encoding="utf-8").splitlines()]
    gold = np.zeros((len(rows), 28), dtype=int)
    for i, row in enumerate(rows):
        gold[i, [int(x) for x in row[1].split(",")]] = 1
    probs, thresholds = predicted_sets(out / "best", [row[0] for row in rows])
    predicted = (probs >= thresholds).astype(int)
    assert metrics["f1"] == pytest.approx(skm.f1_score(gold, predicted, average="macro", zero_division=0), abs=1e-6)
    assert metrics["f1_micro"] == pytest.approx(skm.f1_score(gold, predicted, average="micro", zero_division=0),
                                                abs=1e-6)
    assert metrics["f1_samples"] == pytest.approx(skm.f1_score(gold, predicted, average="samples", zero_division=0),
                                                  abs=1e-6)
    assert metrics["subset_accuracy"] == pytest.approx(skm.accuracy_score(gold, predicted), abs=1e-6)
    assert metrics["num_examples"] == 60 and "confusion_matrix" not in metrics


def test_predict_the_python_api_and_classify_write_label_sets_and_sigmoid_probabilities(run, tmp_path):
    from bert_kit.serving.operations import Classify, load_torch
    from bert_kit.tasks.inference import TextClassifier

    _, out = run
    texts = ["I love this so much", "that is awful and sad", "ok"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert cli_main(["predict", "--model", str(out / "best"), "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / "preds.jsonl")]) == 0
    preds = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    probs, thresholds = predicted_sets(out / "best", texts)
    names = list(preds[0]["probabilities"])
    for p, row in zip(preds, probs):
        ids = [j for j in range(28) if row[j] >= thresholds[j]]
        assert p["label_ids"] == ids and p["labels"] == [names[j] for j in ids] and "label" not in p
        assert_close(torch.tensor(list(p["probabilities"].values())), torch.tensor(row), rtol=0, atol=2e-6)
    api = TextClassifier.from_pretrained(out / "best", device="cpu").predict(texts)
    assert [r["labels"] for r in api] == [p["labels"] for p in preds]
    _, ops = load_torch(out / "best", device="cpu")
    classify = next(op for op in ops if isinstance(op, Classify))
    served = classify.run(classify.prepare(texts, {}))
    assert [r["labels"] for r in served] == [p["labels"] for p in preds]
    assert_close(torch.tensor([list(r["probabilities"].values()) for r in served]), torch.tensor(probs),
                 rtol=0, atol=2e-6)


def test_an_exported_multi_label_folder_predicts_the_same_sets(run, tmp_path):
    pytest.importorskip("onnxruntime")
    from bert_kit.onnx_export import export_onnx

    _, out = run
    export_onnx(out / "best", tmp_path / "onnx")
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["problem_type"] == "multi_label_classification"
    texts = ["I love this so much", "that is awful and sad", "ok"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    for folder, name in ((out / "best", "torch.jsonl"), (tmp_path / "onnx", "onnx.jsonl")):
        assert cli_main(["predict", "--model", str(folder), "--input", str(tmp_path / "in.txt"),
                         "--output", str(tmp_path / name)]) == 0
    torch_preds, onnx_preds = ([json.loads(line) for line in (tmp_path / n).read_text().splitlines()]
                               for n in ("torch.jsonl", "onnx.jsonl"))
    for a, b in zip(torch_preds, onnx_preds):
        assert a["labels"] == b["labels"]
        assert_close(torch.tensor(list(a["probabilities"].values())), torch.tensor(list(b["probabilities"].values())),
                     rtol=0, atol=1e-4)
    int8 = export_onnx(out / "best", tmp_path / "int8", quantize="int8")  # reports each label's decisions
    assert int8.int8_check["logits"]["same_labels"] > 0.9


def test_best_keeps_the_thresholds_of_its_own_evaluation(tiny_encoder, goemotions, tmp_path, monkeypatch):
    """best/ is written in a thread while the next steps run; a later evaluation tunes other
    thresholds: the folder holds those of the evaluation that chose its weights."""
    from bert_kit.tasks.classification import ClassificationTask

    train, dev, names = goemotions
    plan = iter([(0.9, 0.1), (0.2, 0.9), (0.1, 0.3)])  # (f1, every threshold) of each evaluation

    def score_sets(self, logits, gold):
        f1, threshold = next(plan)
        self.thresholds = [threshold] * self.num_labels
        return {"f1": f1, "per_class": []}

    monkeypatch.setattr(ClassificationTask, "score_sets", score_sets)
    results = finetune(config(tiny_encoder, tmp_path / "run", train, dev, names, max_steps=3, eval_every=1))
    assert results["best_step"] == 1
    saved = json.loads((tmp_path / "run" / "best" / "config.json").read_text())["bert_kit"]["thresholds"]
    assert saved == [0.1] * 28


def test_class_weights_balanced_as_scikit_learn_and_rare_classes_named(tiny_encoder, goemotions, tmp_path, capsys):
    from sklearn.utils.class_weight import compute_class_weight

    from bert_kit.tasks.classification import ClassificationTask

    train, dev, names = goemotions
    # single-label: the first label of each row as its class
    single = tmp_path / "single.tsv"
    rows = [line.split("\t") for line in train.read_text(encoding="utf-8").splitlines()]
    single.write_text("".join(f"{r[0]}\t{r[1].split(',')[0]}\n" for r in rows), encoding="utf-8")
    cfg = config(tiny_encoder, tmp_path / "s", single, single, names,
                 classification={"label_names_file": str(names), "class_weights": "balanced", "multi_label": False})
    task = ClassificationTask(cfg)
    task.bind(get_tokenizer(tiny_encoder))
    task.read_train(single)
    classes = np.array([int(r[1].split(",")[0]) for r in rows])
    seen = np.unique(classes)
    expected = compute_class_weight("balanced", classes=seen, y=classes) * len(seen) / 28  # over all 28 classes
    assert_close(torch.tensor(task.class_weights, dtype=torch.float64)[seen], torch.tensor(expected), rtol=1e-12,
                 atol=0)
    err = capsys.readouterr().err
    assert "classes are on fewer than 1% of the 160 training rows" in err and "nervousness 0 (0%)" in err
    # multi-label: pos_weight = negatives / positives of each label
    cfg = config(tiny_encoder, tmp_path / "m", train, dev, names,
                 classification={"label_names_file": str(names), "class_weights": "balanced", "multi_label": True})
    task = ClassificationTask(cfg)
    task.bind(get_tokenizer(tiny_encoder))
    items = task.read_train(train)
    positives = torch.tensor([it["labels"] for it in items], dtype=torch.float64).sum(0)
    expected = torch.where(positives > 0, (160 - positives) / positives.clamp(min=1), 1.0)
    assert_close(torch.tensor(task.class_weights, dtype=torch.float64), expected, rtol=1e-12, atol=0)
    assert "labels are on fewer than 1% of the 160 training rows" in capsys.readouterr().err
    # the loss is BCE with that pos_weight, as torch's BCEWithLogitsLoss
    logits, targets = torch.randn(4, 28), torch.tensor([it["labels"] for it in items[:4]])
    from bert_kit.training.losses import compute_multi_label_loss

    reference = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(task.class_weights, dtype=torch.float32))
    assert_close(compute_multi_label_loss(logits, targets, task.weights_on(torch.device("cpu"))),
                 reference(logits, targets), rtol=1e-6, atol=1e-6)


def test_the_rare_classes_warning_advises_only_what_is_not_set(capsys):
    from bert_kit.tasks.classification import warn_rare_classes

    counts = np.array([500, 2])
    warn_rare_classes("t.tsv", ["common", "grief"], counts, 502, multi_label=False)
    err = capsys.readouterr().err
    assert "grief 2 (0.4%); to weigh them in: classification.class_weights=balanced, and choose best/" in err
    warn_rare_classes("t.tsv", ["common", "grief"], counts, 502, multi_label=False, weighted=True)
    err = capsys.readouterr().err
    assert "to weigh them in: choose best/ by a metric that sees them (metric=f1" in err and "class_weights" not in err
    warn_rare_classes("t.tsv", ["common", "grief"], counts, 502, multi_label=True, weighted=True, metric="f1_grief")
    assert capsys.readouterr().err.rstrip().endswith("grief 2 (0.4%)")


def test_a_weighted_multi_label_run_trains_and_a_list_must_match_the_labels(tiny_encoder, goemotions, tmp_path,
                                                                           capsys):
    from bert_kit.checks import ConfigError

    train, dev, names = goemotions
    results = finetune(config(tiny_encoder, tmp_path / "run", train, dev, names, max_steps=2,
                              classification={"label_names_file": str(names), "class_weights": [2.0] * 28,
                                              "multi_label": True},
                              metric="f1_joy", early_stopping_patience=3))
    assert results["metric"] == "f1_joy" and "f1_joy" in results["best_metrics"]
    assert "class_weights: pos_weight admiration 2, amusement 2, anger 2," in capsys.readouterr().err  # as given
    with pytest.raises(ConfigError, match="class_weights holds 3 weights for 28 classes"):
        config(tiny_encoder, tmp_path / "r2", train, dev, names,
               classification={"label_names_file": str(names), "class_weights": [1, 2, 3]})
    with pytest.raises(ConfigError, match="metric='f1_jo' is not a validation metric.*did you mean 'f1_joy'"):
        config(tiny_encoder, tmp_path / "r3", train, dev, names, metric="f1_jo")


def test_label_columns_train_and_evaluate_reads_them_as_recorded(tiny_encoder, tmp_path):
    """One 0/1 column per label (SemEval, Jigsaw): detected as multi-label, the columns named the
    labels; the folder records the columns, so evaluate reads the same layout unasked."""
    rows = ["id,comment,toxic,insult,threat"] + [
        f"{i},{'you are awful' if i % 2 else 'have a nice day'} {i},{i % 2},{int(i % 4 == 1)},{int(i % 10 == 3)}"
        for i in range(40)]
    path = tmp_path / "train.csv"
    path.write_text("\n".join(rows) + "\n")
    cfg = FinetuneConfig(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8, lr=1e-3,
                         precision="fp32", device="cpu", seed=3, train_file=str(path), validation_file=str(path),
                         text_column="comment", max_steps=3,
                         classification={"label_columns": ["toxic", "insult", "threat"]})
    results = finetune(cfg)
    assert results["metric"] == "f1"
    meta = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert meta["id2label"] == {"0": "toxic", "1": "insult", "2": "threat"}
    assert meta["bert_kit"]["data"]["label_columns"] == ["toxic", "insult", "threat"]
    assert cli_main(["evaluate", "--model", str(tmp_path / "run" / "best"), "--data", str(path),
                     "--output", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["num_examples"] == 40


def test_a_single_label_model_refuses_a_file_of_label_sets(tiny_encoder, tmp_path, capsys):
    rows = "".join(f"{'good' if i % 2 else 'bad'} film {i}\t{'pos' if i % 2 else 'neg'}\n" for i in range(24))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (tmp_path / "sets.tsv").write_text("sentence\tlabel\na\tpos,neg\nb\tneg,pos\nc\tpos\n")
    finetune(FinetuneConfig(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8, lr=1e-3,
                            precision="fp32", device="cpu", train_file=str(tmp_path / "train.tsv"), max_steps=1))
    assert cli_main(["evaluate", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "sets.tsv"),
                     "--output", str(tmp_path / "eval.json")]) == 2  # a data error: one line, exit 2
    assert "sets.tsv holds several labels per row (2 of 3 rows hold lists separated by ',') but the model " \
           "predicts one label per text" in capsys.readouterr().err


@pytest.mark.parametrize("threshold", [0.3, "tune"])
def test_a_threshold_for_a_file_of_one_label_per_row_is_refused(tiny_encoder, tmp_path, threshold):
    """A softmax classifier predicts its most probable class: a threshold would be silently unused."""
    rows = "".join(f"{'good' if i % 2 else 'bad'} film {i}\t{'pos' if i % 2 else 'neg'}\n" for i in range(24))
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows)
    with pytest.raises(ValueError, match=rf"classification.threshold={threshold} applies to several labels per "
                                         r"text .* but \S*train.tsv holds one label per row"):
        finetune(FinetuneConfig(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8,
                                precision="fp32", device="cpu", train_file=str(tmp_path / "train.tsv"), max_steps=1,
                                classification={"threshold": threshold}))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_weighted_multi_label_run_in_cuda_graphs_and_windows(tiny_encoder, goemotions, tmp_path):
    """The GPU path: bf16, each step replayed as a CUDA graph (cuda_graphs: auto), class weights
    made once on the device, and long texts in windows; the run ends with finite figures."""
    train, dev, names = goemotions
    results = finetune(config(tiny_encoder, tmp_path / "run", train, dev, names, device="cuda", precision="bf16",
                              max_steps=12, eval_every=6, max_length=32,
                              classification={"label_names_file": str(names), "multi_label": True, "threshold": "tune",
                                              "class_weights": "balanced", "long_text": "chunks"}))
    assert results["steps"] == 12 and np.isfinite(results["train_loss"])
    assert results["history"][-1]["num_examples"] == 60  # texts, not windows


def test_multi_label_steps_of_the_finetuning_recipe_match_the_transformers_loop(minilm_path, goemotions):
    """Real MiniLM, five AdamW steps of BCE over GoEmotions' 28 labels with the optimizer fine-tuning
    builds from its default settings (as the torch engine does) and the `transformers` loop of
    benchmarks/hf_finetune.py (problem_type multi_label_classification, torch's AdamW defaults, as
    HF's Trainer): the same losses and the same weights after (dropout off, fp32). Gradients of a
    loss averaged over 28 outputs are ~1e-6 in the encoder: an Adam epsilon of 1e-6 shrank those
    updates by a quarter and cost GoEmotions macro F1."""
    transformers = pytest.importorskip("transformers")
    from bert_kit.tasks.classification import ClassificationTask
    from bert_kit.training.optim import create_optimizer

    train, _, names = goemotions
    cfg = FinetuneConfig(model=str(minilm_path), train_file=str(train), text_column=0, label_column=1, header=False,
                         lr=1e-4, precision="fp32", device="cpu",
                         classification={"label_names_file": str(names), "multi_label": True})
    task = ClassificationTask(cfg)
    task.bind(get_tokenizer(minilm_path))
    items = task.read_train(train)[:80]
    torch.manual_seed(0)
    ours = task.build(minilm_path).eval()  # eval(): dropout off; gradients still flow
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        minilm_path, num_labels=28, problem_type="multi_label_classification", dtype=torch.float32).eval()
    hf.classifier.load_state_dict({"weight": ours.classifier.weight.detach(), "bias": ours.classifier.bias.detach()})
    start = ours.bert.encoder.layers[2].ffn.up.weight.detach().clone()
    opt_ours = create_optimizer(ours, cfg.optimizer, cfg.lr, cfg.weight_decay, tuple(cfg.betas), cfg.eps, "cpu")
    no_decay = [p for n, p in hf.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in hf.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    opt_hf = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=1e-4)
    for i in range(5):
        batch = task.collate(items[16 * i: 16 * i + 16])
        loss_ours = task.loss(ours, batch)[0]
        loss_hf = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch["token_type_ids"], labels=batch["labels"]).loss
        assert_close(loss_ours, loss_hf, rtol=1e-4, atol=1e-6, msg=f"step {i}")
        for model, loss, opt in ((ours, loss_ours, opt_ours), (hf, loss_hf, opt_hf)):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            opt.step()
            opt.zero_grad()
    moved_ours = ours.bert.encoder.layers[2].ffn.up.weight.detach() - start
    moved_hf = hf.bert.encoder.layer[2].intermediate.dense.weight.detach() - start
    assert moved_hf.abs().mean() > 1e-5  # the steps moved the encoder: the comparison is not of zeros
    assert_close(moved_ours, moved_hf, rtol=2e-2, atol=2e-6)
