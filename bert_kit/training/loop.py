"""The one training loop. Pretraining and every fine-tuning task run through it, top to bottom.

    run = start_run(cfg, resume, engine=TorchEngine)   # the run folder, the device, what to resume
    job = PretrainingJob(cfg, run)                      # or FinetuningJob: model, data, loss, evaluation
    results = TrainingLoop(job, cfg, run, TorchEngine).train()

(`run_job` does these three.) A `Job` (job.py) plugs in what differs between jobs: the micro-batches
of each optimizer step, the loss, what a batch counts, the evaluation, which model folder to keep
and the data position. An `Engine` (engine.py: PyTorch, or JAX with `engine: jax`) does what a
framework does: the update over a step's micro-batches, the state a checkpoint holds, the forward
passes of evaluation. Everything else is here, once, as methods of `TrainingLoop` a reader finds
by name: `train` (the whole run), `train_step` (one optimizer update), `log_window` (a train
record), `decide` (what the end of a step asks for: stop, evaluate, save), `evaluate` (with best/),
`checkpoint`, `write_model` and `finish` (the last evaluation, the model folder, results.json).
The time budget's clock is `clock.BudgetClock`; the ranks agree in one place, `distributed.Agreement`.

What the loop promises:
* A run folder belongs to one run at a time: the run holds a lock on it (`FolderLock`), so a second
  run started into it stops at once. A fresh run where another one left checkpoints or metrics
  stops with an error (resume it, or `overwrite: true` to start over). The folder's record
  (bert_kit/outputs.py) lists what runs wrote there: `overwrite` deletes only that, never a user's
  file, never through a link, and never an input of the new run.
* Nothing is lost: checkpoints every `save_every` steps (or `save_minutes`) and at the end
  (`end_checkpoint`), written atomically; SIGINT/SIGTERM (also to a whole process group with
  DataLoader workers) finish the step, save and exit 130/143; a NaN/inf loss stops the run before it
  is saved, the last checkpoint stays good.
* No host-device synchronisation in steady-state steps on a GPU: losses stay on the device and
  are read back at log steps (with a fused optimizer a non-finite loss makes it skip every update
  from then on, so the weights that are saved are those of the last good step).
* A time budget (`time_budget`) ends the run when it is spent, keeping time for the last
  evaluation and saves; the lr schedule then runs on its clock.
* Checkpoints at the end and the kept model folder are written by threads from copies of the
  weights, while the run goes on; results.json is written once every write has ended.
* `results.json` describes the whole run, after any number of resumes (results.py), with the
  session's `timings`; resuming a finished run, rewinding one, and the settings a resume may
  change are resume.py's.

Early stopping (`job.patience` evaluations of `metric` without an improvement by more than
`job.min_delta`) is counted by `Best` and ends the run through its `Decision` (`stopping_early`):
the evaluation that spent the patience is the run's last, and results.json says
`"stopped": "early_stopping"`. A tracker (TensorBoard, MLflow, W&B: `report_to`, trackers.py)
gets every record through the logger, and one that reads each evaluation may end the run after
it (`stop_reason`: a hyperparameter search's pruned trial, recorded in results.json). A new job
is a `Job`.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError
from bert_kit.outputs import FolderLock
from bert_kit.training.checkpoint import (Background, StopSignal, checkpoint_writer, latest_checkpoint,
                                          restore_rng_state, save_checkpoint, seed_everything, snapshot,
                                          write_folder_atomically)
from bert_kit.training.clock import BudgetClock, Timings, now
from bert_kit.training.distributed import (Agreement, all_reduce_mean, barrier, collective_errors, is_main,
                                           world_size)
from bert_kit.training.engine import Engine, TorchEngine
from bert_kit.training.job import Job, Run
from bert_kit.training.optim import Schedule
from bert_kit.training.progress import LossPlotter, ProgressLogger, truncate_metrics
from bert_kit.training.results import EARLY_STOPPING, Best, check_records, model_entries, summarize, write_results
from bert_kit.training.resume import check_changes, finished_message, resume_point, rewind, stopped_early
from bert_kit.training.run_folder import claim_run_folder
from bert_kit.training.runconfig import config_to_dict, save_config
from bert_kit.training.settings import RunSettings, tracker_names
from bert_kit.training.trackers import make_trackers
from bert_kit.training.trainer import NonFiniteLossError

__all__ = ["UNBOUNDED_STEPS", "Job", "Run", "TrainingLoop", "run_job", "start_run"]

UNBOUNDED_STEPS = 10**12  # total steps of a run that a time budget ends


def run_job(make_job: Any, cfg: RunSettings, resume: str | None, started: float | None = None,
            engine: type[Engine] | None = None, trackers: list[Any] | None = None) -> dict[str, Any]:
    """The whole of `pretrain` and `finetune`: join the process group (under torchrun), start the
    run, build the job (`make_job(cfg, run)`) and train it with `engine` (the class; the jobs look
    it up by `cfg.engine`, default `TorchEngine`). If another rank dies or stalls for longer than
    `dist_timeout_s`, the others stop with a one-line `DistributedError`. Rank 0 holds the run
    folder's lock from before the run touches the folder to its end. trackers: more trackers
    than the settings' `report_to` (a search trial's)."""
    engine = engine or TorchEngine
    engine.join_processes(cfg)  # torchrun's ranks, or a JAX run's hosts
    with collective_errors(cfg.dist_timeout_s):
        out = Path(cfg.output_dir)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output_dir={out} is a file, not a folder")
        lock = FolderLock(out).acquire() if is_main() else None
        try:
            run = start_run(cfg, resume, started, engine)
            job = make_job(cfg, run)
            if run.finished is not None and (int(run.state["step"]) >= job.total_steps
                                             or stopped_early(run.finished, run.state, job.patience)):
                print(finished_message(out, int(run.state["step"]), run.finished), file=sys.stderr, flush=True)
                return run.finished  # nothing rewritten
            return TrainingLoop(job, cfg, run, engine, trackers).train()
        finally:
            if lock is not None:
                lock.release()


def start_run(cfg: RunSettings, resume: str | None, started: float | None = None,
              engine: type[Engine] | None = None) -> Run:
    """Resolve the checkpoint to resume and its settings (resume.py); claim the run folder; seed every
    RNG; start the device (the engine's, printed once resolved). Settings that may not change on
    resume stop the run. started: the time the run's clock counts from (default: now)."""
    engine = engine or TorchEngine
    started = now() if started is None else started
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir={out} is a file, not a folder")
    resumed = resume_point(cfg, resume, out) if resume else None
    budget = cfg.time_budget_s
    if resumed is not None:
        check_changes(resumed.checkpoint, resumed.state, cfg, is_main())
        if budget is not None:  # the budget left when the checkpoint was written
            budget = max(0.0, budget - float(resumed.state.get("budget_used_s", 0.0)))
    claim_run_folder(out, resumed is not None, cfg)
    if resumed is not None and is_main():
        rewind(out, resumed)
    seed_everything(cfg.seed)  # before CUDA starts: its seed is queued, not waited for
    choose_precision = engine.start_device(cfg)
    if resumed is None:
        return Run(out, choose_precision, None, None, started, budget)
    return Run(out, choose_precision, resumed.checkpoint, resumed.state, started, budget, resumed.finished)


@dataclass
class Window:
    """The steps since the last train record: how many, the units they counted, their seconds."""

    steps: int = 0
    units: int = 0
    seconds: float = 0.0


@dataclass
class Decision:
    """What the end of a step asks for, alike on every rank."""

    ending: bool  # the run's last step: its steps are done, or its time budget is spent
    out_of_time: bool  # ... the time budget is spent
    stop: bool  # a stop signal reached some rank: save, then exit
    evaluate: bool  # an evaluation is due (the last one comes after the loop)
    save: bool  # a checkpoint: every save_every steps or save_minutes, on a stop, at the end
    early_stop: bool = False  # this step's evaluation spent the patience: the run ends here

    def stopping_early(self, end_checkpoint: bool) -> Decision:
        """This decision once its evaluation spent the early-stopping patience: the run's last step
        (its checkpoint as the end's, where end_checkpoint asks for one)."""
        return Decision(True, self.out_of_time, self.stop, self.evaluate, self.save or end_checkpoint, True)


class TrainingLoop:
    """One run of a job: the engine over its model, the schedule, the clock, best/ and the records.
    `train` reads top to bottom; each step of it is a method below."""

    def __init__(self, job: Job, cfg: RunSettings, run: Run, engine: type[Engine],
                 trackers: list[Any] | None = None) -> None:
        self.job, self.cfg, self.run, self.out = job, cfg, run, run.out
        self.main = is_main()
        self.engine = job.engine = engine(job, cfg, run)  # the job's ranks, optimizer, precision
        # the lr of every update, on the host: the engine takes it as a number (a time budget moves it with the clock)
        self.schedule = Schedule(cfg.lr, job.total_steps, cfg.warmup_steps, cfg.warmup_fraction, cfg.schedule,
                                 cfg.min_lr_ratio, cfg.time_budget_s)
        self.best = Best(job.metric, job.higher_is_better, patience=job.patience, min_delta=job.min_delta)
        self.clock = BudgetClock(cfg.time_budget_s, run.budget_s, run.started, run.state)
        self.timings = Timings(run.started)
        self.step = 0
        self.records, self.records_lost = 0, False  # train records the run logged (all sessions); some missing
        self.window = Window()
        self.writing_checkpoint: Background | None = None  # the end checkpoint, while the last evaluation runs
        self.writing_model: Background | None = None  # best/ (final/), from a copy while the steps go on
        self.last_save = now()
        self.stopped: str | None = None  # the signal that stopped the run
        self.stop_reason: str | None = None  # why a tracker ended the run after an evaluation (a pruned trial)
        self.trackers = list(trackers or [])
        self.stopped_early = False  # early stopping ended the run (its last evaluation: `last_metrics`)
        self.last_metrics: dict[str, float] | None = None
        self.run_config = config_to_dict(cfg)
        self.logger: ProgressLogger | None = None
        self.plotter: LossPlotter | None = None

    # ---- the run -----------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Train the job to the end of its steps (or time budget, or a stop signal); return the results."""
        job, out = self.job, self.out
        self.resume()
        if self.main:  # the settings' trackers (report_to), each continuing its run when this one resumes
            self.trackers += make_trackers(tracker_names(self.cfg), out, self.run_config, self.cfg.tracking,
                                           resumed=self.run.checkpoint is not None)
        self.logger = ProgressLogger(out, job.total_steps if job.total_steps < UNBOUNDED_STEPS else None, self.step,
                                     enabled=self.main, desc=job.name, trackers=self.trackers)
        self.plotter = LossPlotter() if self.main else None  # imports matplotlib beside the training
        job.log = self.logger.message
        self.engine.status = self.logger.status  # e.g. the JAX engine compiling a new shape
        self.logger.log("start", self.step, resumed_from=str(self.run.checkpoint) if self.run.checkpoint else None,
                        world_size=world_size(), metric=job.metric)
        first_step, agreement, final_metrics, ended = self.step, Agreement(self.step), None, False
        try:
            with StopSignal() as signals, self.engine.running():
                if self.run.state is not None:
                    restore_rng_state(self.run.state)  # last thing before training continues
                while self.step < job.total_steps:
                    step_started = now()
                    lr = self.train_step()
                    self.timings.first_step_started(step_started)
                    logged = self.step % self.cfg.log_every == 0 or self.step == 1 or self.step == job.total_steps
                    if logged:
                        self.log_window(step_started, lr, first_step)
                    else:
                        self.window.seconds += now() - step_started
                        self.logger.update(self.step)
                    self.timings.first_step_ended()
                    self.clock.step_ended(step_started, first=self.step == first_step + 1)
                    decision = self.decide(agreement, signals)
                    if (decision.out_of_time or decision.stop) and not logged:  # the last step gets its record
                        self.log_window(now(), lr, first_step)
                    if decision.evaluate:
                        with self.timings.timing("eval") as span:
                            self.evaluate(final=False)
                        self.clock.evaluation_took(span.seconds)
                        self.stop_reason = self.logger.stop_reason()
                        if self.stop_reason:
                            self.logger.message(f"step {self.step}: {self.stop_reason}; ending the run")
                            break
                        if self.best.patience_spent:  # every rank holds the same metrics: no collective
                            decision = decision.stopping_early(self.cfg.end_checkpoint)
                    if decision.save:
                        # at the end (not stopped: a stop signal's checkpoint is the last thing the run does),
                        # the torch engine's checkpoint is written while the last evaluation runs
                        at_end = decision.ending and not decision.stop
                        self.checkpoint(background=at_end and self.engine.name == "torch")
                    if decision.stop:
                        self.stopped = signal.Signals(signals.signum or signal.SIGTERM).name
                        break
                    if decision.early_stop:
                        self.stopped_early = True
                        best = self.best
                        kept = "none" if best.value is None else f"{best.value:.4f} at step {best.step}"
                        self.logger.message(f"step {self.step}: early stopping: {job.metric} has not improved by more "
                                            f"than {best.min_delta:g} in {best.waited} evaluations (best {kept}, in "
                                            f"{job.model_folder}/)")
                        break
                    if decision.out_of_time:
                        self.logger.message(f"step {self.step}: time budget spent ({self.cfg.time_budget}); "
                                            "ending the run")
                        break
            self.timings.loop_ended()
            if self.stopped is None and self.stop_reason is None:  # after a stop signal the run goes on later
                final_metrics = self.finish()
            ended = True
        except NonFiniteLossError as e:
            last = latest_checkpoint(out / "checkpoints")
            self.logger.log("error", e.step, message=str(e))
            e.args = (f"{e}: stopping without saving this step. Last good checkpoint: {last or 'none'}. "
                      "Try a lower lr, clip_grad > 0, or another precision.",)
            raise
        finally:
            if not ended:  # a failed end still leaves checkpoint and best/ whole, before the folder's lock goes
                for thread in (self.writing_checkpoint, self.writing_model):
                    if thread is not None:
                        thread.join()
                if self.plotter is not None:
                    self.plotter.close()  # a failed run draws no curve
            self.logger.close()
            job.engine = None  # the job and its engine refer to each other: freed now, loader workers and all
        return self.results(final_metrics)

    def resume(self) -> None:
        """Continue from the checkpoint the run resumes, if any: weights, optimizer, step, best/,
        schedule, clock, data position; drop the records of the steps after it."""
        state, job = self.run.state, self.job
        if state is not None:
            self.engine.load_checkpoint(self.run.checkpoint, state)  # weights, optimizer state, step count
            self.step = int(state["step"])
            self.best.load_state_dict(state.get("best"))
            self.schedule.load_state_dict(state.get("schedule") or {})
            job.load_data_state(state.get("data") or {})
        if self.main:
            save_config(self.cfg, self.out / "run_config.yaml", note=job.fast_path)
            if state is not None:
                truncate_metrics(self.out, self.step)  # records after the checkpoint belong to the lost steps
                self.records, self.records_lost = check_records(self.out, self.step, state.get("train_records"))
        if self.step >= job.total_steps:  # resumed at (or past) its end, unfinished: evaluate, write the model
            job.total_steps = self.step
            if self.main:
                print(f"step {self.step} is the end of the run: evaluating and writing {job.model_folder}/",
                      file=sys.stderr, flush=True)

    # ---- a step ------------------------------------------------------------------------------

    def train_step(self) -> float:
        """One optimizer update over the job's micro-batches of this step, queued on the device;
        returns its lr."""
        lr = self.schedule.apply(self.step, self.clock.lr_clock_s, self.clock.train_span_s)
        micro = self.job.step_batches(self.step)
        self.window.units += sum(self.job.count(batch) for batch in micro)
        self.engine.step(micro, lr)
        self.step += 1
        self.window.steps += 1
        return lr

    def log_window(self, since: float, lr: float, first_step: int) -> None:
        """A train record of the steps since the last one: the one host-device sync of a window.
        since: the time from which the window's seconds are not counted yet (this step's start)."""
        job, window = self.job, self.window
        losses, grad_norm, skipped = self.engine.read_window()  # waits for the window's steps
        window.seconds += now() - since  # the queued steps of the window are done
        losses = {k: all_reduce_mean(v) for k, v in losses.items()}
        if self.step != first_step + 1:  # the window's steps are done (synced): their true time
            self.clock.window_timed(window.seconds, window.steps)
        units, seconds = window.units * world_size(), window.seconds
        if skipped:  # one bad batch is survived; many in a row stop the run (the engine)
            self.logger.message(f"step {self.step}: {skipped} step(s) since the last record skipped: "
                                "non-finite gradient with a finite loss")
        self.logger.log("train", self.step, **losses, lr=lr, grad_norm=grad_norm,
                        **{job.unit: units, "seconds": round(seconds, 4), f"{job.unit}_per_s": units / seconds},
                        **({"skipped_steps": skipped} if skipped else {}), **job.log_fields())
        self.records += 1
        self.logger.update(self.step, loss=losses.get("loss"), lr=lr, **{f"{job.unit}/s": f"{units / seconds:,.0f}"})
        self.window = Window()

    def decide(self, agreement: Agreement, signals: StopSignal) -> Decision:
        """What this step's end asks for. At agreed steps the ranks share, in one collective, whether
        the budget is spent, a checkpoint is due by the clock or a signal came, and the lr's clock."""
        cfg, job, step = self.cfg, self.job, self.step
        out_of_time = save_late = stop = False
        if agreement.due(step, job.total_steps):
            left = self.clock.left_after_end(job.final_eval_steps(), agreement.between_s())
            late = bool(cfg.save_minutes) and now() - self.last_save >= 60 * cfg.save_minutes
            agreed = agreement.agree(step, out_of_time=left < 0, save_late=late, stop=signals.signum is not None,
                                     trained_s=self.clock.trained_s, left_s=left, step_s=self.clock.step_s)
            self.clock.agreed(agreed.trained_s, agreed.left_s)
            out_of_time, save_late, stop = agreed.out_of_time, agreed.save_late, agreed.stop
        ending = step == job.total_steps or out_of_time
        evaluate = bool(job.eval_every) and step % job.eval_every == 0 and not (ending or stop)
        due = save_late or bool(job.save_every and step % job.save_every == 0)
        return Decision(ending, out_of_time, stop, evaluate, stop or due or (ending and cfg.end_checkpoint))

    # ---- evaluation, checkpoints, model folders ------------------------------------------------

    def evaluate(self, final: bool) -> dict[str, float] | None:
        """Validation metrics of the current weights (logged); best/ follows the job's metric."""
        metrics = self.job.evaluate(final)
        if metrics is None:
            return None
        self.last_metrics = metrics
        self.logger.log("eval", self.step, **metrics, **({"final": True} if final else {}))
        if final and self.plotter is not None:
            self.plotter.start(self.out, metric=self.job.metric)  # the last record: drawn while the model is written
        improved = self.best.update(self.step, metrics)
        if improved:
            self.write_model()
        shown = self.job.metric or next(iter(metrics))
        self.logger.message(f"step {self.step}: {shown} {metrics[shown]:.4f}"
                            f"{f' (best, saved {self.job.model_folder}/)' if improved else ''}")
        return metrics

    def checkpoint(self, background: bool) -> None:
        """A checkpoint of this step (every rank calls it: FSDP2 gathers shards, streams gather
        positions). background: rank 0 writes it in a thread (`checkpoint_written` waits for it): the
        weights change no more."""
        with self.timings.timing("save") as span:
            self.engine.check_finite()  # never save weights after a skipped (non-finite) step
            saved, data = self.engine.checkpoint_state(), self.job.data_state()
            if self.main:
                self.model_written()  # the best/ that the checkpoint's "best" describes is whole first
                extra = {"best": self.best.state_dict(), "schedule": self.schedule.state_dict(),
                         **self.clock.state_dict(), "train_records": self.records}
                args = (self.out / "checkpoints", self.step, self.job.model)
                kwargs = dict(tokenizer=self.job.tokenizer, run_config=self.run_config, data_state=data,
                              keep_last=self.cfg.keep_last, **saved, extra=extra)
                if background:
                    self.writing_checkpoint = checkpoint_writer(*args, **kwargs)
                else:
                    self.logger.message(f"step {self.step}: saved {save_checkpoint(*args, **kwargs)}")
            barrier()
        self.last_save = span.start
        self.clock.save_took(span.seconds)

    def write_model(self) -> None:
        """The job's model folder, written by a thread from a CPU copy of the weights (the copy's
        wait is evaluation time; the write overlaps the next steps)."""
        state = self.engine.model_state()  # every rank: gathers FSDP2 shards
        if self.main:
            self.model_written()  # one at a time
            state = snapshot(self.job.model) if state is None else state
            write = self.job.model_writer(state)  # what the folder holds is fixed now, as the weights are
            self.writing_model = Background(write_folder_atomically, self.out / self.job.model_folder, write)

    def model_written(self) -> None:
        """Wait for the model folder being written; its error is the run's."""
        writing, self.writing_model = self.writing_model, None
        if writing is not None:
            writing.result()

    def checkpoint_written(self) -> None:
        """Wait for the end checkpoint (the wait is checkpoint time); its error is the run's."""
        writing, self.writing_checkpoint = self.writing_checkpoint, None
        if writing is not None:
            with self.timings.timing("save"):
                path = writing.result()
            print(f"step {self.step}: saved {path}", file=sys.stderr, flush=True)

    # ---- the end ---------------------------------------------------------------------------------

    def finish(self) -> dict[str, float] | None:
        """The last evaluation (early stopping's was the step's own: not run again), and the model
        folder when no evaluation chose it."""
        if self.stopped_early:
            final_metrics = self.last_metrics
        else:
            with self.timings.timing("eval"):
                final_metrics = self.evaluate(final=True)
        if self.job.metric is None or self.best.step is None:
            self.write_model()
        return final_metrics

    def results(self, final_metrics: dict[str, float] | None) -> dict[str, Any]:
        """results.json, from the run's own records (all sessions of a resumed run), written by rank 0
        once the loss curve is drawn and every background write has ended."""
        job, out = self.job, self.out
        if self.main:
            try:
                self.plotter.draw(out, metric=job.metric)
            except ValueError:
                pass  # nothing logged yet (stopped before the first step)
            except ImportError as e:  # the run is saved; only the picture is missing
                print(f"no loss plot ({e}); `bert-kit plot {out}` draws it later", file=sys.stderr)
            self.checkpoint_written()
            self.model_written()
        stopped = EARLY_STOPPING if self.stopped_early else self.stopped
        results = {"steps": self.step, "stopped": stopped,
                   **({"stop_reason": self.stop_reason} if self.stop_reason else {}),
                   "output_dir": str(out), "world_size": world_size(), "parallel": self.engine.parallel,
                   "precision": str(self.engine.precision), **(summarize(out, job.unit) if self.main else {}),
                   "best_value": self.best.value, "best_step": self.best.step, "best_metrics": self.best.metrics,
                   "final_metrics": final_metrics, "wall_time_s": None,
                   **({"metrics_complete": not self.records_lost} if self.main else {})}
        if self.stopped_early:
            results["early_stopping"] = {"step": self.step, "patience": self.best.patience,
                                         "min_delta": self.best.min_delta, "evaluations_without_improvement":
                                         self.best.waited}
        results.update(job.results(final_metrics, results))
        if self.main:
            results.update(model_entries(out, job.model_folder))
            results["wall_time_s"] = now() - self.run.started
            results["timings"] = self.timings.summary(results["wall_time_s"])
            write_results(out, results)
        barrier()
        return results
