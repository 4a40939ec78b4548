"""Training checkpoints that survive crashes: written atomically, pruned to the last K.

A checkpoint is a folder `step-0000100/` holding
* `config.json` + `model.safetensors`: the model in HF format (`save_pretrained`), so the
  folder itself loads with `from_pretrained`, `bert-kit fill-mask` or `transformers`;
* the run's tokenizer files (tokenizer.json, vocab.txt, tokenizer_config.json);
* `trainer_state.pt`: optimizer, LR scheduler and GradScaler state, RNG states (Python, NumPy,
  torch CPU, every CUDA device), the data position (sampler epoch / batch), the step and the
  run config. Only plain containers and tensors, so it loads with `weights_only=True`.

Everything is written into `step-0000100.tmp/` first, flushed to disk, then renamed in one
`os.replace`: a process killed mid-write leaves a `.tmp` folder that `latest_checkpoint`
ignores, and the previous checkpoint intact. `StopSignal` turns SIGINT/SIGTERM into a flag
that training loops check after each step, so a stop request ends with a saved checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from bert_kit.distributed import unwrap_model

PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d+)$")
_LEFTOVER = re.compile(r"^step-\d+\.(tmp|old|deleting)$")


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


# ---- RNG state ----------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """RNG states of Python, NumPy, torch CPU and all CUDA devices, as plain data and tensors."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"algorithm": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (CUDA states only where the device count matches)."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["algorithm"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _as_tuple(x: Any) -> Any:
    """random.setstate needs tuples; deserialisers may hand back lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---- writing ------------------------------------------------------------------------------------

def _fsync(path: Path) -> None:
    """Flush a file or folder to disk, so a rename after it never exposes unwritten data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync folders
    finally:
        os.close(fd)


def _write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    torch.save(state, path)
    _fsync(path)


def save_checkpoint(directory: str | Path, step: int, model: nn.Module, *, tokenizer: Any = None,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    scaler: Any = None, data_state: dict | None = None, run_config: dict | None = None,
                    keep_last: int | None = None, extra: dict | None = None) -> Path:
    """Write `directory/step-XXXXXXX/` atomically and return its path.

    keep_last: afterwards delete all but the newest K checkpoints (None or 0 keeps all).
    Call on one process only (rank 0).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    final, tmp = directory / name, directory / f"{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # a leftover of a crashed attempt at this very step
    tmp.mkdir()
    unwrap_model(model).save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save(tmp)
    state = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng_state(),
        "data": data_state,
        "run_config": run_config,
        **(extra or {}),
    }
    _write_trainer_state(tmp / STATE_FILE, state)  # last: its presence marks a complete folder
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    if final.exists():  # saving the same step again: move the old one aside first
        old = directory / f"{name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)  # the commit point
    _fsync(directory)
    if keep_last:
        prune_checkpoints(directory, keep_last)
    return final


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints in `directory` (or its `checkpoints/`), oldest first."""
    directory = Path(directory)
    found = []
    for root in (directory, directory / "checkpoints"):
        if root.is_dir():
            for p in root.iterdir():
                m = _NAME.match(p.name)
                if m and p.is_dir() and (p / STATE_FILE).is_file():
                    found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path | None:
    """Newest complete checkpoint; `.tmp` leftovers of interrupted writes are ignored."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints and any leftovers; return the deleted."""
    directory = Path(directory)
    doomed = list_checkpoints(directory)[:-keep_last] if keep_last > 0 else []
    leftovers = [p for p in directory.iterdir() if _LEFTOVER.match(p.name)] if directory.is_dir() else []
    for p in doomed:
        # rename first: a half-deleted folder must not look like a checkpoint
        gone = p.with_name(p.name + ".deleting")
        os.replace(p, gone)
        shutil.rmtree(gone, ignore_errors=True)
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# ---- reading ------------------------------------------------------------------------------------

def resolve_checkpoint(path: str | Path, output_dir: str | Path | None = None) -> Path:
    """A checkpoint folder from `path`: the folder itself, the newest one inside it, or, for
    "latest", the newest one in `output_dir`. Raises FileNotFoundError naming what was searched."""
    if str(path) == "latest":
        if output_dir is None:
            raise ValueError("resume='latest' needs the run's output_dir")
        found = latest_checkpoint(output_dir)
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint (step-*/{STATE_FILE}) in {output_dir} "
                                    f"or {Path(output_dir) / 'checkpoints'}")
        return found
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    found = latest_checkpoint(path) if path.is_dir() else None
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path} (expected a step-* folder with {STATE_FILE})")
    return found


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The `trainer_state.pt` dict of a checkpoint folder (safe `weights_only` load)."""
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint {path} has no {STATE_FILE}")
    state = torch.load(file, map_location="cpu", weights_only=True)
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: unsupported checkpoint format {state.get('format_version')!r}")
    return state


def load_checkpoint(path: str | Path, model: nn.Module | None = None, *,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    scaler: Any = None, restore_rng: bool = True) -> dict[str, Any]:
    """Load a checkpoint folder into the given objects; return its trainer state dict.

    The model must have the architecture that was saved (all weights must match, strict).
    RNG states are restored last, so call this right before training continues.
    """
    from bert_kit.hf import load_into, read_state_dict

    path = Path(path)
    state = load_trainer_state(path)
    if model is not None:
        load_into(unwrap_model(model), read_state_dict(path), source=str(path), strict=True)
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


# ---- stopping cleanly -----------------------------------------------------------------------------

class StopSignal:
    """While active, SIGINT/SIGTERM only set `signum`: the loop finishes its step, saves and
    exits. A second signal aborts at once (the last complete checkpoint stays on disk)."""

    def __enter__(self) -> "StopSignal":
        self.signum, self._previous = None, {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: finishing this step, saving a checkpoint, then exiting "
              "(send it again to abort without saving)", file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
