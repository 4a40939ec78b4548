"""The run's picture: loss curves, the lr, and for fine-tuning the validation metric.

Run: .venv/bin/python -m pytest tests/training/test_progress.py -q
"""

from pathlib import Path

import pytest


def test_loss_curve_shows_the_validation_metric_and_marks_the_final_evaluation(tmp_path):
    """A fine-tuning run's picture gets a second panel with its validation metric; a pretraining
    run's last (whole held-out set) evaluation is a marker of its own, not the line's next point."""
    import json

    from PIL import Image

    from bert_kit.training.progress import plot_losses

    def write(run: Path, records: list[dict]) -> Path:
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return plot_losses(run)

    train = [{"type": "train", "step": s, "loss": 1 / s, "lr": 1e-4} for s in range(1, 11)]
    finetune = write(tmp_path / "ft", train + [{"type": "eval", "step": s, "accuracy": 0.5 + s / 40, "loss": 1 / s}
                                               for s in (5, 10)])
    pretrain = write(tmp_path / "pre", train + [{"type": "eval", "step": 5, "mlm_loss": 2.0},
                                                {"type": "eval", "step": 10, "mlm_loss": 1.5, "final": True}])
    assert Image.open(finetune).size[1] > Image.open(pretrain).size[1] * 1.3  # two panels, one above the other
    with pytest.raises(ValueError, match="no train or eval records"):
        write(tmp_path / "empty", [{"type": "start", "step": 0}])


def _run_folder(run: Path, steps: int = 5) -> Path:
    import json

    run.mkdir()
    records = [{"type": "train", "step": s, "loss": 1 / s, "lr": 1e-4} for s in range(1, steps + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_plotter_child_draws_and_says_why_it_cannot(tmp_path):
    from bert_kit.training.progress import PLOT_FILE, LossPlotter

    plotter = LossPlotter()
    assert plotter.process is not None
    plotter.draw(_run_folder(tmp_path / "run"))
    assert (tmp_path / "run" / PLOT_FILE).stat().st_size > 1000
    with pytest.raises(ValueError, match="no train or eval records"):  # nothing to plot: as plot_losses says
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "metrics.jsonl").write_text('{"type": "start", "step": 0}\n')
        LossPlotter().draw(empty)


def test_the_curve_is_drawn_here_when_the_child_is_gone(tmp_path, monkeypatch):
    import sys

    from bert_kit.training.progress import PLOT_FILE, LossPlotter

    plotter = LossPlotter()
    plotter.process.kill()  # died (killed, out of memory) before the run ended
    plotter.draw(_run_folder(tmp_path / "killed"))
    assert (tmp_path / "killed" / PLOT_FILE).is_file()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))  # no child at all
    plotter = LossPlotter()
    assert plotter.process is None
    plotter.draw(_run_folder(tmp_path / "none"))
    assert (tmp_path / "none" / PLOT_FILE).is_file()


def test_a_failed_run_leaves_no_plotter_child(tmp_path):
    from bert_kit.training.progress import LossPlotter

    plotter = LossPlotter()
    child = plotter.process
    plotter.close()
    assert child.poll() is not None and plotter.process is None


def test_without_matplotlib_the_child_says_so(tmp_path, monkeypatch):
    from bert_kit.training.progress import LossPlotter

    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'matplotlib'\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))  # the child's matplotlib is this broken one
    with pytest.raises(ImportError, match="matplotlib"):  # as plot_losses says it: the run prints "no loss plot"
        LossPlotter().draw(_run_folder(tmp_path / "run"))


def test_a_long_run_says_once_how_long_it_will_take_and_how_to_check_sooner(monkeypatch):
    """SST-2 on a CPU runs 1.5 hours; the bar's ETA says so, not what to do about it."""
    from bert_kit.training import progress
    from bert_kit.training.progress import LongRunNotice, duration
    from tests.fake_clock import FakeClock

    clock = FakeClock().install(monkeypatch, progress)
    notice = LongRunNotice(6315, "this CPU", "for a quick check first: max_steps=200")
    said = []
    for step in range(100):
        said.append((step, notice(step)))
        clock.sleep(6.0 if step == 0 else 0.85)  # the first step warms up: left out of the rate
    lines = [(step, line) for step, line in said if line]
    assert lines == [(37, "about 1 h 29 min to go at 1.2 steps/s on this CPU (6,278 steps); for a quick check "
                          "first: max_steps=200")]  # after 30 s of steps, once
    short = LongRunNotice(63, "this CPU", "")
    for step in range(63):
        assert short(step) is None
        clock.sleep(0.85)
    assert [duration(s) for s in (20, 45 * 60, 5400, 2 * 86400 + 3 * 3600)] == ["1 min", "45 min", "1 h 30 min",
                                                                               "2 d 3 h"]


def test_a_fine_tune_on_the_cpu_says_when_it_will_take_long(tmp_path, capsys, monkeypatch):
    import bert_kit.tasks.finetuning as finetuning
    from bert_kit.cli import main
    from bert_kit.training.progress import LongRunNotice
    from tests.bad_inputs.assets import build_assets

    class Eager(LongRunNotice):  # any run is long, at once
        def __init__(self, *args, **kwargs):
            super().__init__(*args, after_s=0.0, threshold_s=0.0)

    monkeypatch.setattr(finetuning, "LongRunNotice", Eager)
    assets = build_assets(tmp_path / "assets")
    capsys.readouterr()
    assert main(["finetune", "--config", str(assets.finetune_yaml), f"output_dir={tmp_path / 'run'}"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "to go at" in line]
    assert len(said) == 1 and said[0].startswith("about ") and said[0].endswith(
        "steps/s on this CPU (2 steps); for a quick check first: max_steps=200, or max_train_examples=2000 epochs=1")


def test_every_record_reaches_the_trackers_and_they_are_closed(tmp_path):
    """A tracker (mlflow, wandb, a search trial) is two methods; the logger hands it what metrics.jsonl gets."""
    from bert_kit.training.progress import ProgressLogger, read_metrics

    class Tracker:
        def __init__(self):
            self.seen, self.closed = [], False

        def log(self, kind, step, values):
            self.seen.append((kind, step, values))

        def close(self):
            self.closed = True

    tracker = Tracker()
    logger = ProgressLogger(tmp_path, 10, trackers=[tracker])
    logger.log("train", 1, loss=2.5, lr=1e-4)
    logger.log("eval", 1, accuracy=0.5)
    logger.close()
    assert tracker.seen == [("train", 1, {"loss": 2.5, "lr": 1e-4}), ("eval", 1, {"accuracy": 0.5})]
    assert tracker.closed and [r["type"] for r in read_metrics(tmp_path)] == ["eval", "train"]
    quiet = Tracker()
    ProgressLogger(tmp_path, 10, enabled=False, trackers=[quiet]).log("train", 2, loss=1.0)  # rank > 0
    assert quiet.seen == []
