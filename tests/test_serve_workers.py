"""`bert-kit serve --workers N`: several processes on one port, stopped together without losing a request.

Real servers of two workers on loopback (tiny classifier, the real MiniLM tokenizer): both worker
processes answer (the kernel spreads connections over their SO_REUSEPORT sockets), and a SIGTERM
to the supervisor while both have requests in flight answers every accepted request of both,
then exits 0. A worker that fails to load fails the command as one process would (same line,
same exit status); a worker killed while serving stops the server (exit status 1); workers whose
supervisor was killed stop by themselves.

Run: .venv/bin/python -m pytest tests/test_serve_workers.py -q
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from bert_kit.heads import BERTForSequenceClassification
from bert_kit.serving.server import ServeConfig
from bert_kit.serving.workers import default_workers
from tests.tasks.test_inference import saved
from tests.test_serve import REPO, TEXTS, TINY, ServerProcess

# one worker starts the module's servers, first (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("serve_workers"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, minilm_path) -> Path:
    from bert_kit.tokenizer import get_tokenizer

    torch.manual_seed(0)
    return saved(tmp_path_factory.mktemp("workers") / "cls", BERTForSequenceClassification(TINY, num_labels=3),
                 get_tokenizer(minilm_path), ["negative", "neutral", "positive"], task="classification",
                 max_length=64)


@pytest.fixture(scope="module")
def servers(folder):
    """Three servers of two workers, started at once; each test ends one of them."""
    for module in ("starlette", "uvicorn", "httpx"):
        pytest.importorskip(module, reason=f"bert-kit serve needs the [serve] extra and the tests httpx ({module})")
    flags = ("--workers", "2", "--device", "cpu", "--max-wait-ms", "300", "--grace-period", "20")
    started = {name: ServerProcess(folder, *flags) for name in ("drain", "killed-worker", "killed-supervisor")}
    try:
        yield {name: s.wait_ready() for name, s in started.items()}
    finally:
        for s in started.values():
            if s.proc.poll() is None:
                s.proc.kill()
        for s in started.values():
            s.proc.wait(30)


def worker_pids(url: str, tries: int = 400) -> set[int]:
    """The pids that answer /info over fresh connections, until two are seen."""
    import httpx

    seen: set[int] = set()
    for _ in range(tries):
        seen.add(httpx.get(f"{url}/info", timeout=30).json()["pid"])
        if len(seen) == 2:
            break
    return seen


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else "X"
    return state not in ("Z", "X")  # a zombie has exited


def test_both_workers_answer_and_sigterm_drains_both(servers):
    httpx = pytest.importorskip("httpx")
    server = servers["drain"]
    assert any(re.search(r"loaded .*2 workers\)", line) for line in server.lines)
    pids = worker_pids(server.url)
    assert len(pids) == 2 and server.proc.pid not in pids
    info = httpx.get(f"{server.url}/info", timeout=30).json()
    assert info["workers"] == 2 and info["worker"] in (0, 1)

    # keep-alive clients, four on each worker (a client's connection stays with the worker it reached)
    clients: dict[int, list] = {pid: [] for pid in pids}
    while min(len(c) for c in clients.values()) < 4:
        client = httpx.Client(timeout=60)
        pid = client.get(f"{server.url}/info").json()["pid"]
        if len(clients[pid]) < 4:
            clients[pid].append(client)
        else:
            client.close()
    records: list[tuple[int, float, float, str]] = []  # (worker, sent, done, outcome)
    stop = time.time() + 60  # bounded even if the server never stops

    def load(pid: int, client) -> None:
        try:
            while time.time() < stop:
                sent = time.monotonic()
                try:
                    got = client.post(f"{server.url}/classify", json={"inputs": TEXTS[:3]})
                    records.append((pid, sent, time.monotonic(), str(got.status_code)))
                except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                    records.append((pid, sent, time.monotonic(), "not accepted"))
                    return
        finally:
            client.close()

    threads = [threading.Thread(target=load, args=(pid, c)) for pid, cs in clients.items() for c in cs]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while not all(sum(r[0] == pid and r[3] == "200" for r in records) >= 2 for pid in pids):
        assert time.time() < deadline, "the workers did not answer under load"
        time.sleep(0.05)
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(90)
    for t in threads:
        t.join()
    stopped = next(line for line in server.lines if line.startswith("stopped:"))
    answered, accepted = map(int, re.match(r"stopped: answered (\d+) of (\d+) accepted", stopped).groups())
    outcomes = [r[3] for r in records]
    assert code == 0 and "(2 workers)" in stopped
    assert set(outcomes) <= {"200", "not accepted"}
    assert answered == accepted == outcomes.count("200")
    for pid in pids:  # each worker answered requests that were in flight when the signal came
        assert any(r[0] == pid and r[1] < signalled < r[2] and r[3] == "200" for r in records), pid
    assert not any(alive(pid) for pid in pids)


def test_a_worker_killed_while_serving_stops_the_server(servers):
    server = servers["killed-worker"]
    victim, other = sorted(worker_pids(server.url))
    os.kill(victim, signal.SIGKILL)
    assert server.proc.wait(90) == 1
    assert any(re.search(rf"worker \d \(pid {victim}\) exited with status -9 while serving", line)
               for line in server.lines)
    assert not alive(other)


def test_workers_stop_when_their_supervisor_is_killed(servers):
    server = servers["killed-supervisor"]
    pids = worker_pids(server.url)
    server.proc.kill()
    server.proc.wait(30)
    deadline = time.time() + 90
    while any(alive(pid) for pid in pids):
        assert time.time() < deadline, "workers outlived their supervisor"
        time.sleep(0.2)


def test_a_worker_that_fails_to_load_fails_the_command(folder):
    """max_length is checked against the model's positions where the model loads: in each worker."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "bert_kit", "serve", "--model", str(folder), "--port", "0",
                           "--device", "cpu", "--workers", "2", "--max-length", "300"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "serving on" not in done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "max_length=300 is out of range: expected an integer in [3, 256]" \
        in done.stderr


def test_default_workers(folder, monkeypatch):
    assert default_workers(ServeConfig(model=str(folder), device="cpu")) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_workers(ServeConfig(model=str(folder))) == 4  # a GPU: min(4, cores)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_workers(ServeConfig(model=str(folder), device="cuda")) == 2
    assert default_workers(ServeConfig(model=str(folder), device="cpu")) == 1


@pytest.mark.parametrize("quiet", [True, False])
def test_a_stop_caught_before_uvicorn_starts_drains_at_once(folder, quiet):
    """A SIGTERM that reached a worker between its "ready" and uvicorn's own handlers killed it
    unreported ("exited with status -15 while serving", the command's exit 1): caught, it is
    handed to the server, which starts, answers nothing and stops. A worker's server (quiet) says
    nothing of its start and stop: a supervisor stopped while another worker still loads says only
    that it was terminated."""
    pytest.importorskip("uvicorn", reason="bert-kit serve needs the [serve] extra")
    code = f"""
import signal, time
from bert_kit.serving.server import ServeConfig, build, listen, run_app
cfg = ServeConfig(model={str(folder)!r}, device="cpu")
_, _, app = build(cfg)
before = signal.getsignal(signal.SIGTERM)
t0 = time.monotonic()
print(run_app(app, listen("127.0.0.1", 0), cfg, [signal.SIGTERM], quiet={quiet}), time.monotonic() - t0 < 10,
      signal.getsignal(signal.SIGTERM) is before)
"""  # in a process of its own, as a worker runs it (and no event loop is left in this one)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "(0, 0) True True", done.stdout + done.stderr
    assert ("Started server process" in done.stderr) is not quiet, done.stderr
