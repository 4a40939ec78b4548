"""A run folder's rules: which names a run writes there, which it may delete, what it reads.

A run folder belongs to one run at a time (the loop holds `FolderLock`). A fresh run where another
left checkpoints or metrics stops with an error (resume it, or `overwrite: true` to start over).
The folder's record (bert_kit/outputs.py) lists what runs wrote there: `overwrite` deletes only
that, never a user's file, never through a link, and never an input of the new run.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from bert_kit.checks import ConfigError
from bert_kit.outputs import inside, read_record, remove_entry, write_record
from bert_kit.training.checkpoint import WRITTEN_BY, latest_checkpoint
from bert_kit.training.distributed import barrier, is_main
from bert_kit.training.progress import METRICS_FILE
from bert_kit.training.settings import RunSettings, tracker_names
from bert_kit.training.trackers import IDS_FILE, TRACKER_FILES

# files and folders a run writes in its folder (a tracker's when it reports to it, `tokenizer` when
# it trains one), recorded there before they are written; `overwrite: true` deletes what an earlier
# run recorded. A token cache is not a run's file (it is keyed by content: runs share it).
RUN_FILES = ("checkpoints", METRICS_FILE, "results.json", "loss_curve.png", "run_config.yaml", "final", "best",
             "final.tmp", "final.old", "best.tmp", "best.old", "tokenizer", IDS_FILE,
             *(name for files in TRACKER_FILES.values() for name in files))
# settings naming what a run reads: never deleted by `overwrite`, never written over by --output
INPUT_SETTINGS = ("model", "tokenizer", "train_file", "validation_file", "train_files", "eval_files", "cache_dir")


def run_files(cfg: RunSettings, fresh: bool) -> list[str]:
    """The names in its folder that this run may write."""
    trains_tokenizer = fresh and getattr(cfg, "train_tokenizer", None) is not None
    used = tracker_names(cfg)
    optional = {"tokenizer": trains_tokenizer, IDS_FILE: bool({"mlflow", "wandb"} & set(used)),
                **{name: tracker in used for tracker, files in TRACKER_FILES.items() for name in files}}
    return [name for name in RUN_FILES if optional.get(name, True)]


def recorded_run_files(out: Path) -> set[str]:
    """What earlier runs wrote in `out`: its record; for the folder of a run from before records
    existed (it has run_config.yaml), RUN_FILES, `tokenizer` only if that run trained it."""
    record = read_record(out, WRITTEN_BY)
    if record is not None:
        return set(record)
    config = out / "run_config.yaml"
    if not config.is_file():
        return set()  # what is there is the user's
    try:
        trained = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("train_tokenizer") is not None
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        trained = False
    return {name for name in RUN_FILES if name != "tokenizer" or trained}


def run_inputs(cfg: RunSettings) -> list[tuple[str, str]]:
    """(setting, path) of what the run reads: its model, tokenizer, data files and token cache."""
    found = []
    for key in INPUT_SETTINGS:
        value = getattr(cfg, key, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, str) and v.strip():
                found.append((key, v))
    return found


def protected_files(cfg: RunSettings) -> list[Path]:
    """Files that a run's --output may not be: its inputs, and the run folder's records and settings."""
    return [Path(value) for _, value in run_inputs(cfg)] + [Path(cfg.output_dir) / n for n in (METRICS_FILE,
                                                                                              "run_config.yaml")]


def claim_run_folder(out: Path, resuming: bool, cfg: RunSettings) -> None:
    """A fresh run may not start where another run left its files, nor write over files no run
    wrote; `overwrite` deletes what earlier runs recorded first, unless an input of this run lies
    inside it. Then the names this run may write are recorded, before it writes them."""
    ours = recorded_run_files(out)
    found = [name for name in [*RUN_FILES, *sorted(ours - set(RUN_FILES))]
             if name in ours and os.path.lexists(out / name)]
    writes = run_files(cfg, fresh=not resuming)
    if not resuming:
        theirs = [name for name in writes if os.path.lexists(out / name) and name not in ours]
        if theirs:
            raise ConfigError(f"{out} holds {', '.join(theirs)}, which no bert-kit run wrote there and this run would "
                              "replace: move it out of the folder, or choose another output_dir")
    if found and not resuming:
        if not cfg.overwrite:
            newest = latest_checkpoint(out / "checkpoints")
            at = f" (newest checkpoint {newest.name})" if newest else ""
            raise ConfigError(f"{out} already holds a run{at}: {', '.join(found)}. Continue it with --resume latest, "
                              f"or start over with overwrite=true (deletes those files), or choose another output_dir")
        for name in found:  # every rank refuses, before anything is deleted
            for key, value in run_inputs(cfg):
                if inside(value, out / name):
                    raise ConfigError(f"overwrite=true would delete {out / name}, which holds this run's "
                                      f"{key}={value}: move it out of {out} first, or choose another output_dir")
        if is_main():
            for name in found:
                remove_entry(out / name)  # a link is removed, never followed
    if is_main():
        out.mkdir(parents=True, exist_ok=True)
        write_record(out, [*writes, *(ours if resuming else ())], WRITTEN_BY)
    barrier()
