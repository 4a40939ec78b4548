"""The one training loop. Pretraining and every fine-tuning task run through `train`, top to bottom.

    run = start_run(cfg, resume)          # the run folder, device and precision, what to resume
    job = PretrainingJob(cfg, run)        # or FinetuningJob: model, data, loss, evaluation
    results = train(job, cfg, run)

A `Job` plugs in what differs between jobs: the micro-batches of each optimizer step, the loss,
what a batch counts (tokens or examples), the evaluation, which model folder to keep (best/ by a
validation metric, or final/) and the data position. Everything else is here, once: the optimizer
and lr schedule, gradient accumulation, logging windows, evaluation cadence, best/ selection,
checkpoints, stop signals, non-finite losses, resuming, a time budget and the results summary.
What a framework does, the update over a step's micro-batches, the state a checkpoint holds and
the forward passes of evaluation, is an engine's (`engine.py`: PyTorch, or JAX with `engine: jax`).

What the loop promises:
* A run folder belongs to one run at a time: the run holds a lock on it (`FolderLock`), so a second
  run started into it stops at once. A fresh run where another one left checkpoints or metrics
  stops with an error (resume it, or `overwrite: true` to start over). The folder's record
  (bert_kit/outputs.py) lists what runs wrote there: `overwrite` deletes only that, never a user's
  file, never through a link, and never an input of the new run.
* Nothing is lost: checkpoints every `save_every` steps and at the end (`end_checkpoint`), written
  atomically; SIGINT/SIGTERM (also to a whole process group with DataLoader workers) finish the
  step, save and exit 130/143; a NaN/inf loss stops the run before it is saved, the last
  checkpoint stays good.
* No host-device synchronisation in steady-state steps on a GPU: losses stay on the device and
  are read back at log steps (with a fused optimizer a non-finite loss makes it skip every update
  from then on, so the weights that are saved are those of the last good step).
* `results.json` describes the whole run, after any number of resumes: it is computed from the
  run's own metrics.jsonl records (first loss, units trained, time, throughput, final loss). When
  records were lost (metrics.jsonl deleted or cut), resuming says so and results.json says which
  steps its figures cover (`metrics_steps`, `metrics_complete`).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from bert_kit.checks import ConfigError
from bert_kit.outputs import FolderLock, write_text
from bert_kit.training.checkpoint import (Background, StopSignal, checkpoint_writer, latest_checkpoint,
                                          load_trainer_state, resolve_checkpoint, restore_rng_state, save_checkpoint,
                                          seed_everything, snapshot, write_folder_atomically)
from bert_kit.training.distributed import (all_reduce_mean, any_ranks, barrier, collective_errors, is_main,
                                           max_over_ranks, world_size)
from bert_kit.training.engine import Engine, join_processes, start_engine
from bert_kit.training.optim import Schedule
from bert_kit.training.precision import Precision, resolve_device, resolve_precision, start_cuda
from bert_kit.training.progress import METRICS_FILE, LossPlotter, ProgressLogger, read_metrics, truncate_metrics
from bert_kit.training.run_folder import claim_run_folder
from bert_kit.training.runconfig import config_to_dict, save_config
from bert_kit.training.settings import RESUMABLE_CHANGES, RunSettings
from bert_kit.training.trainer import NonFiniteLossError

UNBOUNDED_STEPS = 10**12  # total steps of a run that a time budget ends
# Under torchrun the ranks agree on the budget's end, the lr's clock and a stop signal in collectives
# that wait for the device: done every step, they keep the host from queuing the next steps (bert-small
# replayed as CUDA graphs on 4 GPUs: 8.27M tokens/s against 9.45M). One process agrees with itself every
# step; several agree every AGREE_S seconds' worth of steps.
AGREE_S = 0.25


class Job:
    """What a job plugs into `train`. A subclass sets these attributes and implements the methods.

    model: the model to train, on its device (the torch engine wraps it for DDP/FSDP2; the JAX engine
        copies its weights, and writes them back into it before `save_model`);
    tokenizer: saved with every checkpoint and model folder;
    total_steps: optimizer steps of the whole run; steps_per_epoch: for the `epoch` of log records;
    unit: what `count` counts ("tokens" or "examples");
    metric: validation metric that picks best/ (higher is better), or None: the last weights are kept;
    model_folder: the folder the kept model goes to; eval_every, save_every: the cadence in steps.
    engine: set by the loop: the engine that trains the model, and runs it in `evaluate`.
    """

    name = "train"
    unit = "examples"
    metric: str | None = None
    model_folder = "final"  # where the kept model goes: best/ (by `metric`) or final/ (the last weights)
    cuda_graphs = False  # replay each batch shape's whole step as a CUDA graph (the torch engine's AMPTrainer)
    compiled_graphs = False  # the compiled model replays its forward and backward as CUDA graphs (inductor's)
    fast_path = ""  # what `fast_path.apply` put on the model, one line: run_config.yaml's first (a comment)
    eval_every = save_every = 0  # steps between evaluations / checkpoints (0: at the end only)
    model: nn.Module
    tokenizer: Any
    total_steps: int
    steps_per_epoch: int | None = None
    engine: Engine

    def step_batches(self, step: int) -> list[dict]:
        """The micro-batches of optimizer update `step` (0-based), on the host."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss, {name: part}) of one micro-batch already on the device; `model` may be DDP-wrapped.
        The torch engine's; the JAX engine has the same losses of its own (`bert_kit.jax.train`)."""
        raise NotImplementedError

    def count(self, batch: dict) -> int:
        """Tokens or examples in a host batch (no device access)."""
        raise NotImplementedError

    def evaluate(self, final: bool) -> dict[str, float] | None:
        """Validation metrics of the current weights (None: no validation data). `final`: the last one."""
        return None

    def final_eval_steps(self) -> float:
        """What the last evaluation costs, in training steps (a forward pass is about a third of a
        step on a batch of the same size): a time budget keeps this much time for it."""
        return 0.0

    def save_model(self, folder: Path, state: dict | None) -> None:
        """An HF model folder with tokenizer and metadata; `state` is the full state dict of a
        sharded model (`collect_state`). Called on rank 0 only."""
        raise NotImplementedError

    def data_state(self) -> dict:
        """The data position, saved in checkpoints. Called on every rank."""
        return {}

    def load_data_state(self, state: dict) -> None:
        """Continue at a saved data position."""

    def log(self, text: str) -> None:
        """A message line (the loop routes it past its progress bar)."""
        print(text, file=sys.stderr, flush=True)

    def log_fields(self) -> dict[str, Any]:
        """Extra values for train records (phase, epoch, ...)."""
        return {}

    def results(self, final: dict[str, float] | None, summary: dict[str, Any]) -> dict[str, Any]:
        """The job's entries of results.json, from the final metrics and the loop's summary."""
        return {}


@dataclass
class Run:
    """What `start_run` resolved before a job is built."""

    out: Path  # the run folder
    choose_precision: Callable[[], Precision]  # device and precision (waits for CUDA's start)
    checkpoint: Path | None  # checkpoint folder to resume from
    state: dict | None  # its trainer state
    started: float  # time.time() the run's clock (a time budget) counts from
    budget_s: float | None  # seconds left of the time budget

    @cached_property
    def precision(self) -> Precision:
        """Device and precision, resolved (and printed) at the first use: a job reads its data
        and builds its model on the CPU first, while CUDA starts in a thread (`start_cuda`)."""
        return self.choose_precision()


# ---- before the job: resuming, changed settings --------------------------------------------------

def settings_changes(saved: dict, cfg: RunSettings) -> tuple[dict, dict]:
    """({key: (old, new)} of every changed setting, the part of it a resume may not change)."""
    now = config_to_dict(cfg)
    changed = {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}
    refused = {k: c for k, c in changed.items() if k not in RESUMABLE_CHANGES}
    return changed, refused


def start_run(cfg: RunSettings, resume: str | None, started: float | None = None) -> Run:
    """Resolve device and precision (printed once), the checkpoint to resume and its settings;
    claim the run folder; seed every RNG. Settings that may not change on resume stop the run.
    started: time.time() the run's clock counts from (default: now)."""
    started = time.time() if started is None else started
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir={out} is a file, not a folder")
    try:
        checkpoint = resolve_checkpoint(resume, out) if resume else None
    except FileNotFoundError as e:
        if (out / "results.json").is_file() and not cfg.end_checkpoint:  # a finished run, as configured
            e.args = (f"{e}: the run there finished without an end checkpoint (end_checkpoint: false, the "
                      "fine-tuning default); start a new run from its model folder, or set end_checkpoint=true "
                      "in runs you mean to extend",)
        raise
    state = load_trainer_state(checkpoint) if checkpoint else None
    budget = cfg.time_budget_s
    if state is not None:
        changed, refused = settings_changes(state.get("run_config") or {}, cfg)
        if refused and not cfg.force_resume:
            shown = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
            raise ConfigError(f"cannot resume {checkpoint} with changed settings that shape the run ({shown}); "
                             f"restore them, or pass force_resume=true")
        if changed and is_main():
            shown = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
            print(f"resuming with changed settings: {shown}", file=sys.stderr, flush=True)
        if budget is not None:  # the budget left when the checkpoint was written
            budget = max(0.0, budget - float(state.get("budget_used_s", 0.0)))
    claim_run_folder(out, checkpoint is not None, cfg)
    seed_everything(cfg.seed)  # before CUDA starts: its seed is queued, not waited for
    if cfg.engine == "jax":  # torch builds the batches and the first weights, on the CPU; JAX computes
        return Run(out, lambda: resolve_precision("fp32", "cpu", verbose=False), checkpoint, state, started, budget)
    device = resolve_device(cfg.device)  # a bad or missing device is an error now
    start_cuda(device)

    def choose() -> Precision:
        precision = resolve_precision(cfg.precision, device, verbose=is_main())
        if precision.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul left
        return precision

    return Run(out, choose, checkpoint, state, started, budget)


def run_job(make_job: Any, cfg: RunSettings, resume: str | None, started: float | None = None) -> dict[str, Any]:
    """The whole of `pretrain` and `finetune`: join the process group (under torchrun), start the
    run, build the job (`make_job(cfg, run)`) and train it. If another rank dies or stalls for
    longer than `dist_timeout_s`, the others stop with a one-line `DistributedError`. Rank 0 holds
    the run folder's lock from before the run touches the folder to its end."""
    join_processes(cfg)  # torchrun's ranks, or a JAX run's hosts
    with collective_errors(cfg.dist_timeout_s):
        out = Path(cfg.output_dir)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output_dir={out} is a file, not a folder")
        lock = FolderLock(out).acquire() if is_main() else None
        try:
            run = start_run(cfg, resume, started)
            return train(make_job(cfg, run), cfg, run)
        finally:
            if lock is not None:
                lock.release()


# ---- the loop ---------------------------------------------------------------------------------

def train(job: Job, cfg: RunSettings, run: Run) -> dict[str, Any]:
    """Train `job` to the end of its steps (or time budget, or a stop signal); return the results."""
    main, out = is_main(), run.out
    ckpt_dir = out / "checkpoints"

    # 1. the engine over the job's model (its ranks, optimizer, precision), the schedule; then the resumed state
    engine = job.engine = start_engine(job, cfg, run)
    total = job.total_steps
    # the lr of every update, on the host: the engine takes it as a number (a time budget moves it with the clock)
    schedule = Schedule(cfg.lr, total, cfg.warmup_steps, cfg.warmup_fraction, cfg.schedule,
                        cfg.min_lr_ratio, cfg.time_budget_s)
    # a time budget's schedule runs on the clock: trained_s is the budget's time since a session's
    # first step (evaluations and checkpoints included), train_span_s that time plus what is left
    step, best, trained_s, train_span_s = 0, {"value": None, "step": None, "metrics": None}, 0.0, None
    records, records_lost = 0, False  # train records the run logged (all sessions); some missing from metrics.jsonl
    state = run.state
    if state is not None:
        engine.load_checkpoint(run.checkpoint, state)  # weights, optimizer state, step count
        step = int(state["step"])
        best = state.get("best") or best
        schedule.load_state_dict(state.get("schedule") or {})
        trained_s, train_span_s = float(state.get("trained_s", 0.0)), state.get("train_span_s")
        job.load_data_state(state.get("data") or {})
    run_config = config_to_dict(cfg)
    if main:
        save_config(cfg, out / "run_config.yaml", note=job.fast_path)
        if state is not None:
            truncate_metrics(out, step)  # records after the checkpoint belong to the lost steps
            records, records_lost = check_records(out, step, state.get("train_records"))
    if step >= total:
        job.total_steps = total = step  # resumed at (or past) the end: evaluate and write the model

    def budget_left() -> float:
        return float("inf") if run.budget_s is None else run.budget_s - (time.time() - run.started)

    # where this session's time goes (results.json "timings"): launch to the first step, the first
    # step (compilation, capture), evaluations (with best/), checkpoints, the other steps, the end
    spent = {"eval": 0.0, "save": 0.0}
    t_first: list[float] = []  # the session's first step: its start and end
    writing: list[Background] = []  # the end checkpoint, written while the last evaluation runs
    models: list[Background] = []  # best/ (final/), written from a copy while the steps go on

    def save(step: int, background: bool = False) -> None:
        """A checkpoint of this step (every rank calls it: FSDP2 gathers shards, streams gather positions).
        background: rank 0 writes it in a thread (`written` waits for it): the weights change no more."""
        t0 = time.time()
        try:
            checkpoint(step, background)
        finally:
            spent["save"] += time.time() - t0

    def checkpoint(step: int, background: bool) -> None:
        engine.check_finite()  # never save weights after a skipped (non-finite) step
        saved, data = engine.checkpoint_state(), job.data_state()
        if main:
            model_written()  # the best/ that the checkpoint's "best" describes is whole first
            used = (cfg.time_budget_s or 0.0) - budget_left() if run.budget_s is not None else 0.0
            args = (ckpt_dir, step, job.model)
            kwargs = dict(tokenizer=job.tokenizer, run_config=run_config, data_state=data, keep_last=cfg.keep_last,
                          **saved, extra={"best": best, "schedule": schedule.state_dict(), "trained_s": trained_s,
                                          "train_span_s": train_span_s, "budget_used_s": used,
                                          "train_records": records})
            if background:
                writing.append(checkpoint_writer(*args, **kwargs))
            else:
                logger.message(f"step {step}: saved {save_checkpoint(*args, **kwargs)}")
        barrier()

    def written() -> None:
        """Wait for the end checkpoint (the wait is checkpoint time); its error is the run's."""
        if writing:
            t0 = time.time()
            try:
                path = writing.pop().result()
            finally:
                spent["save"] += time.time() - t0
            print(f"step {step}: saved {path}", file=sys.stderr, flush=True)

    def evaluate(final: bool) -> dict[str, float] | None:
        t0 = time.time()
        try:
            return validate(final)
        finally:
            spent["eval"] += time.time() - t0

    def validate(final: bool) -> dict[str, float] | None:
        """Validation metrics (logged); best/ follows the job's metric."""
        nonlocal best
        metrics = job.evaluate(final)
        if metrics is None:
            return None
        logger.log("eval", step, **metrics, **({"final": True} if final else {}))
        if final and plotter is not None:
            plotter.start(out, metric=job.metric)  # the last record: drawn while the model folder is written
        improved = job.metric is not None and (best["value"] is None or metrics[job.metric] > best["value"])
        if improved:
            best = {"value": metrics[job.metric], "step": step, "metrics": metrics}
            write_model(out / job.model_folder)
        shown = job.metric or next(iter(metrics))
        logger.message(f"step {step}: {shown} {metrics[shown]:.4f}{' (best, saved best/)' if improved else ''}")
        return metrics

    def write_model(folder: Path) -> None:
        """The job's model folder, written by a thread from a CPU copy of the weights (the copy's
        wait is evaluation time; the write overlaps the next steps)."""
        state = engine.model_state()  # every rank: gathers FSDP2 shards
        if main:
            model_written()  # one at a time
            state = snapshot(job.model) if state is None else state
            models.append(Background(write_folder_atomically, folder, lambda tmp: job.save_model(tmp, state)))

    def model_written() -> None:
        """Wait for the model folder being written; its error is the run's."""
        if models:
            models.pop().result()

    # 2. the loop: one iteration = one optimizer step over the job's micro-batches
    logger = ProgressLogger(out, total if total < UNBOUNDED_STEPS else None, step, enabled=main,
                            tensorboard=cfg.tensorboard, desc=job.name)
    plotter = LossPlotter() if main else None  # imports matplotlib beside the training, draws at the end
    job.log = logger.message
    logger.log("start", step, resumed_from=str(run.checkpoint) if run.checkpoint else None, world_size=world_size())
    window: dict[str, Any] = {"n": 0, "units": 0, "seconds": 0.0}
    reserve_s, stopped, final_metrics = 5.0, None, None  # reserve: what the end takes (save, evaluate)
    step_s, step_s_synced, eval_timed = 0.0, False, False  # a step's wall time (latest); evaluation timed yet

    def end_reserve() -> float:
        """Seconds the end needs: saving, and the last evaluation (estimated from the step time until
        an evaluation is timed)."""
        between = AGREE_S if world_size() > 1 else 0.0  # the steps until the ranks next agree
        if eval_timed:
            return reserve_s + between
        return max(reserve_s, 1.5 * job.final_eval_steps() * step_s + 5.0) + between

    last_save, first_step = time.time(), step
    lr_clock_s, next_agreement = trained_s, step + 1  # the schedule's clock, the same on every rank
    t_clock = last_save  # the schedule clock's last reading (a session's first step is not counted)
    ended = False  # the loop and the last evaluation are over (else the run failed: no picture)
    try:
        with StopSignal() as stop, engine.running():
            if state is not None:
                restore_rng_state(state)  # last thing before training continues
            while step < total:
                # (a) one optimizer update over the step's micro-batches, queued on the device
                t_step = time.time()
                lr = schedule.apply(step, lr_clock_s, train_span_s)
                micro = job.step_batches(step)
                window["units"] += sum(job.count(batch) for batch in micro)
                engine.step(micro, lr)
                if not t_first:
                    t_first.append(t_step)
                step += 1
                window["n"] += 1
                # what any rank saw, in one collective: the budget's end, a checkpoint due by the clock
                agree = step >= next_agreement or step == total
                late = agree and bool(cfg.save_minutes) and time.time() - last_save >= 60 * cfg.save_minutes
                out_of_time, late = any_ranks(budget_left() < end_reserve(), late) if agree else (False, False)
                ending = step == total or out_of_time

                # (b) a train record every log_every steps: the one host-device sync of a window
                if step % cfg.log_every == 0 or step == 1 or ending:
                    losses, grad_norm, skipped = engine.read_window()  # waits for the window's steps
                    window["seconds"] += time.time() - t_step  # the queued steps of the window are done
                    losses = {k: all_reduce_mean(v) for k, v in losses.items()}
                    if step != first_step + 1:  # the window's steps are done (synced): their true time
                        step_s, step_s_synced = window["seconds"] / window["n"], True
                    units, seconds = window["units"] * world_size(), window["seconds"]
                    if skipped:  # one bad batch is survived; many in a row stop the run (the engine)
                        logger.message(f"step {step}: {skipped} step(s) since the last record skipped: "
                                       "non-finite gradient with a finite loss")
                    logger.log("train", step, **losses, lr=lr, grad_norm=grad_norm,
                               **{job.unit: units, "seconds": round(seconds, 4), f"{job.unit}_per_s": units / seconds},
                               **({"skipped_steps": skipped} if skipped else {}), **job.log_fields())
                    records += 1
                    logger.update(step, loss=losses.get("loss"), lr=lr, **{f"{job.unit}/s": f"{units / seconds:,.0f}"})
                    window = {"n": 0, "units": 0, "seconds": 0.0}
                else:
                    window["seconds"] += time.time() - t_step
                    logger.update(step)
                if len(t_first) == 1:  # the first step's end: after its record (a run's step 1), which waited for it
                    t_first.append(time.time())
                # A session's first step compiles and captures (tens of seconds when compiled): not on
                # the schedule's clock, or a time budget's warm-up would be spent before the second step.
                now = time.time()
                if step != first_step + 1:
                    trained_s += now - t_clock  # this step, and any evaluation or checkpoint before it
                    if not step_s_synced:  # the host's time of a step, until a record times a window
                        step_s = now - t_step
                t_clock = now
                if agree:  # what is left, counted again: the lr ends near zero
                    left = budget_left() - end_reserve()
                    if world_size() > 1:  # each rank's clock differs a little: one lr for all, or the weights part
                        trained_s, left, agreed_step_s = max_over_ranks(trained_s, -left, step_s)  # the earliest end
                        left = -left
                        next_agreement = step + (max(1, int(AGREE_S / agreed_step_s)) if agreed_step_s > 0 else 1)
                    else:
                        next_agreement = step + 1
                    if run.budget_s is not None:
                        lr_clock_s, train_span_s = trained_s, trained_s + max(1.0, left)

                # (c) evaluation (the last one comes after the loop)
                stopping = agree and any_ranks(stop.signum is not None)[0]  # a signal arrives at any time: asked late
                if job.eval_every and step % job.eval_every == 0 and not (ending or stopping):
                    t_eval = time.time()
                    evaluate(final=False)
                    reserve_s = max(reserve_s, 2 * (time.time() - t_eval) + 5.0)
                    eval_timed = True

                # (d) checkpoint every save_every steps or save_minutes, when asked to stop, at the end
                # (or out of time) unless end_checkpoint is off
                due = late or bool(job.save_every and step % job.save_every == 0)
                if stopping or due or ((ending or out_of_time) and cfg.end_checkpoint):
                    t_save = last_save = time.time()
                    # at the end (not stopped: a stop signal's checkpoint is the last thing the run does),
                    # the torch engine's checkpoint is written while the last evaluation runs
                    save(step, background=(ending or out_of_time) and not stopping and engine.name == "torch")
                    reserve_s = max(reserve_s, 3 * (time.time() - t_save) + 5.0)
                if stopping:
                    stopped = signal.Signals(stop.signum or signal.SIGTERM).name
                    break
                if out_of_time:
                    logger.message(f"step {step}: time budget spent ({cfg.time_budget}); ending the run")
                    break

        t_loop_end, in_loop = time.time(), dict(spent)
        # 3. the last evaluation and the model folder (not after a stop signal: the run goes on later)
        if stopped is None:
            final_metrics = evaluate(final=True)
            if job.metric is None or best["step"] is None:
                write_model(out / job.model_folder)
        ended = True
    except NonFiniteLossError as e:
        last = latest_checkpoint(ckpt_dir)
        logger.log("error", e.step, message=str(e))
        e.args = (f"{e}: stopping without saving this step. Last good checkpoint: {last or 'none'}. "
                  "Try a lower lr, clip_grad > 0, or another precision.",)
        raise
    finally:
        for thread in [*writing, *models] if not ended else []:
            thread.join()  # a failed end still leaves checkpoint and best/ whole, before the folder's lock goes
        if plotter is not None and not ended:
            plotter.close()  # a failed run draws no curve
        logger.close()
        job.engine = None  # the job and its engine refer to each other: freed now, loader workers and all

    # 4. results.json, from the run's own records (all sessions of a resumed run)
    summary = summarize(out, job.unit) if main else {}
    results = {"steps": step, "stopped": stopped, "output_dir": str(out), "world_size": world_size(),
               "precision": str(engine.precision), **summary,
               "best_value": best["value"], "best_step": best["step"], "best_metrics": best["metrics"],
               "final_metrics": final_metrics, "wall_time_s": None,
               **({"metrics_complete": not records_lost} if main else {})}
    results.update(job.results(final_metrics, results))
    if main:
        try:
            plotter.draw(out, metric=job.metric)
        except ValueError:
            pass  # nothing logged yet (stopped before the first step)
        except ImportError as e:  # the run is saved; only the picture is missing
            print(f"no loss plot ({e}); `bert-kit plot {out}` draws it later", file=sys.stderr)
        written()
        model_written()
        results["wall_time_s"] = time.time() - run.started
        results["timings"] = timings(run.started, t_first, t_loop_end, in_loop, spent, results["wall_time_s"])
        write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    barrier()
    return results


def timings(started: float, first: list[float], loop_end: float, in_loop: dict[str, float],
            spent: dict[str, float], wall_s: float) -> dict[str, float]:
    """Seconds of a session, launch to results.json: start (imports, model, data, tokenizing up to the
    first step), first_step (its compilation and capture), train (the other steps), eval (every
    evaluation, best/ included), save (checkpoints) and end (the final model, plot; and the rest)."""
    if not first:  # stopped before a step
        return {"start_s": round(wall_s, 3), "end_s": 0.0}
    start, first_step = first[0] - started, first[1] - first[0]
    train = max(0.0, loop_end - first[1] - in_loop["eval"] - in_loop["save"])
    parts = {"start_s": start, "first_step_s": first_step, "train_s": train, "eval_s": spent["eval"],
             "save_s": spent["save"]}
    parts["end_s"] = max(0.0, wall_s - sum(parts.values()))
    return {k: round(v, 3) for k, v in parts.items()}


def check_records(out: Path, step: int, saved: int | None) -> tuple[int, bool]:
    """(train records the run logged up to `step`, whether some are missing from metrics.jsonl),
    with one warning line when they are. `saved`: the count the checkpoint recorded (None for a
    checkpoint from before it did: then a run's first record, of step 1, must be there)."""
    path = out / METRICS_FILE
    kept = [r["step"] for r in (read_metrics(out) if path.is_file() else []) if r.get("type") == "train"]
    expected = len(kept) if saved is None else max(int(saved), len(kept))
    lost = len(kept) < expected or (step > 0 and 1 not in kept)
    if lost:
        what = f"{len(kept)} of the {expected} train records" if saved is not None else "no record of step 1"
        print(f"warning: {path} holds {what} up to step {step} (deleted or cut?): training goes on, and results.json "
              "covers only the steps recorded (metrics_steps; metrics_complete: false)", file=sys.stderr, flush=True)
    return expected, lost


def summarize(out: Path, unit: str) -> dict[str, Any]:
    """First and final train losses, units trained, training time, throughput and steps skipped for
    a non-finite gradient of the whole run, from metrics.jsonl (records of steps lost to a crash
    were dropped on resume), and the first and last step those records cover."""
    records = [r for r in read_metrics(out) if r.get("type") == "train"]
    if not records:
        return {"initial_train_loss": None, "train_loss": None, f"train_{unit}": 0, "train_time_s": 0.0,
                f"{unit}_per_second": None, "skipped_steps": 0, "metrics_steps": None}
    keys = [k for k in records[0] if k.endswith("loss")]
    tail = records[-max(1, len(records) // 10):]  # the final train loss averages the last 10% of records
    units = sum(r.get(unit, 0) for r in records)
    seconds = sum(r.get("seconds", 0.0) for r in records)
    summary: dict[str, Any] = {}
    for k in keys:
        values = [r[k] for r in tail if r.get(k) is not None]
        summary[f"initial_train_{k}" if k != "loss" else "initial_train_loss"] = records[0].get(k)
        summary[f"train_{k}" if k != "loss" else "train_loss"] = float(np.mean(values)) if values else None
    summary.update({f"train_{unit}": units, "train_time_s": round(seconds, 3),
                    f"{unit}_per_second": units / seconds if seconds else None,
                    "skipped_steps": sum(r.get("skipped_steps", 0) for r in records),
                    "metrics_steps": [records[0]["step"], records[-1]["step"]]})
    return summary
