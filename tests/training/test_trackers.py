"""report_to: TensorBoard, MLflow and W&B get every record of a run, offline, with the real
libraries (each test skips without its package); a resumed run continues the same tracked run.

Run: .venv/bin/python -m pytest tests/training/test_trackers.py -q -n 0
"""

import json

import pytest

from bert_kit.checks import ConfigError
from tests.tiny_runs import tiny_settings, tiny_setup


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_setup(tmp_path_factory.mktemp("tiny"))


def test_report_to_names_trackers_and_tensorboard_true_is_one_of_them():
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.settings import tracker_names

    assert tracker_names(FinetuneConfig(tensorboard=True)) == ["tensorboard"]
    assert tracker_names(FinetuneConfig(report_to=["mlflow"], tensorboard=True)) == ["mlflow", "tensorboard"]
    assert FinetuneConfig(report_to="wandb").report_to == ["wandb"]
    with pytest.raises(ConfigError, match=r"report_to='mlfow' is not a valid choice.*did you mean 'mlflow'"):
        FinetuneConfig(report_to=["mlfow"])
    with pytest.raises(ConfigError, match="tracking.wandb_mode"):
        FinetuneConfig(tracking={"wandb_mode": "cloud"})


def test_a_missing_tracker_library_names_the_extra(tmp_path, monkeypatch):
    import builtins

    from bert_kit.training.settings import TrackingSettings
    from bert_kit.training.trackers import make_trackers

    real = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ModuleNotFoundError("No module named 'wandb'", name="wandb")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match=r'report_to: wandb needs the wandb package.*bert-kit\[tracking\]'):
        make_trackers(["wandb"], tmp_path, {}, TrackingSettings(), resumed=False)


def eval_records(run):
    from bert_kit.training.progress import read_metrics

    return [r for r in read_metrics(run) if r["type"] == "eval"]


@pytest.mark.slow
def test_mlflow_gets_the_settings_and_every_record_and_a_resume_continues_its_run(tiny, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    run = tmp_path / "run"
    settings = tiny_settings(tiny, run, report_to=["mlflow"], tracking={"project": "tiny"}, save_every=6)
    first = finetune(FinetuneConfig(**{**settings, "max_steps": 6}))
    assert first["steps"] == 6 and (run / "mlflow.db").is_file() and not (tmp_path / "mlruns").exists()
    run_id = json.loads((run / "tracking.json").read_text())["mlflow"]
    finetune(FinetuneConfig(**settings), resume="latest")  # 6 more steps, the same MLflow run

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    assert client.get_experiment(tracked.info.experiment_id).name == "tiny"
    assert tracked.data.params["lr"] == "0.001" and tracked.data.params["similarity.mode"] == "cross-encoder"
    accuracy = client.get_metric_history(run_id, "eval/accuracy")
    assert [(m.step, m.value) for m in sorted(accuracy, key=lambda m: m.step)] == [
        (r["step"], r["accuracy"]) for r in eval_records(run)]
    assert [r["step"] for r in eval_records(run)] == [6, 12]
    losses = {m.step for m in client.get_metric_history(run_id, "train/loss")}
    assert {1, 2, 4, 6, 8, 10, 12} <= losses
    assert len(client.search_runs([tracked.info.experiment_id])) == 1


def wandb_history(path):
    """The history rows of a .wandb file: its records are protobufs in LevelDB's log format (32 KiB
    blocks; a record, or each piece of one, behind a 7-byte header: crc, length, type)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, pieces, records = path.read_bytes(), 7, b"", []  # after the file's header, ":W&B" ...
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pieces, pos = pieces + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(pieces)
            pieces = b""
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.mark.slow
def test_wandb_offline_writes_its_run_in_the_run_folder(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    run = tmp_path / "run"
    finetune(FinetuneConfig(**tiny_settings(tiny, run, report_to=["wandb"])))
    run_id = json.loads((run / "tracking.json").read_text())["wandb"]
    files = list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1
    history = wandb_history(files[0])
    assert [(h["_step"], h["eval/accuracy"]) for h in history if "eval/accuracy" in h] == [
        (r["step"], r["accuracy"]) for r in eval_records(run)]
    assert [h["_step"] for h in history if "train/loss" in h] == [1, 2, 4, 6, 8, 10, 12]


def test_tensorboard_true_still_writes_its_scalars(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    run = tmp_path / "run"
    finetune(FinetuneConfig(**tiny_settings(tiny, run, tensorboard=True, max_steps=6)))
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("eval/accuracy")] == [
        (r["step"], r["accuracy"]) for r in eval_records(run)]


def test_a_failing_tracker_is_dropped_and_the_run_goes_on(tmp_path, capsys):
    from bert_kit.training.progress import ProgressLogger, read_metrics

    class Broken:
        closed = False

        def log(self, kind, step, values):
            raise ConnectionError("tracking server unreachable")

        def close(self):
            Broken.closed = True

    logger = ProgressLogger(tmp_path, 10, trackers=[Broken()])
    logger.log("train", 1, loss=2.5)
    logger.log("train", 2, loss=2.0)
    logger.close()
    assert "warning: Broken failed (ConnectionError: tracking server unreachable)" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2] and Broken.closed
