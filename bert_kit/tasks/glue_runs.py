"""The runs of `bert-kit glue`: one fine-tuning run per task, lr and seed, each through `finetune`,
then its model scored on the task's dev files; in parallel, one process per GPU.

    runs = plan_runs(model, present, out, lrs=["auto"], seeds=[42], overrides=[])
    results = run_all([r for r in runs if finished(r) is None], gpus=["0", "1"], on_event=print_it)

A run's folder is `OUT/TASK/lr{lr}_seed{seed}/`, an ordinary `bert-kit finetune` run folder:
run_config.yaml, metrics.jsonl, loss_curve.png, best/ (the model at the end of training: the run
has no validation file, the dev files are scored afterwards) and results.json, whose "glue"
entry holds the run's settings ("spec"), its dev figures and the fingerprint of its inputs
("inputs": size, mtime and SHA-256 of each data file and of the model's config, weights and
tokenizer files). A rerun keeps every run whose results.json has a "glue" entry of the same
settings and inputs; a run whose data or model changed since (a new train.tsv, another model at
the same path) runs again, and says so. An interrupted run continues from its last checkpoint
(or starts over when its settings or inputs changed: the fingerprint it started with is kept
beside its folder, `lr{lr}_seed{seed}.inputs.json`). Checkpoints of a finished run are deleted:
best/ and the figures are what is kept.

Each GPU gets one worker process (CUDA_VISIBLE_DEVICES set to that GPU before torch is
imported) that takes runs from a shared queue, longest first; with several GPUs a run's output
goes to `OUT/TASK/lr{lr}_seed{seed}.log`. On the CPU the runs take turns in this process.
This module imports torch only inside the functions that run models.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import queue
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bert_kit.checks import ConfigError
from bert_kit.data import read_text
from bert_kit.model_folder import locate_model
from bert_kit.outputs import remove_entry, write_text
from bert_kit.tasks.glue import TASKS, WARMUP_FRACTION, WEIGHT_DECAY, GlueTask, malformed_lines, task_metrics

# settings each run takes from the task table or the command's flags: not key=value settings
RESERVED = {**dict.fromkeys(("task", "text_column", "text_pair_column", "label_column", "header", "delimiter",
                             "label_names", "num_labels", "label_pattern", "similarity", "similarity.mode",
                             "similarity.score_range", "where", "validation_where", "validation_file"),
                            "the task table"),
            "model": "--model", "train_file": "--data", "output_dir": "--output-dir", "lr": "--lrs", "seed": "--seeds",
            "device": "--gpus", "overwrite": "bert-kit glue (it keeps finished runs)"}


def check_overrides(overrides: Sequence[str]) -> list[str]:
    """key=value settings for every run; a setting that bert-kit glue sets itself is refused,
    naming the flag that sets it. (Unknown keys and bad values are FinetuneConfig's to refuse:
    `check_configs`.)"""
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    for text in overrides:
        key, sep, _ = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"setting {text!r} is not of the form key=value (e.g. epochs=1)")
        name = FinetuneConfig.MOVED.get(key.strip(), key.strip())  # an old flat key too: similarity_mode
        if name in RESERVED:
            raise ConfigError(f"{key.strip()}= is set by {RESERVED[name]}, not by a key=value setting")
    return list(overrides)


def check_configs(runs: Sequence[dict[str, Any]], device: str) -> None:
    """Build every run's FinetuneConfig (no torch, no data read), so that a mistyped key or a bad
    value fails once, before any run starts, naming the run."""
    for run in runs:
        try:
            make_config(run, device)
        except ConfigError as e:
            raise ConfigError(f"{run['id']}: {e}") from None


def lr_name(lr: float | str) -> str:
    return f"{lr:g}" if isinstance(lr, float) else str(lr)


# ---- planning -------------------------------------------------------------------------------

def readable_files(task: GlueTask, files: dict[str, Path], out: Path) -> tuple[dict[str, Path], str]:
    """The files a run of `task` reads: the release's, or, for a task whose release has lines of
    the wrong field count (QQP), a copy without them in OUT/TASK/data/; and what was left out."""
    if not task.malformed:
        return files, ""
    read, notes = {}, []
    for split, path in files.items():
        text = read_text(path, f"{task.title} file")
        bad = malformed_lines(text)
        if not bad:
            read[split] = path
            continue
        left_out = set(bad)
        keep = "\n".join(line for i, line in enumerate(text.split("\n"), start=1) if i not in left_out)
        copy = out / task.name / "data" / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        write_text(copy, keep)
        read[split] = copy
        shown = ", ".join(map(str, bad[:6])) + (", ..." if len(bad) > 6 else "")
        notes.append(f"{path}: left out {len(bad)} line(s) whose field count is not the header's (lines {shown}), "
                     "as GLUE's loaders do")
    return read, "; ".join(notes)


def run_settings(task: GlueTask, files: dict[str, Path], model: str, lr: float | str, seed: int,
                 folder: Path) -> dict[str, Any]:
    """The FinetuneConfig settings of one run (before key=value overrides)."""
    settings: dict[str, Any] = {
        "model": model, "train_file": str(files["train"]), "output_dir": str(folder), "lr": lr, "seed": seed,
        "epochs": task.epochs, "batch_size": task.batch_size, "max_length": task.max_length,
        "warmup_fraction": WARMUP_FRACTION, "weight_decay": WEIGHT_DECAY, "keep_last": 1,
        "text_column": task.text, "text_pair_column": task.pair, "label_column": task.label, "header": task.header}
    if task.regression:  # STS-B: a cross-encoder, one output trained with MSE on the 0-5 score
        settings.update(task="similarity", similarity={"mode": "cross-encoder", "score_range": [0.0, 5.0]})
    else:
        settings.update(task="classification", label_names=list(task.labels))
    return settings


# the files of a model folder that make the model: config, weights, tokenizer
MODEL_FILE_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
                       "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Size, modification time and SHA-256 of a file's bytes."""
    stat = path.stat()
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}


def model_files(model: str) -> list[Path]:
    """The files a run's model is made of: a folder's config, weights and tokenizer files; a
    config file; nothing for a preset (its name, in the settings, says it all)."""
    kind, where = locate_model(model)
    if kind == "file":
        return [Path(where)]
    if kind != "folder":
        return []
    return sorted({p for pattern in MODEL_FILE_PATTERNS for p in Path(where).glob(pattern) if p.is_file()})


def same_inputs(a: dict[str, Any] | None, b: dict[str, Any]) -> list[str]:
    """The files whose contents differ between two fingerprints (a size or a hash; a file touched
    but unchanged is the same), or that only one of them holds; [] when they match."""
    a = a or {}
    return sorted(path for path in set(a) | set(b) if not isinstance(a.get(path), dict) or not isinstance(
        b.get(path), dict) or any(a[path].get(k) != b[path].get(k) for k in ("size", "sha256")))


def plan_runs(model: str, present: dict[str, dict[str, Path]], out: Path, lrs: Sequence[float | str],
              seeds: Sequence[int], overrides: Sequence[str] = (),
              notes: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """One run per task, lr and seed, longest first (train file size x epochs): each a plain dict
    (it crosses into worker processes) whose "spec" (settings) and "inputs" (the fingerprint of
    its data files and model) are what makes a finished run reusable."""
    runs, seen = [], {}

    def fingerprint(paths: Sequence[Path]) -> dict[str, Any]:
        for path in paths:  # each file hashed once, however many runs read it
            if str(path) not in seen:
                seen[str(path)] = file_fingerprint(path)
        return {str(path): seen[str(path)] for path in paths}

    of_model = model_files(model)
    for name, files in present.items():
        task = TASKS[name]
        files, note = readable_files(task, files, out)
        if note:
            notes(f"{task.title}: {note}")
        for lr in lrs:
            for seed in seeds:
                folder = out / name / f"lr{lr_name(lr)}_seed{seed}"
                spec = {"task": name, "lr": lr, "seed": seed, "overrides": list(overrides),
                        "settings": run_settings(task, files, model, lr, seed, folder),
                        "dev": [[split, str(files[split])] for split, _ in task.dev]}
                inputs = fingerprint([files["train"], *(files[split] for split, _ in task.dev), *of_model])
                runs.append({"id": f"{name}/{folder.name}", "task": name, "lr": lr, "seed": seed,
                             "folder": str(folder), "spec": json.loads(json.dumps(spec)), "inputs": inputs,
                             "cost": files["train"].stat().st_size * task.epochs})
    return sorted(runs, key=lambda r: -r["cost"])


def earlier_result(run: dict[str, Any]) -> dict[str, Any] | None:
    """The "glue" entry of the run's results.json when it finished with the same settings."""
    path = Path(run["folder"]) / "results.json"
    try:
        glue = json.loads(path.read_text(encoding="utf-8")).get("glue")
    except (OSError, ValueError, AttributeError):
        return None
    return glue if isinstance(glue, dict) and same_spec(glue.get("spec"), run["spec"]) and "metrics" in glue else None


def same_spec(saved: Any, planned: dict[str, Any]) -> bool:
    """Whether a finished run's spec is the planned one; a spec saved with the flat keys of earlier
    versions (similarity_mode: ...) is read as it is written now."""
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.config_keys import move_old_keys

    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return False
    return {**saved, "settings": move_old_keys(FinetuneConfig, saved["settings"], note=False)} == planned


def finished(run: dict[str, Any]) -> dict[str, Any] | None:
    """The "glue" entry of the run's results.json when the run finished with the same settings
    and the same inputs (data files and model, by content)."""
    glue = earlier_result(run)
    return glue if glue is not None and not changed_inputs(run, glue) else None


def changed_inputs(run: dict[str, Any], glue: dict[str, Any]) -> list[str]:
    """The data and model files that changed since the run of `glue`. A run of an earlier version
    recorded no fingerprint: then the files modified after its results.json was written."""
    if "inputs" in glue:
        return same_inputs(glue["inputs"], run.get("inputs", {}))
    try:
        written = (Path(run["folder"]) / "results.json").stat().st_mtime_ns
    except OSError:
        return sorted(run.get("inputs", {}))
    return sorted(path for path, seen in run.get("inputs", {}).items() if seen["mtime_ns"] > written)


def inputs_path(run: dict[str, Any]) -> Path:
    """OUT/TASK/lr{lr}_seed{seed}.inputs.json: the fingerprint a run started with, beside its folder."""
    folder = Path(run["folder"])
    return folder.with_name(folder.name + ".inputs.json")


# ---- one run, in a worker -------------------------------------------------------------------

def make_config(run: dict[str, Any], device: str) -> Any:
    """The run's FinetuneConfig: its settings, then the key=value overrides."""
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.runconfig import apply_overrides, config_from_dict

    listed = "`bert-kit finetune --help` lists the settings"
    data = apply_overrides({**run["spec"]["settings"], "device": device}, run["spec"]["overrides"],
                           FinetuneConfig, listed)
    return config_from_dict(FinetuneConfig, data, "", listed)


def score_model(cfg: Any, dev: Sequence[Sequence[str]]) -> tuple[dict[str, tuple[list, list]], dict[str, int]]:
    """({split: (predictions, gold)}, {split: examples}) of the run's best/ on each dev file, read
    as the run read its training file: class ids, or the predicted scores of STS-B."""
    from bert_kit.model_folder import read_model_metadata
    from bert_kit.tasks import make_task
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.training.precision import resolve_precision

    folder = Path(cfg.output_dir) / "best"
    task = make_task(cfg.task, cfg)
    task.bind(get_tokenizer(folder))
    task.load_metadata(read_model_metadata(folder))
    precision = resolve_precision(cfg.precision, cfg.device, verbose=False, purpose="inference")
    model = task.load(folder).to(precision.device).eval()
    outputs, counts = {}, {}
    for split, path in dev:
        items = task.read_eval(path, cfg.max_eval_examples)
        if cfg.task == "similarity":
            s1, s2, gold = task.eval_pairs
            predicted = task.scores(model, s1, s2, precision).tolist()
        else:
            predicted = task.logits(model, items, precision).argmax(-1).tolist()
            gold = [item["labels"] for item in items]
        outputs[split], counts[split] = (predicted, list(gold)), len(items)
    return outputs, counts


def execute(run: dict[str, Any], device: str) -> dict[str, Any]:
    """Fine-tune and score one run; its "glue" entry, also written into its results.json. An
    interrupted earlier run continues from its last checkpoint; {"stopped": signal} when this one
    is stopped by SIGINT/SIGTERM (it saved a checkpoint to continue from)."""
    import dataclasses

    from bert_kit.training.checkpoint import latest_checkpoint
    from bert_kit.tasks.finetuning import finetune, resolve_lr

    t0 = time.time()
    cfg = resolve_lr(make_config(run, device))  # lr auto: the number, printed with its reason
    out = Path(cfg.output_dir)
    resume = "latest" if latest_checkpoint(out / "checkpoints") is not None else None
    started_with = inputs_path(run)
    if resume and started_with.is_file():
        try:
            changed = same_inputs(json.loads(started_with.read_text(encoding="utf-8")), run["inputs"])
        except ValueError:
            changed = ["(unreadable)"]
        if changed:  # its checkpoint learnt from other data, or is another model
            print(f"{run['id']}: the earlier run cannot be continued: {', '.join(changed)} changed since it started; "
                  "starting over", file=sys.stderr, flush=True)
            resume = None
    write_text(started_with, json.dumps(run["inputs"], indent=2) + "\n")
    try:
        results = finetune(dataclasses.replace(cfg, overwrite=resume is None), resume=resume)
    except ConfigError as e:
        if resume is None:
            raise
        print(f"{run['id']}: the earlier run cannot be continued ({e}); starting over", file=sys.stderr, flush=True)
        results = finetune(dataclasses.replace(cfg, overwrite=True))
    from bert_kit.training.results import interrupted

    if interrupted(results):  # a signal: the sweep stops; early stopping ended the run, which is scored
        return {"stopped": results["stopped"]}
    task = TASKS[run["task"]]
    outputs, counts = score_model(cfg, run["spec"]["dev"])
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    glue = {"spec": run["spec"], "inputs": run["inputs"], "task": task.name, "lr": cfg.lr, "seed": cfg.seed,
            "metrics": task_metrics(task, outputs), "train_examples": results.get("num_train_examples"),
            "dev_examples": counts if len(counts) > 1 else next(iter(counts.values())),
            "seconds": round(time.time() - t0, 2), "train_seconds": results.get("train_time_s"),
            "precision": results.get("precision"), "device": gpu or device, "folder": str(out)}
    write_text(out / "results.json", json.dumps({**results, "glue": glue}, indent=2) + "\n")
    remove_entry(out / "checkpoints")  # the run is done: best/ and the figures are what is kept
    remove_entry(started_with)  # results.json holds the fingerprint now
    return glue


@contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so everything: tqdm,
    warnings, native code) to `path` for a while; None: leave them."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def log_path(run: dict[str, Any]) -> Path:
    """OUT/TASK/lr{lr}_seed{seed}.log, beside the run's folder (the lr's dot is no suffix to replace)."""
    folder = Path(run["folder"])
    return folder.with_name(folder.name + ".log")


def guarded(run: dict[str, Any], device: str, log: bool, execute: Callable = execute) -> dict[str, Any]:
    """`execute(run, device)`, its outcome as a picklable dict: {"glue": ...}, {"stopped": ...} or
    {"error": exc}."""
    try:
        with output_to(log_path(run) if log else None):
            outcome = execute(run, device)
        outcome = outcome if "stopped" in outcome else {"glue": outcome}
    except Exception as e:  # one run failing leaves the others to run; the command reports it
        outcome = {"error": e}
    finally:
        free_memory()
    try:
        pickle.loads(pickle.dumps(outcome))
    except Exception:  # an exception that cannot cross processes goes as its message
        error = outcome.get("error")
        outcome = {"error": RuntimeError(f"{type(error).__name__}: {error}")}
    return outcome


def free_memory() -> None:
    """What a finished run held on the device, back before the next run of this process."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- scheduling -------------------------------------------------------------------------------

def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries, without importing torch:
    that variable's entries when set, else one per NVIDIA device of the driver."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [e.strip() for e in env.split(",") if e.strip() and not e.strip().startswith("-")]
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return [str(i) for i in range(len(list(proc.iterdir())))]
    if shutil.which("nvidia-smi"):
        try:
            found = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return [str(i) for i, line in enumerate(ln for ln in found.splitlines() if ln.startswith("GPU "))]
    return []


def _worker(slot: int, gpu: str, todo: Any, done: Any, log: bool, execute: Callable) -> None:
    """Worker `slot`'s process: CUDA_VISIBLE_DEVICES=gpu, then runs from `todo` until a None."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before torch is imported: this GPU is cuda:0 here
    while True:
        run = todo.get()
        if run is None:
            return
        done.put(("start", slot, run["id"], None))
        outcome = guarded(run, "cuda", log, execute)
        done.put(("done", slot, run["id"], outcome))
        if "stopped" in outcome:
            return


def run_all(runs: list[dict[str, Any]], gpus: Sequence[str] | None,
            on_event: Callable[[str, dict[str, Any], str, dict | None], None],
            execute: Callable[[dict[str, Any], str], dict[str, Any]] = execute) -> dict[str, dict[str, Any]]:
    """Every run's outcome ({"glue"}, {"stopped"} or {"error"}) by run id. gpus: CUDA_VISIBLE_DEVICES
    entries, one worker process each (an entry given twice: two processes share that GPU); None or
    empty: the CPU, one run at a time in this process.
    on_event(kind, run, where, outcome): "start" and "done" as they happen. execute(run, device):
    what a run does (a module-level function: worker processes import it by name)."""
    by_id = {r["id"]: r for r in runs}
    outcomes: dict[str, dict[str, Any]] = {}
    if not gpus:
        for run in runs:
            on_event("start", run, "cpu", None)
            outcomes[run["id"]] = outcome = guarded(run, "cpu", False, execute)
            on_event("done", run, "cpu", outcome)
            if "stopped" in outcome:
                break
        return outcomes

    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: CUDA is set up in the child only
    todo, done = ctx.Queue(), ctx.Queue()
    for run in runs:
        todo.put(run)
    slots = list(gpus)[:len(runs)]  # worker i runs on GPU slots[i]
    workers = [ctx.Process(target=_worker, args=(i, gpu, todo, done, len(gpus) > 1, execute), name=f"glue-gpu{gpu}")
               for i, gpu in enumerate(slots)]
    for _ in workers:
        todo.put(None)
    for process in workers:
        process.start()
    running: dict[int, str] = {}  # worker -> the id of its run

    def handle(message: tuple) -> None:
        kind, slot, run_id, outcome = message
        if kind == "start":
            running[slot] = run_id
        else:
            running.pop(slot, None)
            outcomes[run_id] = outcome
        on_event(kind, by_id[run_id], f"GPU {slots[slot]}", outcome)

    try:
        while len(outcomes) < len(runs):
            try:
                handle(done.get(timeout=1.0))
                continue
            except queue.Empty:
                pass
            if any(p.is_alive() for p in workers):
                continue
            while True:  # every worker has ended: what they said last, then what they never said
                try:
                    handle(done.get(timeout=0.2))
                except queue.Empty:
                    break
            for slot, run_id in list(running.items()):
                code = workers[slot].exitcode
                outcomes[run_id] = {"error": RuntimeError(f"the worker process of GPU {slots[slot]} ended (exit code "
                                                          f"{code}) during this run")}
                on_event("done", by_id[run_id], f"GPU {slots[slot]}", outcomes[run_id])
            break
    finally:
        for process in workers:
            process.join(timeout=120)  # after Ctrl-C a run saves a checkpoint first
            if process.is_alive():
                process.terminate()
    return outcomes
