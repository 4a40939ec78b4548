"""How a bert-kit command uses the CPU's cores, so that several commands share a machine fairly.

torch runs its CPU work on an OpenMP thread per core. Two things go wrong when a second process
shares the cores. Waiting OpenMP threads spin (GNU OpenMP: 300,000 rounds before they sleep) and
take the cores the other process needs. And a parallel region ends only when its slowest
thread does: with more threads than the cores left to a process, one thread waits for a core and
the whole region waits for it. Two fine-tunes at once on two cores took 7.3x their time alone
(benchmarks/reports/2026-11-27-cpu-sharing.md). So every command, before torch is imported:

- sets `GOMP_SPINCOUNT=10000` (a waiting thread spins 10,000 rounds, enough to catch the next
  operation of a busy loop, then sleeps), unless it is set already; `OMP_WAIT_POLICY=PASSIVE`
  makes every pool sleep at once (ONNX Runtime's too), at some cost to a command alone;
- with `BERT_KIT_THREADS=N`: N threads for each pool (torch's intra-op threads through
  `OMP_NUM_THREADS`, the Rust tokenizer's through `RAYON_NUM_THREADS`, ONNX Runtime's), for a
  process given N cores of a shared machine. Unset, each pool takes every core, as alone;

and a training run on the CPU sizes torch's pool as it goes (`CoreShare`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bert_kit.checks import ConfigError

THREADS_VARIABLE = "BERT_KIT_THREADS"


def configured_threads() -> int | None:
    """BERT_KIT_THREADS as a positive integer, None when unset; a bad value is a ConfigError."""
    raw = os.environ.get(THREADS_VARIABLE, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{THREADS_VARIABLE}={raw!r}: expected a positive number of threads (e.g. 2), or unset "
                          "it to use every core")
    return int(raw)


def share_cores() -> None:
    """Set the environment of this process (and the processes it starts) as the module docstring
    says. Call it before torch is imported: OpenMP reads these variables when it starts."""
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    threads = configured_threads()
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
            os.environ[name] = str(threads)
        if "torch" in sys.modules:  # called from Python after torch started: set its pool directly
            sys.modules["torch"].set_num_threads(threads)


def spinning() -> bool:
    """Whether ONNX Runtime's waiting threads may spin: unless OMP_WAIT_POLICY=PASSIVE says none may."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE"


class CoreShare:
    """While training on the CPU, sizes torch's thread pool to the cores other work leaves free.

    A parallel region of torch ends when its slowest thread does. With more threads than the cores
    left to this process, one thread waits for a core and the whole region waits for it (the
    module docstring). So every `interval` seconds `adjust()` reads the time the
    process's cores were busy (/proc/stat) less this process's own, and sets the pool to the cores
    left over: at least 1, at most the pool it had alone, that pool again once the other work ends.
    Work started with `nice` (lower priority) is not counted.
    Linux only; off when BERT_KIT_THREADS fixes the number.
    """

    def __init__(self, interval: float = 2.0) -> None:
        import torch

        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.most = torch.get_num_threads()  # the pool alone (torch's choice: a thread per physical core)
        self.interval = interval
        self.enabled = configured_threads() is None and len(self.cores) > 1 and Path("/proc/stat").is_file()
        self.last = self.read() if self.enabled else None

    def read(self) -> tuple[float, float, float]:
        """(now, seconds the cores were busy, seconds this process computed), since boot. Work of
        lower priority than this process (niced) does not count: the kernel gives way for us."""
        wanted, busy = {f"cpu{c}" for c in self.cores}, 0
        niced_too = os.nice(0) > 0  # then our own time is counted as "nice"
        for line in Path("/proc/stat").read_text().splitlines():
            name, *ticks = line.split()
            if name in wanted:  # user nice system idle iowait irq softirq steal ...
                values = [int(t) for t in ticks[:8]]
                busy += sum(values) - values[3] - values[4] - (0 if niced_too else values[1])
        own = os.times()
        return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system

    def adjust(self) -> None:
        """Call once per step: cheap, it reads the counters only every `interval` seconds."""
        if not self.enabled or time.monotonic() - self.last[0] < self.interval:
            return
        import torch

        now = self.read()
        elapsed = now[0] - self.last[0]
        others = max(0.0, (now[1] - self.last[1]) - (now[2] - self.last[2])) / elapsed  # cores' worth
        self.last = now
        threads = max(1, min(self.most, round(len(self.cores) - others)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
