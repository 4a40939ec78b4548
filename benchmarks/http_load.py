"""A load generator for embedding servers that is not the bottleneck: clients in several processes.

`run_load(target, clients, procs, seconds, sentences)` opens `clients` keep-alive HTTP/1.1
connections spread over `procs` client processes (multiprocessing spawn; uvloop where installed).
Each connection posts 1-16 random sentences per request back to back: a request body is built
before the run (2,048 per process, cycled), the client writes raw HTTP on an asyncio stream and
reads the status line, the headers and Content-Length bytes of body, which it does not parse (a
sample is parsed and checked: one vector per sentence). So one client process sustains thousands
of requests per second, and each process reports the CPU time it used: a process near 100% of a
core would be the limit (serve_load.py also reruns with twice the processes to show it is not).

All processes start together (a barrier, then a common start time); the first `ramp` seconds
fill the server's queues, and a request counts when its response arrives inside the `seconds`
that follow; its latency is from its write to its last byte. Non-200 answers and connections
refused or closed count as errors. `stop_on_error` (the SIGTERM check) ends a connection at its
first failure instead of reconnecting; then the run lasts until every connection has ended or
`seconds` have passed.

`GpuSampler` reads the GPU's utilisation (NVML through `nvidia-ml-py`, else `nvidia-smi`) every
100 ms while a run lasts; None on a machine without either.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np


@dataclass
class Target:
    """Where and how to post: `url` of the server, `path` of its endpoint, its API: "bert-kit"
    ({"inputs": [...]} -> {"embeddings": [...]}) or "openai" ({"input": [...], "model": name} ->
    {"data": [{"embedding": [...]}, ...]}, as infinity-emb serves /embeddings)."""

    url: str
    path: str = "/embed"
    api: str = "bert-kit"
    model: str = ""

    def body(self, texts: list[str]) -> bytes:
        content = {"inputs": texts} if self.api == "bert-kit" else {"input": texts, "model": self.model}
        return json.dumps(content).encode()

    def vectors(self, body: bytes) -> list:
        answer = json.loads(body)
        return answer["embeddings"] if self.api == "bert-kit" else [d["embedding"] for d in answer["data"]]


async def _connection(target: Target, bodies: list, start: float, deadline: float, out: dict, offset: int,
                      stop_on_error: bool) -> None:
    """One client: requests back to back on one keep-alive connection until `deadline`."""
    where = urlsplit(target.url)
    head = (f"POST {target.path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
            "Content-Length: ").encode()
    k, writer, checked = offset, None, False
    while time.perf_counter() < deadline:
        n, body = bodies[k % len(bodies)]
        k += 1
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(where.hostname, where.port)
            t0 = time.perf_counter()
            writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionResetError("closed before a response")
            length, closing = 0, False
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    closing = True
            payload = await reader.readexactly(length)
            done = time.perf_counter()
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            out["refused"] += 1
            if writer is not None:
                writer.close()
            writer = None
            if stop_on_error:
                return
            await asyncio.sleep(0.05)  # a refused connection: do not spin on it
            continue
        status = int(status_line.split()[1])
        out["statuses"][status] = out["statuses"].get(status, 0) + 1
        if status == 200 and not checked:  # one answer per connection read in full: a vector per sentence
            checked = True
            if len(target.vectors(payload)) != n:
                out["wrong"] += 1
        if status == 200 and start <= done <= deadline:
            out["latency"].append(done - t0)
            out["sentences"] += n
        if closing:
            writer.close()
            writer = None
    if writer is not None:
        writer.close()


def _client_process(target: Target, conns: int, sentences: list[str], seed: int, ramp: float, seconds: float,
                    ready: Any, go: Any, results: Any, stop_on_error: bool) -> None:
    """One client process: `conns` connections for `seconds` from the common start."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    rng = random.Random(seed)
    bodies = []
    for _ in range(2048):
        texts = rng.sample(sentences, rng.randint(1, 16))
        bodies.append((len(texts), target.body(texts)))
    out: dict[str, Any] = {"latency": [], "sentences": 0, "statuses": {}, "refused": 0, "wrong": 0}

    async def main() -> None:
        ready.put(True)
        start_at = go.get()  # time.time() at which every process starts
        await asyncio.sleep(max(0.0, start_at - time.time()))
        start = time.perf_counter() + ramp
        cpu = time.process_time()
        await asyncio.gather(*(_connection(target, bodies, start, start + seconds, out, 97 * c, stop_on_error)
                               for c in range(conns)))
        cpu = time.process_time() - cpu  # ramp included: the busiest moments count
        out["cpu_share"] = cpu / max(time.perf_counter() - start + ramp, 1e-9)

    asyncio.run(main())
    out["latency"] = np.array(out["latency"])
    results.put(out)


class GpuSampler:
    """Mean GPU utilisation (%) of device `index` while `with` lasts, sampled every 100 ms; `mean`
    is None where neither NVML (`pip install nvidia-ml-py`) nor nvidia-smi answers."""

    def __init__(self, index: int = 0, enabled: bool = True):
        self.index, self.samples, self.mean = index, [], None
        self._read = self._reader() if enabled else None
        self._stop = threading.Event()

    def _reader(self) -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            return lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except Exception:  # no package, no driver
            pass
        if shutil.which("nvidia-smi"):
            command = ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu",
                       "--format=csv,noheader,nounits"]

            def read() -> float:
                return float(subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.split()[0])

            try:
                read()
                return read
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
        return None

    def __enter__(self) -> "GpuSampler":
        if self._read is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.samples.append(float(self._read()))
            except Exception:
                return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._read is not None:
            self._thread.join(5)
            self.mean = float(np.mean(self.samples)) if self.samples else None


def run_load(target: Target, clients: int, procs: int, seconds: float, sentences: list[str], seed: int = 0,
             stop_on_error: bool = False, gpu: int | None = None, during: Any = None, ramp: float = 1.0,
             meter: Any = None) -> dict:
    """`clients` connections in `procs` processes for `seconds` after `ramp` (the module docstring);
    `gpu`: the index of the GPU whose utilisation to sample; `during`: called once the window starts
    (the SIGTERM check sends its signal from there); `meter`: a reading (the server's CPU-seconds)
    whose change over the window is returned as "metered"."""
    procs = max(1, min(procs, clients))
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Queue(), context.Queue(), context.Queue()
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    workers = [context.Process(target=_client_process, daemon=True,
                               args=(target, n, sentences, seed * 1000 + i, ramp, seconds, ready, go, results,
                                     stop_on_error))
               for i, n in enumerate(shares)]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=120)
    start_at = time.time() + 0.2
    for _ in workers:
        go.put(start_at)
    time.sleep(max(0.0, start_at + ramp - time.time()))
    with GpuSampler(gpu or 0, enabled=gpu is not None) as sampler:
        metered = meter() if meter is not None else None
        if during is not None:
            during()
        if meter is not None:
            time.sleep(max(0.0, start_at + ramp + seconds - time.time()))
            metered = meter() - metered
        outs = [results.get(timeout=seconds + 600) for _ in workers]
    for w in workers:
        w.join(30)
    latency = np.concatenate([o["latency"] for o in outs]) * 1000
    statuses: dict[str, int] = {}
    for o in outs:
        for code, n in o["statuses"].items():
            statuses[str(code)] = statuses.get(str(code), 0) + n
    refused = sum(o["refused"] for o in outs)
    ok = len(latency)
    sentences_done = sum(o["sentences"] for o in outs)
    return {"clients": clients, "procs": procs, "seconds": seconds, "requests": ok, "sentences": sentences_done,
            "requests_per_s": ok / seconds, "sentences_per_s": sentences_done / seconds,
            "p50_ms": float(np.percentile(latency, 50)) if ok else float("nan"),
            "p99_ms": float(np.percentile(latency, 99)) if ok else float("nan"),
            "errors": sum(n for code, n in statuses.items() if code != "200") + refused,
            "statuses": statuses, "refused": refused, "wrong_answers": sum(o["wrong"] for o in outs),
            "client_cpu_max": max(o["cpu_share"] for o in outs),  # the busiest client process's share of a core
            "gpu_util": sampler.mean, "metered": metered}
