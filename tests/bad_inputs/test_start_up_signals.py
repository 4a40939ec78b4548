"""Bad inputs: Ctrl-C or SIGTERM at any moment of a command's start-up, and of `serve --workers 2`
loading its model: one line, exit 130 / 143, no traceback, no process left behind.

Before: a SIGINT in the first second of a command raised KeyboardInterrupt inside whatever import
was running; 3 of 30 runs went on to exit 0 (a library swallowed it), 7 exited 1 with "numpy has
no attribute 'matrix'" (a half-imported numpy), others printed tracebacks. SIGTERM while `serve
--workers 2` loaded killed the supervisor (status -15, no message) and every worker printed a
BrokenPipeError traceback.

Each process is signalled at a set delay after bert-kit's first line installed its handler (seen
in /proc/PID/status, whose SigCgt mask gains SIGTERM then): the interpreter's own start-up before
that line (Python's site import, tens of milliseconds) is outside bert-kit's reach. A process
that finished (or loaded) before its signal is checked for a clean result instead. The processes
of one test run at once. Linux only (/proc).
Run: .venv/bin/python -m pytest tests/bad_inputs/test_start_up_signals.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")


def start(*argv: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bert_kit", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def handler_installed(proc: subprocess.Popen, timeout: float = 60) -> bool:
    """Wait until the command's SIGTERM handler is in place; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            caught = next(int(line.split()[1], 16) for line in Path(f"/proc/{proc.pid}/status").read_text()
                          .splitlines() if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return False
        if caught & (1 << (signal.SIGTERM - 1)):
            return True
        time.sleep(0.002)
    return False


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def signal_at(procs: list[subprocess.Popen], delays: list[float], sig: int) -> list[subprocess.Popen]:
    """Send `sig` to each process `delays[i]` seconds after its handler was installed; the
    processes that were signalled while still running."""
    ready = [handler_installed(p) for p in procs]
    t0 = time.monotonic()
    signalled = []
    for proc, ok, delay in sorted(zip(procs, ready, delays), key=lambda x: x[2]):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        if ok and proc.poll() is None:
            proc.send_signal(sig)
            signalled.append(proc)
    return signalled


def test_ctrl_c_at_any_moment_of_start_up(assets, tmp_path):
    """SIGINT while bert_kit.cli, torch and the command import, while the model loads and the
    texts are read: "bert-kit embed: interrupted", exit 130, nothing else (but what the input's
    reading said before: its texts are read while torch loads)."""
    delays = [0.0, 0.05, 0.15, 0.3, 0.5, 0.8, 1.2, 2.0]
    procs = [start("embed", "--model", str(assets.encoder), "--input", str(assets.corpus), "--output",
                   f"v{i}.npy", "--device", "cpu", cwd=tmp_path) for i in range(len(delays))]
    signalled = signal_at(procs, delays, signal.SIGINT)
    assert len(signalled) >= len(delays) // 2  # most were still starting: the test tested something
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc in signalled and proc.returncode != 0:
            said = [line for line in err.splitlines() if not line.startswith("warning: ")]  # the input's notes
            assert (proc.returncode, said) == (130, ["bert-kit embed: interrupted"]), err
        else:  # it had finished, or the signal came after its work was done
            assert proc.returncode in (0, 130) and "Traceback" not in err, err


def test_sigterm_while_serve_workers_load(assets, tmp_path):
    """SIGTERM to `serve --workers 2` while it imports, while its workers load: "bert-kit serve:
    terminated", exit 143, not a word from the workers, and no worker left running."""
    pytest.importorskip("uvicorn", reason="bert-kit serve needs the [serve] extra")
    delays = [0.0, 0.4, 1.5, 3.0]
    procs = [start("serve", "--model", str(assets.classifier), "--port", "0", "--workers", "2", "--device", "cpu",
                   cwd=tmp_path) for _ in delays]
    workers: dict[int, list[int]] = {}
    ready = [handler_installed(p) for p in procs]
    t0 = time.monotonic()
    for proc, ok, delay in zip(procs, ready, delays):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        assert ok and proc.poll() is None
        workers[proc.pid] = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
    loading = 0
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if "serving on" in out:  # it had loaded: SIGTERM drains, as ever
            assert proc.returncode == 0 and "Traceback" not in out + err, out + err
        else:
            loading += 1
            assert (proc.returncode, out + err) == (143, "bert-kit serve: terminated\n")
    assert loading >= len(delays) // 2  # most were still loading: the test tested something
    deadline = time.monotonic() + 30
    left = [pid for pids in workers.values() for pid in pids if not gone(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if not gone(pid)]
    assert not left
