"""Seeing a run: progress bar, metrics JSONL, loss-curve PNG, optional TensorBoard.

* `ProgressLogger` shows a tqdm bar (step, loss, lr, tokens/s, ETA) and appends one JSON
  object per line to `RUN_DIR/metrics.jsonl`, flushed at once so a crash loses nothing:
      {"type": "train", "step": 100, "loss": 3.2, "mlm_loss": 2.9, "lr": 1e-4, ...}
      {"type": "eval", "step": 100, "mlm_loss": 3.1, "perplexity": 22.2, ...}
  and hands every record to its trackers (training/trackers.py: `report_to`): `TensorBoard`
  writes the same scalars to `RUN_DIR/tensorboard/`; MLflow, W&B and a hyperparameter search's
  trial are objects with the same two methods, `log(kind, step, values)` and `close()`. A
  tracker that wants the run to end (a pruned trial) says why in `stop_reason`.
* `plot_losses(run_dir)` draws train loss, eval loss and the learning rate (twin axis) into
  `RUN_DIR/loss_curve.png`; `bert-kit plot RUN_DIR` does the same from the command line.
* `LossPlotter` draws it at the end of a run in a child process started with the run, which has
  imported matplotlib (1-2 s) by then, while the run writes its model folder.
* `LongRunNotice` says once, after a run's first half minute, when it will take long (a fine-tune
  on a CPU: SST-2's 6,315 steps are about 1.5 hours): how long, at what rate, and how to check a
  setup in minutes instead. The bar shows the time left too; the line says what to do about it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bert_kit.outputs import write_file, write_text

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"


class TensorBoard:
    """A tracker: the numbers of every record as TensorBoard scalars (`train/loss`, `eval/accuracy`)
    in RUN_DIR/tensorboard."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        for k, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        self.writer.close()


class ProgressLogger:
    """Progress bar plus metrics file for one run, and its trackers; a silent no-op when `enabled`
    is False (every rank but 0)."""

    def __init__(self, run_dir: str | Path, total_steps: int, start_step: int = 0, enabled: bool = True,
                 tensorboard: bool = False, desc: str = "train", trackers: list[Any] | None = None) -> None:
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.start_time = time.time()
        self._file = None
        self._bar = None
        self.trackers: list[Any] = []
        if not enabled:
            return
        from tqdm.auto import tqdm

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
        self._bar = tqdm(total=total_steps, initial=start_step, desc=desc, unit="step", dynamic_ncols=True,
                         file=sys.stderr, mininterval=0.5)
        self.trackers = list(trackers or [])
        if tensorboard:
            try:
                self.trackers.append(TensorBoard(self.run_dir))
            except ImportError:
                self.message("tensorboard: true, but the tensorboard package is not installed "
                             "(pip install tensorboard); logging to metrics.jsonl only")

    def update(self, step: int, **postfix: Any) -> None:
        """Move the bar to `step` and show `postfix` values (floats are shortened)."""
        if self._bar is None:
            return
        self._bar.update(step - self._bar.n)
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items() if v is not None}
        self._bar.set_postfix(shown, refresh=False)

    def status(self, text: str) -> None:
        """Show `text` after the bar at once (what the run waits for); "" clears it."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def log(self, kind: str, step: int, **values: Any) -> None:
        """Append one record {"type": kind, "step": step, **values} and flush it."""
        if self._file is None:
            return
        record = {"type": kind, "step": step, **values, "wall_time": round(time.time() - self.start_time, 3)}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for tracker in list(self.trackers):
            try:
                tracker.log(kind, step, values)
            except Exception as e:  # noqa: BLE001 (a tracker's failure, a server gone, never ends the run)
                self.trackers.remove(tracker)
                try:
                    tracker.close()
                except Exception:  # noqa: BLE001
                    pass
                self.message(f"warning: {type(tracker).__name__} failed ({type(e).__name__}: {e}); the run goes on "
                             f"without it (metrics.jsonl has every record)")

    def stop_reason(self) -> str | None:
        """Why a tracker wants the run to end now (a search trial that was pruned), or None."""
        return next((reason for t in self.trackers if (reason := getattr(t, "stop_reason", None))), None)

    def message(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


class LongRunNotice:
    """`notice(step)` at each step: once, when the steps since the second one have taken
    `after_s` seconds, a line (else None) if the rest of the run will take more than
    `threshold_s` at their rate: "about 1 h 30 min to go at 1.2 steps/s on this CPU (6,255
    steps); {hint}". The first step is left out of the rate (it warms up)."""

    def __init__(self, total_steps: int, where: str, hint: str, after_s: float = 30.0,
                 threshold_s: float = 1800.0) -> None:
        self.total, self.where, self.hint = total_steps, where, hint
        self.after_s, self.threshold_s = after_s, threshold_s
        self.first: int | None = None  # the step of the first call
        self.start: tuple[float, int] | None = None  # (time, step) after the first step
        self.done = False

    def __call__(self, step: int) -> str | None:
        if self.done:
            return None
        now = time.monotonic()
        if self.first is None:
            self.first = step
        elif self.start is None:
            self.start = (now, step)
        elif now - self.start[0] >= self.after_s and step > self.start[1]:
            self.done = True
            rate = (step - self.start[1]) / (now - self.start[0])
            left = (self.total - step) / rate
            if left > self.threshold_s:
                return (f"about {duration(left)} to go at {rate:.2g} steps/s on {self.where} "
                        f"({self.total - step:,} steps); {self.hint}")
        return None


def duration(seconds: float) -> str:
    """"1 h 30 min", "45 min", "2 d 3 h": a time to go, to the minute."""
    minutes = max(1, round(seconds / 60))
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def read_metrics(run_dir: str | Path, strict: bool = False) -> list[dict[str, Any]]:
    """Records of `RUN_DIR/metrics.jsonl`; a later record of the same (type, step) replaces an
    earlier one (a resumed run repeats the steps after its checkpoint). A line that is not a JSON
    object with an integer "step" (and a text "type") is skipped with a warning naming the file
    and line, or with `strict` (`bert-kit plot`) is an error naming them."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in run folder {run_dir}")
    latest: dict[tuple[str, int], dict] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # only a crash mid-write can leave a bad line, and only as the last one
                print(f"{path}:{lineno}: skipping unreadable line", file=sys.stderr)
                continue
            problem = record_problem(record)
            if problem and strict:
                raise ValueError(f"{path}:{lineno}: {problem}: each line of a {METRICS_FILE} is a record such as "
                                 '{"type": "train", "step": 10, "loss": 2.5}')
            if problem:
                print(f"{path}:{lineno}: skipping a line that is no record ({problem})", file=sys.stderr)
                continue
            latest[(record.get("type", "train"), record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r["step"], r.get("type", "")))


def record_problem(record: Any) -> str | None:
    """What keeps a parsed line of metrics.jsonl from being a record, or None."""
    if not isinstance(record, dict):
        return f"a JSON {'array' if isinstance(record, list) else type(record).__name__}, not an object"
    step, kind = record.get("step"), record.get("type", "train")
    if "step" not in record:
        return 'no "step"'
    if isinstance(step, bool) or not isinstance(step, int):
        return f'"step": {json.dumps(step)} is not an integer'
    if not isinstance(kind, str):
        return f'"type": {json.dumps(kind)} is not a text'
    return None


def truncate_metrics(run_dir: str | Path, step: int) -> None:
    """Drop records after `step` (called when resuming from the checkpoint of that step)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (json.JSONDecodeError, ValueError, AttributeError):
            continue
    write_text(path, "".join(line + "\n" for line in kept))


# validation metrics a fine-tuning curve shows, in order of preference (higher is better)
METRICS_SHOWN = ("accuracy", "f1", "spearman", "pearson", "exact_match", "mcc")


def plot_losses(run_dir: str | Path, output: str | Path | None = None, metric: str | None = None) -> Path:
    """Draw the run's curves into one PNG; return its path.

    Top: train loss, eval MLM loss (pretraining) and the lr (right axis) against step. Below, for
    a fine-tuning run, its validation `metric` (default: the first of `METRICS_SHOWN` it logged).
    The last evaluation of a pretraining run reads all held-out data, the periodic ones a sample:
    it is drawn as its own marker, not as the next point of the line.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir, strict=True)

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    train = [r for r in records if r.get("type") == "train" and number(r.get("loss"))]
    evals = [r for r in records if r.get("type") == "eval"]
    mlm = [r for r in evals if number(r.get("mlm_loss"))]
    if metric is None:
        metric = next((m for m in METRICS_SHOWN if any(m in r for r in evals)), None)
    scored = [r for r in evals if metric is not None and isinstance(r.get(metric), (int, float))]
    if not train and not mlm and not scored:
        raise ValueError(f"{Path(run_dir) / METRICS_FILE} has no train or eval records to plot")
    rows = 2 if scored else 1
    fig, axes = plt.subplots(rows, 1, figsize=(8, 4.5 if rows == 1 else 6.5), dpi=110, sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2][:rows]})
    ax = axes[0][0]
    if train:
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1.2, color="tab:blue", label="train loss")
        if any("mlm_loss" in r for r in train) and any("nsp_loss" in r for r in train):
            ax.plot([r["step"] for r in train], [r.get("mlm_loss") for r in train], lw=1.0, color="tab:cyan",
                    label="train MLM loss")
    periodic = [r for r in mlm if not r.get("final")]
    if periodic:
        ax.plot([r["step"] for r in periodic], [r["mlm_loss"] for r in periodic], "o-", ms=3.5, color="tab:orange",
                label="eval MLM loss (sample)")
    validation = [r for r in evals if isinstance(r.get("loss"), (int, float))]  # fine-tuning's eval loss
    if validation:
        ax.plot([r["step"] for r in validation], [r["loss"] for r in validation], "o-", ms=3.5, color="tab:orange",
                label="validation loss")
    for r in (r for r in mlm if r.get("final")):
        ax.plot([r["step"]], [r["mlm_loss"]], "*", ms=10, color="tab:red", label="final eval MLM loss (all)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    lr = [r for r in train if number(r.get("lr"))]
    if lr:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in lr], [r["lr"] for r in lr], lw=0.8, ls="--", color="tab:gray", label="lr")
        ax2.set_ylabel("learning rate")
        ax2.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, loc="upper right", fontsize=8)
    ax.set_title(Path(run_dir).resolve().name)
    if scored:
        low = axes[1][0]
        steps, values = [r["step"] for r in scored], [r[metric] for r in scored]
        low.plot(steps, values, "o-", ms=4, color="tab:green", label=f"validation {metric}")
        best = max(range(len(values)), key=values.__getitem__)
        low.annotate(f"best {values[best]:.4f}", (steps[best], values[best]), textcoords="offset points",
                     xytext=(0, 6), ha="center", fontsize=8)
        low.set_ylabel(metric)
        low.grid(alpha=0.3)
        low.legend(loc="lower right", fontsize=8)
    axes[-1][0].set_xlabel("step")
    # fixed margins, room for 7-character tick labels on either side: a run waits for this picture
    # at its end, and a fitted layout (tight_layout) would measure every text first (a third of the time)
    fig.subplots_adjust(left=0.095, right=0.9, top=0.93 if rows == 2 else 0.915, bottom=0.085 if rows == 2 else 0.11,
                        hspace=0.08)
    out = Path(output) if output is not None else Path(run_dir) / PLOT_FILE
    try:  # the format from the name, as savefig(path) picks it; written whole, through a link
        write_file(out, lambda f: fig.savefig(f, format=out.suffix[1:].lower() or None), binary=True)
    finally:
        plt.close(fig)
    return out


class LossPlotter:
    """`plot_losses` in a child process, started early (`python -m bert_kit.training.progress`):
    it imports matplotlib while the run trains, draws when `start` asks (once the run has logged its
    last record) and exits; `draw` waits for the picture. The child has its own session, so a Ctrl-C
    or SIGTERM to the run's process group leaves it drawing the curve of the stopped run; it exits
    when this process closes its stdin, or dies. Whatever goes wrong with the child, `draw` plots
    in this process instead: the PNG is never lost to it."""

    TIMEOUT_S = 120.0  # the child's imports and drawing; past this, the curve is drawn here

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the folder holding bert_kit, for the child
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.asked = False
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "bert_kit.training.progress"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env=env, text=True, start_new_session=True)
        except OSError:
            self.process = None

    def start(self, run_dir: str | Path, metric: str | None = None) -> None:
        """Have the child draw the run's records as they are now (the run logs no more); once."""
        process = self.process
        if process is None or self.asked:
            return
        self.asked = True
        try:
            process.stdin.write(json.dumps({"run_dir": str(run_dir), "metric": metric}) + "\n")
            process.stdin.close()  # sends it
        except OSError:
            pass  # the child is gone: `draw` draws here
        process.stdin = None  # closed: communicate() leaves it alone

    def draw(self, run_dir: str | Path, metric: str | None = None) -> None:
        """`plot_losses(run_dir, metric=metric)`, with its exceptions (ValueError: nothing to plot;
        ImportError: no matplotlib)."""
        self.start(run_dir, metric)
        reply, process, self.process = None, self.process, None
        if process is not None:
            try:
                reply = json.loads(process.communicate(timeout=self.TIMEOUT_S)[0].strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
                process.kill()
                process.wait()
        error = (reply or {}).get("error")
        if reply is None or error not in (None, "ValueError", "ImportError"):
            plot_losses(run_dir, metric=metric)  # the child failed: here, with this process's own errors
        elif error is not None:
            raise (ValueError if error == "ValueError" else ImportError)(reply["message"])

    def close(self) -> None:
        """End the child without a picture (the run failed)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.communicate()  # reaps it, closes the pipes


def _plot_on_request() -> None:
    """The child of `LossPlotter`: matplotlib first, then one request on stdin, one reply on stdout."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401 (what plot_losses would wait for)
    except ImportError:
        pass  # plot_losses raises it again, for the reply
    line = sys.stdin.readline()
    if not line:
        return  # the run ended without asking
    request = json.loads(line)
    try:
        reply = {"path": str(plot_losses(request["run_dir"], metric=request["metric"]))}
    except Exception as e:  # noqa: BLE001 (the parent re-raises or redraws)
        kind = next((k.__name__ for k in (ValueError, ImportError) if isinstance(e, k)), "other")
        reply = {"error": kind, "message": str(e)}
    print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    _plot_on_request()
