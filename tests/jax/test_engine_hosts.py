"""`bert-kit finetune ... engine=jax` over two processes (two hosts, each with one CPU device, joined
by `jax.distributed` over Gloo): each step's loss equals one process's on the same global batch,
for the tasks whose examples hold several rows (a bi-encoder's two sentences, an embedding pair's
two texts, a reranker's candidates), which each host lays out side after side; with parallel=fsdp
too (the weights and optimizer state split over the hosts' devices, gathered to save the folders).

Run: .venv/bin/python -m pytest tests/jax/test_engine_hosts.py -q -n 0
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")

from tests.jax.test_engine_tasks import encoder  # noqa: E402,F401  (a fixture: a tiny encoder, dropout off)
from tests.tasks.test_reranker import write_groups  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def train_losses(out: Path, settings: list[str], batch_size: int, processes: int) -> list[float]:
    """The first two steps' losses of a run over `processes` processes, `batch_size` examples each."""
    cmd = [sys.executable, "-m", "bert_kit", "finetune", *settings, "engine=jax", "device=cpu", "precision=fp32",
           "lr=1e-3", "log_every=1", "max_steps=2", "eval_every=0", "max_length=32", "seed=3",
           f"batch_size={batch_size}", f"output_dir={out}"]
    env = {**os.environ, "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    env.pop("XLA_FLAGS", None)  # one device a process
    if processes == 1:
        done = [subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)]
    else:
        hosts = {**env, "JAX_COORDINATOR_ADDRESS": f"localhost:{free_port()}", "JAX_NUM_PROCESSES": str(processes)}
        runs = [subprocess.Popen(cmd, cwd=REPO, env={**hosts, "JAX_PROCESS_ID": str(i)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(processes)]
        done = []
        for run in runs:
            stdout, stderr = run.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr))
    for d in done:
        assert d.returncode == 0, d.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r["type"] == "train"]
    assert [r["examples"] for r in train] == [batch_size * processes] * 2
    if processes > 1:  # the start line names the JAX engine's layout, not torch's wrappers
        parallel = next((s.split("=", 1)[1] for s in settings if s.startswith("parallel=")), "ddp")
        assert f"{processes} ranks (JAX engine, parallel={parallel})" in done[0].stdout, done[0].stdout[-2000:]
        assert "FSDP2" not in done[0].stdout and "(DDP)" not in done[0].stdout
    return [r["loss"] for r in train]


@pytest.mark.parametrize("task, parallel", [("bi-encoder", "ddp"), ("embedding", "ddp"), ("reranker", "ddp"),
                                            ("bi-encoder", "fsdp")])
def test_two_hosts_take_one_hosts_steps(encoder, data_dir, tmp_path, task, parallel):
    rows = [line.split("\t") for line in (data_dir / "stsb" / "sts-train.csv").read_text().splitlines()[:48]]
    if task == "bi-encoder":
        train = tmp_path / "sts.csv"
        train.write_text("\n".join("\t".join(r) for r in rows) + "\n")
        settings = ["--task", "similarity", "similarity.mode=bi-encoder"]
    elif task == "embedding":
        train = tmp_path / "pairs.jsonl"
        train.write_text("".join(json.dumps({"anchor": r[5], "positive": r[6]}) + "\n" for r in rows))
        settings = ["--task", "embedding", "embedding.no_duplicates=false"]
    else:
        train = write_groups(tmp_path / "groups.jsonl", 16)
        settings = ["--task", "reranker", "reranker.loss=listnet"]
    settings = [*settings, f"model={encoder}", f"train_file={train}"]
    one = train_losses(tmp_path / "one", settings, 8, 1)
    two = train_losses(tmp_path / "two", [*settings, f"parallel={parallel}"], 4, 2)
    assert max(abs(a - b) for a, b in zip(one, two)) <= 1e-5, (one, two)
    if parallel == "fsdp":  # the saved model, gathered from both hosts' shards, is the one host's
        from safetensors.numpy import load_file

        expected, got = load_file(tmp_path / "one" / "best" / "model.safetensors"), \
            load_file(tmp_path / "two" / "best" / "model.safetensors")
        assert got.keys() == expected.keys()
        assert max(float(abs(got[k] - expected[k]).max()) for k in expected) <= 1e-5
