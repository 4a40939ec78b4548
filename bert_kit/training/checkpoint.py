"""Training checkpoints that survive crashes: written atomically, pruned to the last K.

A checkpoint is a folder `step-0000100/` holding
* `config.json` + `model.safetensors`: the model in HF format (`save_pretrained`), so the
  folder itself loads with `from_pretrained`, `bert-kit fill-mask` or `transformers` (a LoRA
  run's: its adapter alone, `adapter_model.safetensors` + `adapter_config.json`, bert_kit/lora.py);
* the run's tokenizer files (tokenizer.json, vocab.txt, tokenizer_config.json);
* `trainer_state.pt`: optimizer, LR scheduler and GradScaler state, RNG states (Python, NumPy,
  torch CPU, every CUDA device), the data position (sampler epoch / batch), the step and the
  run config. Only plain containers and tensors, so it loads with `weights_only=True`.

Every folder written here (checkpoints, and best/ or final/ by `write_folder_atomically`) holds
the record of what bert-kit wrote in it (`.bert-kit-files.json`, bert_kit/outputs.py).
Everything is written into `step-0000100.tmp/` first, flushed to disk, then renamed in one
`os.replace`: a process killed mid-write leaves a `.tmp` folder that `latest_checkpoint`
ignores, and the previous checkpoint intact. `StopSignal` turns SIGINT/SIGTERM into a flag
that training loops check after each step, so a stop request ends with a saved checkpoint.

Multi-process runs write the same single-file format, so any number of ranks (1 included) can
resume them: under DDP rank 0's replica is the model; under FSDP2 every rank first calls
`collect_state`, which gathers the full model and optimizer state dicts to rank 0's CPU
(`torch.distributed.checkpoint.state_dict.get_state_dict`, full_state_dict=True), and
`load_checkpoint` shards them back (`set_state_dict`). The optimizer state is stored in torch's
usual layout (keyed by parameter index) either way. `collect_state` also gathers every rank's
RNG state, so each rank resumes its own dropout stream when the world size is unchanged.
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

from bert_kit.checks import CorruptFileError, writing
from bert_kit.outputs import entries, remove_entry, write_record
from bert_kit.training.distributed import all_gather_object, is_fsdp, is_main, rank, unwrap_model, world_size

PREFIX = "step-"
STATE_FILE = "trainer_state.pt"
FORMAT_VERSION = 1
_NAME = re.compile(r"^step-(\d+)$")
_LEFTOVER = re.compile(r"^step-\d+\.(tmp|old|deleting)$")


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def checkpoint_step(path: str | Path) -> int:
    """The step of a checkpoint folder, from its name (step-0000100 -> 100)."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise ValueError(f"{path} is not a checkpoint folder (step-XXXXXXX)")
    return int(m.group(1))


# ---- RNG state ----------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """RNG states of Python, NumPy, torch CPU and all CUDA devices, as plain data and tensors."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"algorithm": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        # only where torch uses CUDA: reading the states would start CUDA in a process that does not
        # (the JAX engine's, whose GPU memory JAX holds)
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
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


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore this rank's RNG states from a trainer state dict: its own when the checkpoint was
    written by as many ranks, else rank 0's, reseeded on ranks > 0 so their dropout differs."""
    ranks = state.get("rng_ranks")
    if ranks and len(ranks) == world_size():
        set_rng_state(ranks[rank()])
        return
    set_rng_state(state["rng"])
    if rank() > 0:  # a draw from rank 0's stream, offset by the rank: distinct and reproducible
        torch.manual_seed(int(torch.randint(0, 2**62, (1,))) + rank())


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
    with writing(path):  # torch reports a full disk as a RuntimeError without the file name
        torch.save(state, path)
    _fsync(path)


def _index_keyed(optim_state: dict) -> dict:
    """DCP's optimizer state dict (keyed by parameter name) -> torch's (keyed by index)."""
    order = [name for group in optim_state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {"state": {index[name]: s for name, s in optim_state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in optim_state["param_groups"]]}


def _name_keyed(optim_state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, source: str) -> dict:
    """torch's optimizer state dict (keyed by index) -> DCP's (keyed by parameter name)."""
    name_of = {id(p): n for n, p in model.named_parameters()}  # a tied weight keeps its first name
    names = [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]
    saved = [i for g in optim_state["param_groups"] for i in g["params"]]
    if len(saved) != len(names):
        raise ValueError(f"{source}: optimizer state for {len(saved)} parameters, the model trains {len(names)}")
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in optim_state["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in optim_state["state"].items()}, "param_groups": groups}


def collect_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """What rank 0 needs to checkpoint a multi-process run. Every rank must call it.

    Returns, on rank 0: "rng_ranks" (every rank's RNG state) and, under FSDP2, "model" (the full
    state dict on the CPU) and "optimizer" (the full optimizer state, index-keyed as
    `optimizer.state_dict()`). Other ranks get the same keys with None. A single process gets {}.
    """
    if world_size() <= 1:
        return {}
    collected: dict[str, Any] = {"rng_ranks": all_gather_object(rng_state())}
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

        # full tensors, gathered shard by shard into rank 0's CPU memory (the others get {})
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if optimizer is None:
            model_state, optim_state = get_model_state_dict(model, options=options), None
        else:
            model_state, optim_state = get_state_dict(model, optimizer, options=options)
        collected["model"] = model_state if is_main() else None
        collected["optimizer"] = _index_keyed(optim_state) if optim_state and is_main() else None
    if not is_main():
        collected = dict.fromkeys(collected)
    return collected


def save_model(model: nn.Module, folder: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """`save_pretrained` (config.json + model.safetensors) of the model's weights, or of `state`:
    the full state dict `collect_state` gathered (an FSDP2 model holds only shards), or a copy
    taken earlier (`snapshot`). Call on rank 0 only."""
    from bert_kit.hf import save_pretrained, to_hf_state_dict
    from bert_kit.lora import is_lora, save_adapter

    model = unwrap_model(model)
    if state is None and is_fsdp(model):
        raise ValueError("an FSDP model holds only shards: pass the state collect_state() gathered")
    if is_lora(model):  # its adapters and head alone, as HF peft saves them (bert_kit/lora.py)
        save_adapter(model, folder, state)
        return
    save_pretrained(model, folder, None if state is None else to_hf_state_dict(model, state))


WRITTEN_BY = "bert-kit run"


def write_folder_atomically(folder: str | Path, write: Any) -> Path:
    """Call `write(tmp)` to fill `FOLDER.tmp`, then swap it in for `folder`: a crash at any point
    leaves the previous folder (or, between the two renames, a complete FOLDER.tmp). The folder's
    record lists what `write` wrote. A `folder` that is a link is replaced, never followed."""
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    for leftover in (tmp, old):  # from a run killed while saving
        remove_entry(leftover)
    write(tmp)
    write_record(tmp, entries(tmp), WRITTEN_BY)
    for f in tmp.iterdir():
        _fsync(f)
    if os.path.lexists(folder):
        folder.replace(old)
        tmp.replace(folder)
        remove_entry(old)
    else:
        tmp.replace(folder)
    return folder


def save_checkpoint(directory: str | Path, step: int, model: nn.Module, *, tokenizer: Any = None,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    scaler: Any = None, data_state: dict | None = None, run_config: dict | None = None,
                    keep_last: int | None = None, extra: dict | None = None,
                    collected: dict[str, Any] | None = None, engine: str = "torch",
                    files: Any = None, rng: dict[str, Any] | None = None) -> Path:
    """Write `directory/step-XXXXXXX/` atomically and return its path.

    keep_last: afterwards delete all but the newest K checkpoints (None or 0 keeps all).
    collected: what `collect_state` returned (multi-process runs; required under FSDP2).
    engine: the training engine that wrote it (a run resumes with the same one);
    files: `files(folder)` writes the engine's own files into the checkpoint (the JAX optimizer state);
    rng: the RNG states to record (default: `rng_state()` now).
    Call on one process only (rank 0).
    """
    collected = collected or {}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    final, tmp = directory / name, directory / f"{name}.tmp"
    remove_entry(tmp)  # a leftover of a crashed attempt at this very step
    tmp.mkdir()
    save_model(model, tmp, collected.get("model"))
    if tokenizer is not None:
        tokenizer.save(tmp)
    if files is not None:
        files(tmp)
    if "optimizer" in collected:  # gathered from the shards
        optim_state = collected["optimizer"]
    else:
        optim_state = optimizer.state_dict() if optimizer is not None else None
    state = {
        "format_version": FORMAT_VERSION,
        "engine": engine,
        "step": int(step),
        "optimizer": optim_state,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng if rng is not None else rng_state(),
        "rng_ranks": collected.get("rng_ranks"),  # one per rank (multi-process runs)
        "data": data_state,
        "run_config": run_config,
        **(extra or {}),
    }
    write_record(tmp, [*entries(tmp), STATE_FILE], WRITTEN_BY)
    _write_trainer_state(tmp / STATE_FILE, state)  # last: its presence marks a complete folder
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    if os.path.lexists(final):  # saving the same step again: move the old one aside first
        old = directory / f"{name}.old"
        remove_entry(old)
        os.replace(final, old)
        os.replace(tmp, final)
        remove_entry(old)
    else:
        os.replace(tmp, final)  # the commit point
    _fsync(directory)
    if keep_last:
        prune_checkpoints(directory, keep_last)
    return final


class Background(threading.Thread):
    """`call(*args, **kwargs)` in a thread of its own, while the run goes on: `result()` waits for
    it and returns its value, or raises its error in the caller's thread."""

    def __init__(self, call: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(name=f"bert-kit {getattr(call, '__name__', 'writer')}")
        self._call = call, args, kwargs
        self._value: Any = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        call, args, kwargs = self._call
        try:
            self._value = call(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (raised again by result(), in the run's thread)
            self._error = e

    def result(self) -> Any:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def checkpoint_writer(*args: Any, **kwargs: Any) -> Background:
    """`save_checkpoint(...)` in the background, for weights that no longer change (the end of a
    run) while the run goes on with its last evaluation. The RNG states are those of this call."""
    return Background(save_checkpoint, *args, **{**kwargs, "rng": kwargs.get("rng") or rng_state()})


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict copied to the CPU: what `save_model` writes in the background while
    the training steps change the weights."""
    return {k: v.detach().to("cpu", copy=True) for k, v in unwrap_model(model).state_dict().items()}


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


def remove_checkpoints(paths: list[Path]) -> None:
    """Delete checkpoint folders; each is renamed first, so a half-deleted one never looks like a checkpoint."""
    for p in paths:
        gone = p.with_name(p.name + ".deleting")
        os.replace(p, gone)
        shutil.rmtree(gone, ignore_errors=True)


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints and any leftovers; return the deleted."""
    directory = Path(directory)
    doomed = list_checkpoints(directory)[:-keep_last] if keep_last > 0 else []
    leftovers = [p for p in directory.iterdir() if _LEFTOVER.match(p.name)] if directory.is_dir() else []
    remove_checkpoints(doomed)
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# ---- reading ------------------------------------------------------------------------------------

def resolve_checkpoint(path: str | Path, output_dir: str | Path | None = None) -> Path:
    """A checkpoint folder from `path`: the folder itself, the newest one inside it, or, for
    "latest", the newest one in `output_dir`. Raises FileNotFoundError naming what was searched.

    Searching, a newest checkpoint that cannot be read (a truncated or empty trainer_state.pt, a
    truncated model.safetensors) is reported in one line and the one before it is used; a
    checkpoint named directly must be readable (CorruptFileError)."""
    if str(path) == "latest":
        if output_dir is None:
            raise ValueError("resume='latest' needs the run's output_dir")
        found = newest_readable_checkpoint(output_dir)
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint (step-*/{STATE_FILE}) in {output_dir} "
                                    f"or {Path(output_dir) / 'checkpoints'}{_skipped(output_dir)}")
        return found
    path = Path(path)
    if (path / STATE_FILE).is_file():
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CorruptFileError(f"cannot resume from {path}: {problem}; name an earlier checkpoint, or the run "
                                   "folder (the newest readable checkpoint is then used)")
        return path
    found = newest_readable_checkpoint(path) if path.is_dir() else None
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path} (expected a step-* folder with {STATE_FILE})"
                                f"{_skipped(path) if path.is_dir() else ''}")
    return found


def checkpoint_problem(path: str | Path) -> str | None:
    """Why checkpoint folder `path` cannot be resumed from (one line), or None when it can.

    Cheap: trainer_state.pt is memory-mapped rather than read, and only the header of
    model.safetensors is read (it must cover the whole file, so truncation shows)."""
    from bert_kit.weight_files import check_weights_file

    try:
        load_trainer_state(path, mmap=True)
        check_weights_file(path)
    except (OSError, ValueError) as e:
        return str(e)
    return None


_reported: set[Path] = set()  # corrupt checkpoints already reported by this process


def newest_readable_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint in `directory` that can be resumed from; each newer one that cannot
    is reported on stderr (once) and skipped."""
    for path in reversed(list_checkpoints(directory)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if is_main() and path not in _reported:
            print(f"warning: skipping checkpoint {path.name}: {problem}; trying the one before it",
                  file=sys.stderr, flush=True)
        _reported.add(path)
    return None


def _skipped(directory: str | Path) -> str:
    n = sum(1 for p in list_checkpoints(directory) if p in _reported)
    return f" ({n} corrupt checkpoint(s) skipped)" if n else ""


def load_trainer_state(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The `trainer_state.pt` dict of a checkpoint folder (safe `weights_only` load).

    mmap: map the tensors instead of reading them (to check a file cheaply).
    An empty, truncated, unsafe or foreign file raises CorruptFileError naming it."""
    from bert_kit.weight_files import load_torch_file

    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint {path} has no {STATE_FILE}")
    state = load_torch_file(file, mmap=mmap)
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise CorruptFileError(f"{file}: not a bert-kit trainer state of format {FORMAT_VERSION} "
                               f"(format_version {version!r})")
    return state


def load_checkpoint(path: str | Path, model: nn.Module | None = None, *,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                    scaler: Any = None, restore_rng: bool = True) -> dict[str, Any]:
    """Load a checkpoint folder into the given objects; return its trainer state dict.

    The model must have the architecture that was saved (all weights must match, strict).
    An FSDP2 model (and its optimizer) gets its shards of the full saved state; every rank
    calls this. RNG states are restored last, so call this right before training continues.
    """
    from bert_kit.hf import load_into
    from bert_kit.weight_files import read_state_dict
    from bert_kit.lora import is_lora, load_adapter_into

    path = Path(path)
    state = load_trainer_state(path)
    sharded = model is not None and is_fsdp(model)
    if sharded:
        _load_sharded(path, model, optimizer, state.get("optimizer"))
    elif model is not None and is_lora(unwrap_model(model)):  # a LoRA run's: adapters and head
        load_adapter_into(unwrap_model(model), path)
    elif model is not None:
        load_into(unwrap_model(model), read_state_dict(path), source=str(path), strict=True)
    if optimizer is not None and state.get("optimizer") is not None and not sharded:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        restore_rng_state(state)
    return state


def resume_position(data: dict, global_micro_batch: int) -> dict:
    """The loader state {"epoch", "batch_index"} to continue at, from a data state holding
    "loader" and "global_micro_batch" (sequences per loader batch over all ranks).

    A batch index counts one rank's micro-batches; when the global micro-batch changed (e.g. 2
    ranks resumed by 1 process), the same number of sequences is skipped. All ranks share one
    shuffled order per epoch, so those are exactly the sequences already trained on.
    """
    state = dict(data["loader"])
    saved = int(data.get("global_micro_batch", global_micro_batch))
    state["batch_index"] = state["batch_index"] * saved // global_micro_batch
    return state


def _load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                  optim_state: dict | None) -> None:
    """Full saved model (and optimizer) state -> this rank's FSDP2 shards (`set_state_dict`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    from bert_kit.hf import from_hf_state_dict, names_for
    from bert_kit.weight_files import read_state_dict

    weights, unmapped = from_hf_state_dict(read_state_dict(path), hasattr(model, "bert"), names_for(model))
    own = model.state_dict()  # sharded DTensors; only the names and global shapes are used
    if "mlm.decoder.weight" in own and "bert.embeddings.word_embeddings.weight" in weights:
        weights["mlm.decoder.weight"] = weights["bert.embeddings.word_embeddings.weight"]  # tied
    problems = [f"missing {k}" for k in sorted(set(own) - set(weights))]
    problems += [f"unexpected {k}" for k in sorted(set(weights) - set(own)) + unmapped]
    problems += [f"shape mismatch {k}: checkpoint {tuple(weights[k].shape)}, model {tuple(own[k].shape)}"
                 for k in sorted(set(own) & set(weights)) if weights[k].shape != own[k].shape]
    if problems:
        raise ValueError(f"{path} does not match {type(model).__name__}: " + "; ".join(problems))
    options = StateDictOptions(full_state_dict=True)
    if optimizer is None or optim_state is None:
        set_model_state_dict(model, weights, options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=weights,
                       optim_state_dict=_name_keyed(optim_state, model, optimizer, str(path)), options=options)


# ---- stopping cleanly -----------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
