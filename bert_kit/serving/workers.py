"""Several worker processes serving one model on one port: `bert-kit serve --workers N`.

One Python process reads HTTP, parses and writes JSON, tokenizes and launches the model's kernels
under one interpreter lock; on a GPU that process, not the GPU, is the limit. With N workers each
process has its own event loop, batcher and copy of the model on the same device, and the kernel
spreads the connections over them.

The supervisor (the process `bert-kit serve` started):

- holds the port: a socket bound with SO_REUSEPORT that never listens (port 0 becomes a real port;
  a port another program holds is refused at once, before any model loads);
- starts the workers (`multiprocessing` spawn: fresh interpreters, no CUDA state copied); each binds
  its own listening socket on that port with SO_REUSEPORT, and the kernel hands every new
  connection to one of them (a shared socket would let the first worker to wake accept a whole
  burst of connections);
- prints the address once every worker has loaded and warmed up its model (a failure in any is
  the command's error, with the same message and exit status as one process);
- on SIGTERM or SIGINT sends SIGTERM to every worker, once: each stops accepting, answers every
  request it accepted within the grace period and reports its counts; the supervisor prints
  "stopped: answered X of Y accepted requests" over all workers and exits 0 when every worker
  answered everything it accepted, else 1.

A worker that exits while serving stops the others (exit status 1), as the death of a single
server process ends serving. Workers leave the terminal's process group, so Ctrl-C reaches the
supervisor alone (which then stops each worker once: a second SIGINT would make uvicorn drop its
requests); a worker whose supervisor is gone (killed) stops as on SIGTERM. A stop signal while the
workers load ends them at once and the command with one line (130 / 143); a worker whose
supervisor went away while it loaded ends quietly. Every worker answers
/health, /info and /metrics for itself; /info names it (`worker`, `workers`, `pid`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from bert_kit.checks import ConfigError
from bert_kit.serving import server
from bert_kit.serving.server import ServeConfig, announce, build, listen, run_app

log = logging.getLogger("bert_kit.serve")
MAX_DEFAULT_WORKERS = 4


def serve(cfg: ServeConfig) -> int:
    """`bert-kit serve`: `cfg.workers` processes (default `default_workers`), or this one alone;
    0 when every request accepted was answered."""
    count = cfg.workers if cfg.workers is not None else default_workers(cfg)
    return serve_workers(cfg, count) if count > 1 else server.serve(cfg)


def default_workers(cfg: ServeConfig) -> int:
    """min(4, cores) for a PyTorch model on a GPU; 1 on the CPU, where the model's matrix products
    take the cores whatever the server does, and for an exported folder (ONNX Runtime, on the CPU)."""
    import torch

    device = (cfg.device or "auto").strip()
    if cfg.backend != "torch" or not (device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())):
        return 1
    from bert_kit.model_folder import resolve_model
    from bert_kit.onnx_runtime import is_onnx_folder

    try:
        if is_onnx_folder(resolve_model(cfg.model)):
            return 1
    except Exception:  # a missing folder: one process says so, as it always has
        return 1
    return max(1, min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1))


@dataclass
class _Worker:
    index: int
    process: Any  # multiprocessing.Process
    inbox: Connection  # what the worker reports: ("ready", info, paths), ("failed", error), ("stopped", n, m)
    counts: tuple[int, int] | None = None  # (answered, accepted) once it stopped
    messages: list = field(default_factory=list)

    def read(self) -> None:
        """Every message waiting, without blocking (the pipe's end: EOF once the worker is gone)."""
        try:
            while self.inbox.poll():
                message = self.inbox.recv()
                if message[0] == "stopped":
                    self.counts = message[1], message[2]
                self.messages.append(message)
        except (EOFError, OSError):
            pass


def _portable(error: BaseException) -> BaseException:
    """`error`, or the nearest built-in kind with its message when it does not survive pickling."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        for kind in (ConfigError, ValueError, ImportError, OSError):
            if isinstance(error, kind):
                return kind(str(error))
        return RuntimeError(f"{type(error).__name__}: {error}")


def _watch_supervisor(supervisor: int) -> None:
    """Stop this worker as on SIGTERM once its supervisor is gone (killed: nobody would stop it)."""
    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _worker(cfg: ServeConfig, index: int, count: int, port: int, outbox: Connection) -> None:
    """One worker process: load, listen on the shared port, serve until SIGTERM, report."""
    os.setpgrp()  # out of the terminal's process group: Ctrl-C reaches the supervisor alone
    # while it loads, SIGTERM (from the supervisor, or its own watch once the supervisor is gone)
    # ends it at once and quietly; serving, uvicorn's handlers drain first
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _watch_supervisor(os.getppid())
    share = max(1, (os.cpu_count() or 1) // count)  # CPU threads (torch's, the tokenizer's) per worker
    os.environ.setdefault("RAYON_NUM_THREADS", str(share))
    try:
        import torch

        if not os.environ.get("BERT_KIT_THREADS"):
            torch.set_num_threads(min(torch.get_num_threads(), share))
        info, operations, app = build(cfg, (index, count))
        sock = listen(cfg.host, port, reuse_port=True)
    except BaseException as e:  # reported to the supervisor, which ends the command with it
        _report(outbox, ("failed", _portable(e)))
        return
    # announced from "ready" on, so from then a stop drains: one arriving before uvicorn's own
    # handlers are in place is kept and handed to it, not left to kill the worker unreported
    pending: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, _: pending.append(sig))
    if not _report(outbox, ("ready", info, [op.path for op in operations])):
        return  # the supervisor is gone: nobody announced this worker, nobody will stop it
    answered, accepted = run_app(app, sock, cfg, pending, quiet=True)
    _report(outbox, ("stopped", answered, accepted))


def _report(outbox: Connection, message: tuple) -> bool:
    """Send `message` to the supervisor; False, quietly, when it is gone (its end of the pipe closed:
    it was stopped while this worker loaded)."""
    try:
        outbox.send(message)
        return True
    except (BrokenPipeError, ConnectionError, EOFError, OSError):
        return False


def _signal_all(workers: list[_Worker], sig: int) -> None:
    for w in workers:
        if w.process.is_alive():
            try:
                os.kill(w.process.pid, sig)
            except ProcessLookupError:
                pass


def _start(workers: list[_Worker]) -> tuple[dict, list[str]]:
    """(info, paths) of the first worker once every worker is ready; a worker's failure raised here."""
    waiting = {w.index: w for w in workers}
    first = None
    while waiting:
        ready = wait([w.inbox for w in waiting.values()] + [w.process.sentinel for w in waiting.values()])
        for w in list(waiting.values()):
            w.read()
            for message in w.messages:
                if message[0] == "failed":
                    raise message[1]
                if message[0] == "ready":
                    first = first or message
                    waiting.pop(w.index, None)
            if w.index in waiting and w.process.sentinel in ready and not w.process.is_alive():
                w.read()
                if not any(m[0] == "ready" for m in w.messages):
                    raise RuntimeError(f"worker {w.index} (pid {w.process.pid}) exited with status "
                                       f"{w.process.exitcode} while loading the model")
    return first[1], first[2]


def serve_workers(cfg: ServeConfig, count: int) -> int:
    """Serve `cfg.model` from `count` worker processes until SIGTERM/SIGINT (the module docstring);
    0 when every worker answered every request it accepted."""
    t0 = time.perf_counter()
    probe = listen(cfg.host, cfg.port, backlog=0)  # refused if any socket holds the port, SO_REUSEPORT or not
    port = probe.getsockname()[1]
    probe.close()
    held = listen(cfg.host, port, reuse_port=True, backlog=0)  # the port stays ours while workers start
    context = multiprocessing.get_context("spawn")
    workers: list[_Worker] = []
    stop_at: list[float] = []  # when the workers were told to stop

    def stop(*_: Any) -> None:
        if not stop_at:
            stop_at.append(time.monotonic())
            _signal_all(workers, signal.SIGTERM)

    try:
        for index in range(count):
            inbox, outbox = context.Pipe(duplex=False)
            process = context.Process(target=_worker, args=(cfg, index, count, port, outbox),
                                      name=f"bert-kit serve worker {index}")
            process.start()
            outbox.close()
            workers.append(_Worker(index, process, inbox))
        info, paths = _start(workers)
        # from here a stop signal drains the workers; before, it is an exception (Ctrl-C's
        # KeyboardInterrupt, the command line's Terminated for SIGTERM) that ends loading
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    except BaseException:  # a worker's error, or a stop signal while loading: no worker outlives the command
        _signal_all(workers, signal.SIGKILL)
        for w in workers:
            w.process.join()
        held.close()
        raise
    info["workers"] = count
    announce(info, paths, cfg.host, port, time.perf_counter() - t0)
    died = []
    try:
        while any(w.process.is_alive() for w in workers):
            wait([w.process.sentinel for w in workers if w.process.is_alive()], timeout=1.0)
            for w in workers:
                if not w.process.is_alive() and w.counts is None and w not in died:
                    w.read()
                    if w.counts is None:  # gone without its report: killed, or a crash
                        died.append(w)
                        print(f"bert-kit serve: worker {w.index} (pid {w.process.pid}) exited with status "
                              f"{w.process.exitcode} while serving; stopping the others", file=sys.stderr, flush=True)
                        stop()
            if stop_at and time.monotonic() - stop_at[0] > cfg.grace_period + 60:
                _signal_all(workers, signal.SIGKILL)  # past its grace period and more: nothing left to wait for
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        held.close()
    for w in workers:
        w.process.join()
        w.read()
    answered = sum(w.counts[0] for w in workers if w.counts)
    accepted = sum(w.counts[1] for w in workers if w.counts)
    print(f"stopped: answered {answered} of {accepted} accepted requests ({count} workers)", flush=True)
    clean = not died and all(w.counts and w.counts[0] == w.counts[1] and w.process.exitcode == 0 for w in workers)
    return 0 if clean else 1
