"""Experiment trackers: where a run's records go besides metrics.jsonl (`report_to:`).

    report_to: [tensorboard, mlflow, wandb]      # any of them; `tensorboard: true` is the old spelling
    tracking: {project: sst2, run_name: lr-3e-5}  # the experiment (mlflow) / project (wandb), the run's name

A tracker is an object with two methods, `log(kind, step, values)` (every record the run writes
to metrics.jsonl: "start", "train", "eval", "error") and `close()`; `ProgressLogger` hands each
record to every tracker (training/progress.py). A tracker may also say that the run should end
now (`stop_reason`, a text; a hyperparameter search's pruned trial): the loop asks after each
evaluation. Each library is used through its own API and is an optional extra
(`pip install "bert-kit[tracking]"`); each works offline, with no network, by default:

* TensorBoard: scalars `train/loss`, `eval/accuracy` in RUN_DIR/tensorboard (progress.py).
* MLflow (`MlflowClient`): the tracking URI is `tracking.mlflow_uri`, else $MLFLOW_TRACKING_URI,
  else a SQLite database in the run folder (`sqlite:///RUN_DIR/mlflow.db`; MLflow 3 keeps its
  file store in maintenance mode) with artifacts under RUN_DIR/mlartifacts. The run's settings
  are its params, the records its metrics (`train/loss` at each step).
* Weights & Biases (`wandb.init`): `tracking.wandb_mode` offline by default (RUN_DIR/wandb;
  `wandb sync` uploads it later), online when asked; the settings are the run's config.

A resumed run continues the same MLflow run and W&B run: their ids are kept in
RUN_DIR/tracking.json. Only rank 0 tracks (the logger of every other rank is silent).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from bert_kit.outputs import write_text

IDS_FILE = "tracking.json"  # the MLflow and W&B run ids, so that a resumed run continues them
# what each tracker writes in the run folder (recorded as the run's files, see run_folder.py)
TRACKER_FILES = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow.db", "mlartifacts"), "wandb": ("wandb",)}
INSTALL = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run config as one level of keys (`qa.doc_stride`), for params that cannot nest."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a record (not booleans, not texts)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class RunIds:
    """RUN_DIR/tracking.json: the tracker's run id of this run folder, by tracker."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / IDS_FILE
        try:
            self.ids = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.ids = {}

    def get(self, name: str) -> str | None:
        value = self.ids.get(name) if isinstance(self.ids, dict) else None
        return value if isinstance(value, str) else None

    def set(self, name: str, value: str) -> None:
        self.ids = {**(self.ids if isinstance(self.ids, dict) else {}), name: value}
        write_text(self.path, json.dumps(self.ids, indent=2) + "\n")


class MLflow:
    """A tracker: the run as an MLflow run (params: the settings; metrics: `train/loss`, `eval/accuracy`)."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], project: str, run_name: str,
                 uri: str | None, resumed: bool) -> None:
        from mlflow.entities import Param, RunStatus
        from mlflow.tracking import MlflowClient

        self.status = RunStatus
        uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(uri)
        ids = RunIds(run_dir)
        run_id = ids.get("mlflow") if resumed else None
        if run_id is None:
            experiment = self.client.get_experiment_by_name(project)
            if experiment is None:
                artifacts = (run_dir / "mlartifacts").resolve().as_uri() if uri.startswith("sqlite:") else None
                experiment_id = self.client.create_experiment(project, artifact_location=artifacts)
            else:
                experiment_id = experiment.experiment_id
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            ids.set("mlflow", run_id)
            params = [Param(k, str(v)[:6000]) for k, v in flat(settings).items()]
            for start in range(0, len(params), 100):  # MLflow takes 100 params a call
                self.client.log_batch(run_id, params=params[start:start + 100])
        else:
            self.client.update_run(run_id, status="RUNNING")  # a resumed run's params stay those it started with
        self.run_id, self.failed = run_id, False
        self.uri = uri

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        if kind == "error":
            self.failed = True
        now = int(time.time() * 1000)
        metrics = [Metric(f"{kind}/{k}", v, now, step) for k, v in numbers(values).items()]
        if metrics and kind in ("train", "eval"):
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if self.failed else "FINISHED")


class WandB:
    """A tracker: the run as a Weights & Biases run, offline by default (RUN_DIR/wandb)."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], project: str, run_name: str,
                 mode: str, resumed: bool) -> None:
        import wandb

        ids = RunIds(run_dir)
        run_id = (ids.get("wandb") if resumed else None) or secrets.token_hex(4)  # W&B ids: [a-z0-9]
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, id=run_id, dir=str(run_dir), mode=mode,
                              config=settings, resume="allow", reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))
        ids.set("wandb", run_id)
        self.failed = False

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if kind == "error":
            self.failed = True
        metrics = {f"{kind}/{k}": v for k, v in numbers(values).items()}
        if metrics and kind in ("train", "eval"):
            self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish(exit_code=1 if self.failed else 0)


def make_trackers(names: list[str], run_dir: Path, settings: dict[str, Any], tracking: Any,
                  resumed: bool) -> list[Any]:
    """The trackers `names` (`report_to`'s) for a run in `run_dir`. settings: the run config as a dict
    (params); tracking: its `TrackingSettings`. A library that is not installed is an ImportError
    naming the extra to install."""
    from bert_kit.training.progress import TensorBoard

    project = tracking.project or "bert-kit"
    run_name = tracking.run_name or run_dir.resolve().name
    made: list[Any] = []
    for name in dict.fromkeys(names):
        try:
            if name == "tensorboard":
                made.append(TensorBoard(run_dir))
            elif name == "mlflow":
                made.append(MLflow(run_dir, settings, project, run_name, tracking.mlflow_uri, resumed))
            elif name == "wandb":
                made.append(WandB(run_dir, settings, project, run_name, tracking.wandb_mode, resumed))
        except ImportError as e:
            for tracker in made:
                tracker.close()
            raise ImportError(f"report_to: {name} needs the {INSTALL[name]} package ({e}): "
                              f'pip install "bert-kit[tracking]" (or pip install {INSTALL[name]})') from None
    return made
