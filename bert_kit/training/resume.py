"""Resuming a run (`--resume`): which checkpoint it continues from, whether anything is left to
train, and which settings may change.

    resumed = resume_point(cfg, "latest", Path(cfg.output_dir))
    resumed.checkpoint, resumed.state          # the folder, its trainer state

* `latest` (or a run folder) is the newest readable checkpoint of the run folder. A run whose
  results.json says it finished is not trained again: resumed at its last step it says so (and
  how to extend it: more max_steps or epochs); where its newest checkpoint is older than its end
  (a fine-tune keeps no end checkpoint) resuming would train finished steps again and replace its
  model: an error that says how to rewind on purpose.
* Naming an earlier checkpoint rewinds the run: it continues from that step, and the checkpoints
  after it and the results of the run it rewinds are removed (its metrics.jsonl records after the
  step are dropped, as on every resume), so that `latest` follows the run that goes on.
* `overwrite: true` deletes a run, `--resume` continues it: asked together, the run stops with an
  error before anything is touched.
* A resume may change some settings and not others (`RunSettings.RESUMABLE`: lr, length,
  cadence, ...); others that shape the run stop it unless `force_resume: true`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError
from bert_kit.outputs import remove_entry
from bert_kit.training.checkpoint import (checkpoint_step, list_checkpoints, load_trainer_state, remove_checkpoints,
                                          resolve_checkpoint)
from bert_kit.training.config_keys import flat_settings
from bert_kit.training.results import EARLY_STOPPING, RESULTS_FILE, interrupted, read_results
from bert_kit.training.runconfig import config_to_dict
from bert_kit.training.settings import RunSettings


@dataclass
class Resumed:
    """What `--resume` resolved to."""

    checkpoint: Path
    state: dict[str, Any]  # its trainer state
    finished: dict[str, Any] | None = None  # results.json of the run, where it finished at this step
    later: list[Path] = field(default_factory=list)  # checkpoints of the run this one rewinds

    @property
    def step(self) -> int:
        return int(self.state["step"])


def finished_results(out: Path) -> dict[str, Any] | None:
    """results.json of the run in `out` if it says the run finished (at its end or by early
    stopping; not stopped by a signal)."""
    results = read_results(out)
    if results is None or interrupted(results) or not isinstance(results.get("steps"), int):
        return None
    return results


def stopped_early(finished: dict[str, Any], state: dict[str, Any], patience: int | None) -> bool:
    """Whether a run that early stopping ended is resumed with a patience it has spent already
    (a larger one, or none, trains on)."""
    waited = int((state.get("best") or {}).get("waited", 0))
    return finished.get("stopped") == EARLY_STOPPING and patience is not None and waited >= patience


def resume_point(cfg: RunSettings, resume: str, out: Path) -> Resumed:
    """The checkpoint `resume` names for the run in `out`, and what resuming it means (see the
    module's docstring); errors for a resume that contradicts the settings or would train a
    finished run again."""
    if cfg.overwrite:
        raise ConfigError(f"--resume {resume} continues the run in {out}, and overwrite=true would delete it first: "
                          "set overwrite=false to resume it, or leave out --resume to start over")
    try:
        checkpoint = resolve_checkpoint(resume, out)
    except FileNotFoundError as e:
        if (out / RESULTS_FILE).is_file() and not cfg.end_checkpoint:  # a finished run, as configured
            e.args = (f"{e}: the run there finished without an end checkpoint (end_checkpoint: false, the "
                      "fine-tuning default); start a new run from its model folder, or set end_checkpoint=true "
                      "in runs you mean to extend",)
        raise
    resumed = Resumed(checkpoint, load_trainer_state(checkpoint))
    named = str(resume) != "latest" and Path(resume).resolve() == checkpoint.resolve()  # not searched for
    finished = finished_results(out)
    if finished is not None and finished["steps"] > resumed.step and not named:
        raise ConfigError(
            f"{out} finished at step {finished['steps']} ({RESULTS_FILE}), after its newest readable checkpoint "
            f"{checkpoint.name}: resuming would train steps {resumed.step + 1}-{finished['steps']} again and replace "
            f"its model. To train further, start a new run from its model folder (model={out / 'best'}, or final/ "
            f"of a pretraining run), or rewind on purpose by naming the checkpoint: --resume {checkpoint}")
    if finished is not None and finished["steps"] == resumed.step:
        resumed.finished = finished
    if named:  # a rewind: what came after this step belongs to the run it replaces
        resumed.later = [c for c in list_checkpoints(out) if checkpoint_step(c) > resumed.step]
        if finished is not None and finished["steps"] > resumed.step:
            resumed.later.append(out / RESULTS_FILE)
    return resumed


def rewind(out: Path, resumed: Resumed) -> None:
    """Remove what the run being rewound wrote after the resumed step: its later checkpoints and its
    results (rank 0, once the run holds its folder)."""
    if not resumed.later:
        return
    names = ", ".join(p.name for p in resumed.later)
    print(f"rewinding {out} to step {resumed.step}: removing {names} of the run it replaces (its metrics.jsonl "
          f"records after step {resumed.step} go too), so that --resume latest follows this run",
          file=sys.stderr, flush=True)
    checkpoints = [p for p in resumed.later if p.name != RESULTS_FILE]
    remove_checkpoints(checkpoints)
    if (out / RESULTS_FILE) in resumed.later:
        remove_entry(out / RESULTS_FILE)


def finished_message(out: Path, step: int, finished: dict[str, Any] | None = None) -> str:
    if (finished or {}).get("stopped") == EARLY_STOPPING:
        return (f"{out}: early stopping ended the run at step {step} ({RESULTS_FILE}); its results and model folder "
                f"are kept. To train it further, resume it with a larger early_stopping_patience (or null)")
    return (f"{out}: the run finished at step {step} ({RESULTS_FILE}); nothing is left to train, and its results "
            f"and model folder are kept. To train it further, resume it with more steps: max_steps (or epochs) "
            f"past step {step}")


def settings_changes(saved: dict, cfg: RunSettings) -> tuple[dict, dict]:
    """({key: (old, new)} of every changed setting, the part of it a resume may not change); a
    group's settings one by one (`qa.doc_stride`), a config saved with old flat keys read as now."""
    now, saved = flat_settings(type(cfg), config_to_dict(cfg)), flat_settings(type(cfg), saved)
    changed = {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}
    refused = {k: c for k, c in changed.items() if k not in cfg.RESUMABLE}
    return changed, refused


def check_changes(checkpoint: Path, state: dict, cfg: RunSettings, main: bool) -> None:
    """Stop a resume that changes settings which shape the run (unless force_resume); say which changed."""
    changed, refused = settings_changes(state.get("run_config") or {}, cfg)
    if refused and not cfg.force_resume:
        shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise ConfigError(f"cannot resume {checkpoint} with changed settings that shape the run ({shown}); "
                          f"restore them, or pass force_resume=true")
    if changed and main:
        shown = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        print(f"resuming with changed settings: {shown}", file=sys.stderr, flush=True)
