"""GLUE, the benchmark the field reports: its nine tasks as distributed, their metrics, the recipe
each is fine-tuned with, and the GLUE score.

    bert-kit glue --model sentence-transformers/all-MiniLM-L6-v2    # every task under $BERT_KIT_DATA/glue
    bert-kit glue --model runs/cram --tasks cola,rte --lrs 1e-4,5e-5 --seeds 1,2,3

`TASKS` is the one table: for each task how its official files are read (the `glue_data` layout
of GLUE's download script, bytes as released: docs/glue.md), what the leaderboard reports and the
recipe. Everything here is plain Python and NumPy; the runs are `bert_kit.tasks.glue_runs`.

Recipe (the defaults; `--lrs`, `--seeds` and key=value settings change them): batch 32,
max_length 128, 10% linear warmup, weight decay 0.01 and 3 epochs as in BERT's paper, but 10
epochs on RTE and STS-B, where 3 epochs are only ~230 and ~540 steps (ELECTRA's recipe); lr auto:
by the encoder's size, as `bert-kit finetune` chooses it (1e-4 up to 60M parameters, such as
all-MiniLM-L6-v2 and bert-small; 5e-5 up to 200M, bert-base; BERT's paper swept {5, 4, 3, 2}e-5).

Figures are dev-set figures x 100, of the model at the end of its last epoch. The GLUE score is
computed as the leaderboard does: a task's paired metrics are averaged first (MRPC and QQP F1 and
accuracy, STS-B Pearson and Spearman, MNLI matched and mismatched accuracy), then the mean over
the tasks. BERT's paper leaves WNLI out (every model of its time scored the majority class), so
both are given: with WNLI and without it. A sweep's figure is the best run's (the papers' "best
on dev"); the median over seeds, at the lr whose median is best, is given beside it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bert_kit.checks import ConfigError, suggestion
from bert_kit.data.tables import Column


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its files, columns, labels, metrics and recipe."""

    name: str  # on the command line and in the results: cola
    title: str  # as the leaderboard writes it, also its folder in glue_data: CoLA
    text: Column  # column of the (first) text: a header name, or a 0-based index without a header
    pair: Column | None  # column of the second text (None: single sentences)
    label: Column  # column of the label (STS-B: the score)
    labels: tuple[str, ...] | None  # class names in id order; the files hold these names or the ids (None: regression)
    metrics: tuple[str, ...]  # what the leaderboard reports, in its order (per dev split, see metric_keys)
    shown: str  # the metric column of the table
    epochs: float
    header: bool = True  # the first line names the columns
    dev: tuple[tuple[str, str], ...] = (("dev", "dev.tsv"),)  # (split, file) scored after training
    malformed: bool = False  # the release has lines of the wrong field count, left out as GLUE's loaders do
    batch_size: int = 32
    max_length: int = 128
    train: str = "train.tsv"

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def metric_keys(self) -> list[str]:
        """The result keys: the metric names, or `metric_split` for a task with several dev files
        (MNLI: accuracy_matched, accuracy_mismatched)."""
        if len(self.dev) == 1:
            return list(self.metrics)
        return [f"{m}_{split}" for split, _ in self.dev for m in self.metrics]


# The nine tasks in the leaderboard's order. Columns as in the official files (and as
# transformers' GLUE processors read them): CoLA has no header (source, label, original
# judgement, sentence); MNLI's train.tsv has 12 columns and its dev files 16 (five annotator
# labels, then gold_label); QQP's train.tsv holds lines broken by a line break inside a question.
TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "CoLA", 3, None, 1, ("unacceptable", "acceptable"), ("mcc",), "MCC", 3, header=False),
    GlueTask("sst2", "SST-2", "sentence", None, "label", ("negative", "positive"), ("accuracy",), "acc", 3),
    GlueTask("mrpc", "MRPC", "#1 String", "#2 String", "Quality", ("not_equivalent", "equivalent"),
             ("f1", "accuracy"), "F1/acc", 3),
    GlueTask("stsb", "STS-B", "sentence1", "sentence2", "score", None, ("pearson", "spearman"), "Pearson/Spearman", 10),
    GlueTask("qqp", "QQP", "question1", "question2", "is_duplicate", ("not_duplicate", "duplicate"),
             ("f1", "accuracy"), "F1/acc", 3, malformed=True),
    GlueTask("mnli", "MNLI", "sentence1", "sentence2", "gold_label", ("entailment", "neutral", "contradiction"),
             ("accuracy",), "m/mm acc", 3, dev=(("matched", "dev_matched.tsv"), ("mismatched", "dev_mismatched.tsv"))),
    GlueTask("qnli", "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",), "acc",
             3),
    GlueTask("rte", "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",), "acc",
             10),
    GlueTask("wnli", "WNLI", "sentence1", "sentence2", "label", ("not_entailment", "entailment"), ("accuracy",), "acc",
             3),
)}
WARMUP_FRACTION, WEIGHT_DECAY = 0.1, 0.01  # BERT's: 10% linear warmup, then linear decay


# ---- which tasks a data folder holds ----------------------------------------------------------

def task_name(word: str) -> str:
    """A task as a user may write it (cola, CoLA, sst-2, STS-B) -> its name in TASKS; an unknown
    one is a ConfigError naming the nearest."""
    name = word.strip().lower().replace("-", "").replace("_", "")
    if name in TASKS:
        return name
    hint = suggestion(name, TASKS)
    raise ConfigError(f"unknown GLUE task {word.strip()!r}{f' ({hint})' if hint else ''}: the tasks are "
                      f"{', '.join(TASKS)}")


def _folder(root: Path, title: str) -> Path:
    """The task's folder under `root`: CoLA/, or the same name in another case or without its dash."""
    wanted = title.lower().replace("-", "")
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.is_dir() and entry.name.lower().replace("-", "").replace("_", "") == wanted:
            return entry
    return root / title


def task_files(root: Path, task: GlueTask) -> tuple[dict[str, Path] | None, str]:
    """({"train": path, split: path, ...}, "") when every file of `task` is under `root`, else
    (None, what is missing)."""
    folder = _folder(root, task.title)
    files = {"train": folder / task.train, **{split: folder / name for split, name in task.dev}}
    absent = [p.name for p in files.values() if not p.is_file()]
    if not folder.is_dir():
        return None, f"no {task.title}/ folder"
    if absent:
        return None, f"{folder.name}/ has no {' or '.join(absent)}"
    return files, ""


def find_tasks(root: Path, wanted: Sequence[str] | None = None) -> tuple[dict[str, dict[str, Path]], dict[str, str]]:
    """({task: files} of the tasks whose files are all there, {task: what is missing} of the
    others), in the leaderboard's order. `wanted` (names): only these, each must be there."""
    present, missing = {}, {}
    for name in [n for n in TASKS if wanted is None or n in wanted]:  # the leaderboard's order
        files, why = task_files(root, TASKS[name])
        if files is None:
            missing[name] = why
        else:
            present[name] = files
    if wanted and missing:
        name, why = next(iter(missing.items()))
        raise ConfigError(f"--tasks {name}: {why} under {root} (docs/glue.md lists each task's files)")
    if not present:
        raise ConfigError(f"no GLUE task files under {root}: expected the glue_data layout, folders such as "
                          f"CoLA/ and SST-2/ holding train.tsv and dev.tsv (docs/glue.md); --data names the folder")
    return present, missing


def malformed_lines(text: str) -> list[int]:
    """Line numbers (1-based) of the non-blank lines whose field count is not the first line's:
    QQP's train.tsv holds pairs broken in two by a line break inside a question; GLUE's loaders
    (transformers' processors, HF datasets) leave those lines out, and so does `bert-kit glue`."""
    lines = text.split("\n")
    width = lines[0].count("\t")
    return [i for i, line in enumerate(lines, start=1) if line.strip() and line.count("\t") != width]


# ---- metrics and the score -------------------------------------------------------------------

def _metric(name: str, predicted: Sequence[Any], gold: Sequence[Any]) -> float:
    from bert_kit.metrics import accuracy, compute_precision_recall_f1, matthews_corrcoef, pearson, spearman

    if name in ("pearson", "spearman"):
        return 100 * (pearson if name == "pearson" else spearman)(predicted, gold)
    classes = max(2, max(gold, default=0) + 1, max(predicted, default=0) + 1)
    if name == "accuracy":
        return 100 * accuracy(gold, predicted)
    if name == "mcc":
        return 100 * matthews_corrcoef(gold, predicted, classes)
    if name == "f1":  # of the positive class, id 1 (equivalent, duplicate), as the leaderboard
        return 100 * float(compute_precision_recall_f1(gold, predicted, classes, average=None)[2][1])
    raise ValueError(f"unknown GLUE metric {name!r}")


def task_metrics(task: GlueTask, outputs: dict[str, tuple[Sequence[Any], Sequence[Any]]]) -> dict[str, float]:
    """{metric key: figure x 100} from {split: (predictions, gold)}: class ids, or scores for STS-B."""
    several = len(task.dev) > 1
    return {f"{m}_{split}" if several else m: _metric(m, *outputs[split])
            for split, _ in task.dev for m in task.metrics}


def task_score(task: GlueTask, metrics: dict[str, float]) -> float:
    """The task's figure in the GLUE score: the mean of its metrics (paired metrics averaged)."""
    return statistics.fmean(metrics[k] for k in task.metric_keys)


def glue_score(scores: dict[str, float], wnli: bool = True) -> tuple[float | None, list[str]]:
    """(mean of the task scores, the tasks it covers) over the tasks in `scores`; wnli=False leaves
    WNLI out, as BERT's paper does. None when no task counts."""
    names = [n for n in TASKS if n in scores and (wnli or n != "wnli")]
    return (statistics.fmean(scores[n] for n in names) if names else None), names


def summarize_task(task: GlueTask, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A task's figures over its runs (each {"lr", "seed", "metrics", ...}): the best run (highest
    task score, the figure papers report from a sweep) and, per lr, the median of each metric over
    the seeds, at the lr whose median task score is highest."""
    scored = [{**{k: v for k, v in r.items() if k != "spec"}, "score": task_score(task, r["metrics"])} for r in runs]
    best = max(scored, key=lambda r: r["score"])  # ties: the first, in the order runs were planned
    medians = []
    for lr in dict.fromkeys(r["lr"] for r in scored):
        group = [r for r in scored if r["lr"] == lr]
        metrics = {k: statistics.median(r["metrics"][k] for r in group) for k in task.metric_keys}
        medians.append({"lr": lr, "seeds": [r["seed"] for r in group], "metrics": metrics,
                        "score": task_score(task, metrics)})
    median = max(medians, key=lambda m: m["score"])
    return {"metrics": best["metrics"], "score": best["score"], "lr": best["lr"], "seed": best["seed"],
            "median": median, "runs": scored, "train_examples": best.get("train_examples"),
            "dev_examples": best.get("dev_examples"), "seconds": sum(r.get("seconds") or 0.0 for r in scored)}


def build_report(model: str, data: str, tasks: dict[str, list[dict[str, Any]]], missing: dict[str, str],
                 failed: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """glue_results.json: each task's summary, the GLUE score with and without WNLI (also of the
    medians), and which tasks are missing or failed. `tasks`: {name: runs}."""
    summaries = {name: summarize_task(TASKS[name], runs) for name, runs in tasks.items() if runs}
    report: dict[str, Any] = {"model": model, "data": data, "tasks": summaries}
    for key, pick in (("score", lambda s: s["score"]), ("median_score", lambda s: s["median"]["score"])):
        scores = {n: pick(s) for n, s in summaries.items()}
        report[key], report[f"{key}_tasks"] = glue_score(scores)
        report[f"{key}_without_wnli"], report[f"{key}_without_wnli_tasks"] = glue_score(scores, wnli=False)
    report["missing"] = dict(missing)
    report["failed"] = dict(failed or {})
    return {**report, **extra}


# ---- the table ------------------------------------------------------------------------------

def _figures(task: GlueTask, metrics: dict[str, float]) -> str:
    return "/".join(f"{metrics[k]:.1f}" for k in task.metric_keys)


def _count(value: Any) -> str:
    if isinstance(value, dict):
        return "/".join(_count(v) for v in value.values())
    return f"{value:,}" if isinstance(value, int) else "-"


def _titles(names: Sequence[str]) -> str:
    return ", ".join(TASKS[n].title for n in names)


def markdown_table(report: dict[str, Any]) -> str:
    """The report as a markdown table (task, metric, dev figure, lr, examples, seconds) and the
    GLUE score lines; a median column when some task ran several seeds."""
    summaries = report["tasks"]
    seeds = any(len(s["median"]["seeds"]) > 1 for s in summaries.values())
    head = ["task", "metric", "dev", *(["median"] if seeds else []), "score", "lr", "train", "dev examples", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summaries.items():
        task = TASKS[name]
        median = [f"{_figures(task, s['median']['metrics'])} ({len(s['median']['seeds'])} seeds)"] if seeds else []
        row = [task.title, task.shown, _figures(task, s["metrics"]), *median, f"{s['score']:.1f}", f"{s['lr']:g}",
               _count(s["train_examples"]), _count(s["dev_examples"]), f"{s['seconds']:.1f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(score_line(report, "score", "GLUE score"))
    if seeds:
        lines.append(score_line(report, "median_score", "median over seeds"))
    if report.get("missing"):
        lines.append("missing: " + "; ".join(f"{TASKS[n].title} ({why})" for n, why in report["missing"].items()))
    if report.get("failed"):
        lines.append("failed: " + "; ".join(f"{TASKS[n].title} ({why})" for n, why in report["failed"].items()))
    return "\n".join(lines)


def score_line(report: dict[str, Any], key: str, label: str) -> str:
    """`GLUE score 71.2 over 9 tasks (CoLA, ...); without WNLI (BERT's convention) 72.3 over 8`."""
    score, names = report[key], report[f"{key}_tasks"]
    if score is None:
        return f"{label}: no task finished"
    line = f"{label} {score:.1f} over {len(names)} task{'s' * (len(names) != 1)} ({_titles(names)})"
    if "wnli" in names:
        other, rest = report[f"{key}_without_wnli"], report[f"{key}_without_wnli_tasks"]
        line += (f"; without WNLI (BERT's convention) {other:.1f} over {len(rest)}" if other is not None
                 else "; without WNLI: no task")
    else:
        line += "; WNLI is not among them"
    return line


def recipe_table() -> str:
    """The recipe of every task as a markdown table (docs/glue.md and `bert-kit glue --help`)."""
    lines = ["| task | files | metric | epochs | batch | max_length | lr |", "|---|---|---|---|---|---|---|"]
    for t in TASKS.values():
        files = ", ".join([t.train] + [name for _, name in t.dev])
        lines.append(f"| {t.title} | {files} | {t.shown} | {t.epochs:g} | {t.batch_size} | {t.max_length} | auto |")
    return "\n".join(lines)
