"""Hyperparameter search: `bert-kit tune --config RUN.yaml --trials N`, with Optuna.

RUN.yaml is a fine-tuning config with a `search:` block naming the ranges to search:

    search:
      lr: loguniform(1e-5, 3e-4)      # a float, sampled on a log scale
      warmup_fraction: uniform(0, 0.2)
      epochs: int(1, 4)               # an integer (logint(a, b): on a log scale)
      batch_size: [16, 32]            # one of these values
      lora.r: [4, 8, 16]              # any setting, a group's too

Each trial is a normal fine-tuning run (the one training loop) in its own run folder,
STUDY/trial-0003/, with the sampled settings; its objective is the run's best validation metric
(`metric`, else the task's; maximised, or minimised for a loss). A tracker (`TrialReporter`)
hands each evaluation to the trial, and when Optuna's pruner says the trial is behind the others
at that step, the run ends there (`stop_reason` in its results.json; the trial is PRUNED).

The study folder (`--study`, default the config's output_dir) holds Optuna's SQLite storage
(study.db): rerunning the command continues the study up to N finished trials, with the settings
its trials ran with (`check_same_settings`). Trials that report to MLflow share one store there
(mlflow.db) and one experiment, named as the study folder.
Ctrl-C stops the running trial as it stops any run (a checkpoint); the study records it as
interrupted, and the next `bert-kit tune` resumes that trial's run from its checkpoint first. A
trial stopped by an error every trial would meet (a setting, the data) fails the command; it is
listed FAIL, neither resumed nor counted, and the study continues once the settings are fixed.
At the end (and when interrupted) the study folder gets best.yaml (the best trial's settings: a
config ready for `bert-kit finetune --config`), trials.tsv, and optimization_history.png where
matplotlib is installed; the command prints the table of trials.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError, PlainText, resolve_plain
from bert_kit.metrics import higher_is_better
from bert_kit.outputs import write_text
from bert_kit.tasks.finetuning_config import FinetuneConfig
from bert_kit.training.runconfig import apply_overrides, config_from_dict, read_yaml, save_config

STORAGE, BEST, TABLE, PLOT = "study.db", "best.yaml", "trials.tsv", "optimization_history.png"
STUDY_NAME = "bert-kit"
_RANGE = re.compile(r"^\s*(uniform|loguniform|int|logint)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$")


@dataclasses.dataclass(frozen=True)
class Range:
    """One setting's range: a float or an integer interval (log scale or not), or a list of choices."""

    kind: str  # uniform, loguniform, int, logint, or choice
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()

    def distribution(self) -> Any:
        """Optuna's distribution of this range."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(self.choices)
        if self.kind in ("int", "logint"):
            return IntDistribution(int(self.low), int(self.high), log=self.kind == "logint")
        return FloatDistribution(self.low, self.high, log=self.kind == "loguniform")

    def extremes(self) -> list[Any]:
        """The values a config is checked with before any trial: both ends, or every choice."""
        if self.kind == "choice":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.kind in ("int", "logint") else [self.low, self.high]


def parse_range(key: str, value: Any, source: str) -> Range:
    """A `search:` entry: `loguniform(1e-5, 3e-4)`, `uniform(a, b)`, `int(a, b)`, `logint(a, b)` or
    a list of choices; errors name the file and the key."""
    where = f"{source}: search.{key}"
    if isinstance(value, (list, tuple)):
        choices = tuple(resolve_plain(v) for v in value)
        if not choices or any(isinstance(c, (list, dict)) for c in choices):
            raise ConfigError(f"{where}: expected a non-empty list of values, e.g. [16, 32]")
        return Range("choice", choices=choices)
    found = _RANGE.match(str(value)) if isinstance(value, str) else None
    if found is None:
        raise ConfigError(f"{where}={value!r} is not a range: expected loguniform(a, b), uniform(a, b), int(a, b), "
                          "logint(a, b) or a list of values such as [16, 32]")
    kind, ends = found.group(1), []
    for text in found.group(2, 3):
        number = resolve_plain(PlainText(text))
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ConfigError(f"{where}: {text!r} is not a finite number")
        if kind in ("int", "logint") and not float(number).is_integer():
            raise ConfigError(f"{where}: {kind}() takes integers, got {text}")
        ends.append(float(number))
    low, high = ends
    if not low < high:
        raise ConfigError(f"{where}: the range {value} must have low < high")
    if kind in ("loguniform", "logint") and low <= 0:
        raise ConfigError(f"{where}: a log-scale range must be positive, got {value}")
    return Range(kind, low, high)


@dataclasses.dataclass
class SearchSpec:
    """A `tune` config: the settings every trial shares (as read, before overrides are typed) and the ranges."""

    source: str  # the config file
    base: dict[str, Any]  # its settings without `search:`, overrides applied
    ranges: dict[str, Range]

    def config(self, values: dict[str, Any], **fixed: Any) -> FinetuneConfig:
        """The FinetuneConfig of a trial: the base settings with `values` (and `fixed`) set."""
        overrides = [f"{k}={v}" for k, v in {**values, **fixed}.items()]
        data = apply_overrides(dict(self.base), overrides, FinetuneConfig)
        return config_from_dict(FinetuneConfig, data, self.source)


def read_search(path: str | Path, overrides: list[str]) -> tuple[SearchSpec, FinetuneConfig]:
    """The spec of RUN.yaml, and its base config; every range's ends are checked as settings now."""
    data = read_yaml(path)
    block = data.pop("search", None)
    if not isinstance(block, dict) or not block:
        raise ConfigError(f"{path}: no search: block naming the settings to search, e.g. "
                          "search: {lr: loguniform(1e-5, 3e-4), batch_size: [16, 32]}")
    ranges = {str(k): parse_range(str(k), v, str(path)) for k, v in block.items()}
    spec = SearchSpec(str(path), apply_overrides(data, list(overrides), FinetuneConfig), ranges)
    base = spec.config({})
    for key, r in ranges.items():
        for value in r.extremes():
            try:
                spec.config({key: value})
            except ConfigError as e:
                raise ConfigError(f"{path}: search.{key} reaches {value!r}, which is no valid setting: {e}") from None
    if not base.validation_file and not (base.task == "qa" and base.qa.train_articles):
        raise ConfigError(f"{path}: a search needs validation_file: each trial is scored by its best validation "
                          f"{base.metric or 'metric'}")
    return spec, base


class TrialReporter:
    """A tracker (training/trackers.py) of one trial: each periodic evaluation goes to the trial;
    when the pruner says to stop, `stop_reason` ends the run after that evaluation."""

    def __init__(self, trial: Any, metric: str | None = None) -> None:
        self.trial, self.metric = trial, metric
        self.stop_reason: str | None = None
        self.pruned_at: int | None = None

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if kind == "start" and self.metric is None:
            self.metric = values.get("metric")  # the job's metric (the task's default, or `metric`)
        if kind != "eval" or values.get("final") or self.metric not in values:
            return
        value = float(values[self.metric])
        self.trial.report(value, step)
        if self.trial.should_prune():
            self.pruned_at = step
            self.stop_reason = f"pruned by the search ({self.metric} {value:.4f} at step {step} trails the other trials)"

    def close(self) -> None:
        pass


def open_study(folder: Path, direction: str, pruner: str, seed: int) -> Any:
    """The study in `folder` (created, or loaded to continue)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder.mkdir(parents=True, exist_ok=True)
    pruners = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
               "hyperband": optuna.pruners.HyperbandPruner, "none": optuna.pruners.NopPruner}
    storage = f"sqlite:///{(folder / STORAGE).resolve()}"
    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    except KeyError:  # no study yet
        study = None
    done = len(study.trials) if study is not None else 0
    # seeded, but not the same samples again when the study continues
    sampler = optuna.samplers.TPESampler(seed=seed + done)
    if study is None:
        return optuna.create_study(study_name=STUDY_NAME, storage=storage, direction=direction, sampler=sampler,
                                   pruner=pruners[pruner]())
    if study.direction.name.lower() != direction:
        raise ConfigError(f"{folder / STORAGE}: the study was created to {study.direction.name.lower()} its metric, "
                          f"this config's metric asks to {direction} it: use another study folder (--study)")
    return optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler, pruner=pruners[pruner]())


# settings a continued study may change: where and how its trials run and report, not what they train
RUNS_ANYWHERE = frozenset({"output_dir", "overwrite", "force_resume", "device", "num_workers", "dist_timeout_s",
                           "jax_cache", "compile_tuning", "log_every", "save_every", "save_minutes", "keep_last",
                           "end_checkpoint", "eval_batch_size", "report_to", "tracking.project", "tracking.run_name",
                           "tracking.mlflow_uri", "tracking.wandb_mode"})


def check_same_settings(study: Any, spec: SearchSpec, base: FinetuneConfig, folder: Path) -> None:
    """Record the settings the study's trials share; a continued study must keep them (but the
    searched ones and those of `RUNS_ANYWHERE`) once a trial has trained, else its trials and
    best.yaml would mix two searches."""
    from bert_kit.training.resume import settings_changes
    from bert_kit.training.runconfig import config_to_dict

    saved = study.user_attrs.get("settings")
    if saved is None or not any(counted(t) or "steps" in t.user_attrs for t in study.trials):  # none trained yet
        study.set_user_attr("settings", config_to_dict(base))
        return
    changed, _ = settings_changes(saved, base)
    shaping = {k: c for k, c in changed.items() if k not in RUNS_ANYWHERE and k not in spec.ranges}
    if shaping:
        shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in shaping.items())
        raise ConfigError(f"{folder / STORAGE}: the study's trials ran with other settings ({shown}): restore them "
                          f"to continue it, or start another study folder (--study)")


def counted(trial: Any) -> bool:
    """Whether a trial counts toward --trials: finished (complete, pruned, or failed on its own: diverged),
    not interrupted nor stopped by an error before it trained."""
    from optuna.trial import TrialState

    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and not trial.user_attrs.get("interrupted") and "error" not in trial.user_attrs)


def enqueue_interrupted(study: Any, folder: Path) -> None:
    """Queue each trial whose run was interrupted (and not resumed since) to resume from its checkpoint."""
    from optuna.trial import TrialState

    from bert_kit.training.checkpoint import latest_checkpoint

    last: dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):  # in order: the last trial of each run folder wins
        if "run_folder" in trial.user_attrs:
            last[trial.user_attrs["run_folder"]] = trial
    for name, trial in last.items():
        if (trial.state == TrialState.FAIL and trial.user_attrs.get("interrupted")
                and latest_checkpoint(folder / name / "checkpoints") is not None):
            study.enqueue_trial(trial.params, user_attrs={"run_folder": name, "resume": True})


def tune(spec: SearchSpec, base: FinetuneConfig, trials: int, folder: Path, pruner: str = "median") -> dict[str, Any]:
    """Run the study to `trials` finished trials; returns {"stopped": signal or None, "study": ...}."""
    from optuna.trial import TrialState

    from bert_kit.tasks.finetuning import finetune
    from bert_kit.training.trainer import NonFiniteLossError

    metric = base.metric
    direction = "maximize" if metric is None or higher_is_better(metric) else "minimize"
    study = open_study(folder, direction, pruner, base.seed)
    check_same_settings(study, spec, base, folder)
    enqueue_interrupted(study, folder)
    distributions = {key: r.distribution() for key, r in spec.ranges.items()}
    stopped = None
    while sum(counted(t) for t in study.trials) < trials:
        trial = study.ask(distributions)
        name = trial.user_attrs.get("run_folder") or f"trial-{trial.number:04d}"
        trial.set_user_attr("run_folder", name)
        resume = "latest" if trial.user_attrs.get("resume") else None
        cfg = spec.config(trial.params, **trial_settings(base, folder, name))
        shown = ", ".join(f"{k}={format_value(v)}" for k, v in trial.params.items())
        print(f"trial {trial.number} ({name}{', resumed' if resume else ''}): {shown}", file=sys.stderr, flush=True)
        reporter = TrialReporter(trial, metric)
        try:
            results = finetune(cfg, resume=resume, trackers=[reporter])
        except NonFiniteLossError as e:  # this trial's settings diverge: the search goes on
            print(f"trial {trial.number} failed: {e}", file=sys.stderr, flush=True)
            study.tell(trial, state=TrialState.FAIL)
            continue
        except (KeyboardInterrupt, SystemExit):  # a Ctrl-C outside the steps: resumed by the next `tune`
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)
            raise
        except BaseException as e:  # an error every trial would meet (its settings, the data): not resumed,
            trial.set_user_attr("error", f"{type(e).__name__}: {e}"[:500])  # nor counted as a trial that ran
            study.tell(trial, state=TrialState.FAIL)
            raise
        for key in ("metric", "steps", "wall_time_s", "best_step"):
            trial.set_user_attr(key, results.get(key))
        if results.get("stopped"):  # Ctrl-C or SIGTERM: saved, resumed by the next `tune`
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)
            stopped = results["stopped"]
            break
        if reporter.pruned_at is not None:
            study.tell(trial, state=TrialState.PRUNED)
        elif results.get("best_value") is None or not math.isfinite(results["best_value"]):
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, float(results["best_value"]))
    return {"stopped": stopped, "study": study, "summary": summarize(study, spec, folder, metric)}


def trial_settings(base: FinetuneConfig, folder: Path, name: str) -> dict[str, str]:
    """What a trial's run sets besides the sampled values: its folder, and its name in the trackers,
    where all trials of the study share one MLflow store and experiment (unless the config names them)."""
    fixed = {"output_dir": str(folder / name), "tracking.run_name": base.tracking.run_name or name}
    if "mlflow" in base.report_to:
        fixed["tracking.mlflow_uri"] = base.tracking.mlflow_uri or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
    fixed["tracking.project"] = base.tracking.project or folder.resolve().name
    return fixed


def format_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def summarize(study: Any, spec: SearchSpec, folder: Path, metric: str | None) -> dict[str, Any]:
    """trials.tsv, best.yaml and optimization_history.png in the study folder; the table as text."""
    from optuna.trial import TrialState

    keys = list(spec.ranges)
    header = ["trial", "state", "value", *keys, "steps", "run_folder"]
    rows = []
    for t in study.trials:
        state = "INTERRUPTED" if t.state == TrialState.FAIL and t.user_attrs.get("interrupted") else t.state.name
        value = t.value if t.value is not None else (t.intermediate_values[max(t.intermediate_values)]
                                                     if t.intermediate_values else None)
        rows.append([str(t.number), state, "" if value is None else f"{value:.4f}",
                     *(format_value(t.params[k]) if k in t.params else "" for k in keys),
                     str(t.user_attrs.get("steps", "")), str(t.user_attrs.get("run_folder", ""))])
    write_text(folder / TABLE, "".join("\t".join(r) + "\n" for r in [header, *rows]))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])
    summary: dict[str, Any] = {"table": table, "best": None}
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        cfg = spec.config(best.params, output_dir=str(folder / "best"))
        name = best.user_attrs.get("metric") or metric or "metric"
        save_config(cfg, folder / BEST, note=f"the best trial of {folder}: trial {best.number} "
                                               f"({best.user_attrs.get('run_folder')}), {name} {best.value:.4f}")
        summary["best"] = {"trial": best.number, "value": best.value, "params": best.params,
                           "run_folder": str(folder / best.user_attrs.get("run_folder", "")), "config": str(folder / BEST)}
    summary["plot"] = plot_history(study, folder) if complete else None
    return summary


def plot_history(study: Any, folder: Path) -> str | None:
    """optimization_history.png (Optuna's matplotlib plot), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization.matplotlib import plot_optimization_history
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        ax = plot_optimization_history(study)
    figure = ax.figure
    figure.set_size_inches(8, 4.5)
    figure.tight_layout()
    figure.savefig(folder / PLOT, dpi=110)
    plt.close(figure)
    return str(folder / PLOT)
