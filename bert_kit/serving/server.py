"""Run the server: load the folder, warm the model up, listen, and shut down without losing a request.

`serve(ServeConfig(model="runs/finetune_sst2/best"))` blocks until SIGTERM or Ctrl-C. Then uvicorn
closes the listening socket (new connections are refused), lets every request it has read run to
its response (the batcher keeps computing), closes idle keep-alive connections, and the app stops
the batching thread. A request still unanswered after `grace_period` seconds is cancelled; the
exit status says whether that happened (0: every accepted request answered, 1: some were cut).
The batching and preparing threads are daemons: a batch still running when the grace period
ends does not hold up the exit.

Every setting is checked when `ServeConfig` is made (finite, in range: a ConfigError naming it);
max_length also against the model's positions when it loads. A client gets `read_timeout`
seconds to send a request's head (else the connection closes) and its body (else 408); an idle
keep-alive connection closes after 5 s at most.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from bert_kit.checks import ConfigError, Range, check_device, check_settings, choice_error
from bert_kit.serving.batcher import Batcher
from bert_kit.serving.metrics import ServerMetrics

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass
class ServeConfig:
    """Settings of `bert-kit serve` (each is a flag of the same name)."""

    model: str = ""  # model folder: a fine-tuned one serves its task, any BERT folder serves /embed
    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface)
    port: int = 8080  # 0 picks a free port (printed at start)
    device: str | None = None  # cpu, cuda, cuda:1 (default: cuda if available)
    precision: str = "auto"  # task heads: auto, fp32, bf16, fp16 (embeddings run in fp32)
    max_length: int | None = None  # tokens per input (default: the folder's fine-tuning length)
    max_batch_tokens: int | None = None  # most tokens in one model batch (default 16384 on a GPU, 2048 on the CPU)
    max_wait_ms: float = 5.0  # how long the oldest queued input waits for others to join its batch
    max_queue: int = 256  # requests queued or computing at once; past it 503 + Retry-After
    max_inputs: int = 64  # inputs per request (413 past it)
    max_chars: int = 20_000  # characters per text (413 past it)
    grace_period: float = 30.0  # seconds to finish accepted requests after SIGTERM
    read_timeout: float = 30.0  # seconds a client may take to send a request's head and its body (408 past it)
    backend: str = "torch"  # what runs the model (see operations.BACKENDS)
    access_log: bool = False  # log every request (costs time under load)
    workers: int | None = None  # processes, each its own model and batcher (default: min(4, cores) on a GPU, else 1)

    RULES = {"port": Range(0, 65535, integer=True, hint="0 picks a free port"),
             "max_length": Range(3, integer=True, optional=True, hint="at most the model's positions"),
             "max_batch_tokens": Range(1, 1 << 24, integer=True, optional=True),
             "max_wait_ms": Range(0, 60_000), "max_queue": Range(1, 1_000_000, integer=True),
             "max_inputs": Range(1, 1_000_000, integer=True), "max_chars": Range(1, 100_000_000, integer=True),
             "grace_period": Range(0, 86_400), "read_timeout": Range(0, 86_400, low_open=True),
             "workers": Range(1, 256, integer=True, optional=True)}

    def __post_init__(self) -> None:
        check_settings(self, self.RULES)
        check_device(self.device)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError("model is required: a model folder, a run folder or a hub name")
        if (self.workers or 1) > 1 and not hasattr(socket, "SO_REUSEPORT"):
            raise ConfigError(f"workers={self.workers}: several workers share the port through SO_REUSEPORT, "
                              "which this system lacks; use workers=1")
        if self.precision not in PRECISIONS:
            raise choice_error("precision", self.precision, PRECISIONS)
        from bert_kit.serving.operations import BACKENDS  # torch: imported once the cheap checks passed

        if self.backend not in BACKENDS:
            raise choice_error("backend", self.backend, tuple(BACKENDS))


def listen(host: str, port: int, reuse_port: bool = False, backlog: int = 2048) -> socket.socket:
    """A listening socket (IPv6 when the host has a colon); OSError becomes a one-line ValueError.
    It listens before the address is printed, so a client that connects at once waits in the
    kernel's backlog until the server accepts, instead of being refused. reuse_port: one of several
    sockets of this user on the same port (SO_REUSEPORT), among which the kernel spreads connections;
    backlog 0: bound only (it holds the port and gets no connections)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        if backlog:
            sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def http_protocol(read_timeout: float) -> type:
    """uvicorn's HTTP protocol with a deadline for a request's head: a connection that does not
    send a whole request line and headers within `read_timeout` seconds of opening (or of its last
    response) is closed. uvicorn times out only idle keep-alive connections, and any byte resets that."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Protocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm(None)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._awaited:  # a request's head arrived: its body has a deadline of its own
                self._disarm()

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm(done)  # the next request's head

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, cycle: Any) -> None:
            self._disarm()
            self._awaited = cycle  # the cycle of the last request: a new one means a head arrived
            self._deadline = self.loop.call_later(read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if getattr(self, "_deadline", None) is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self) -> None:
            self._deadline = None
            if self.cycle is self._awaited and not self.transport.is_closing():
                self.transport.close()

    return Protocol


def warm_up(operations: list) -> None:
    """A batch of one input and one of three through every operation: the first forward passes pay
    one-off costs (allocations, kernel selection) that should not land on the first clients."""
    from bert_kit.serving.operations import NonFiniteOutput

    for op in operations:
        options = op.with_defaults({})
        try:
            for n in (1, 3):
                op.respond(op.run(op.prepare([op.example] * n, options)), options)
        except NonFiniteOutput as e:  # no input would get an answer: refuse to serve
            raise ValueError(f"{op} on its example {op.example!r}: {e}: the model's weights (or its precision) "
                             "are broken") from None


def build(cfg: ServeConfig, worker: tuple[int, int] = (0, 1)) -> tuple[dict, list, Any]:
    """(description, operations, ASGI app) of `cfg.model`: loaded, warmed up, limits and batcher in
    place. `worker` is (index, count) among the processes serving it, shown in /info."""
    from bert_kit.serving.app import Limits, create_app
    from bert_kit.serving.operations import BACKENDS

    info, operations = BACKENDS[cfg.backend](cfg.model, cfg.device, cfg.precision, cfg.max_length)
    warm_up(operations)
    info.update(worker=worker[0], workers=worker[1], pid=os.getpid())
    metrics = ServerMetrics()
    # a GPU gains from batches as large as memory allows; on a CPU big batches overflow the caches
    # (MiniLM on 2 shared cores: batches of 64 sentences of ~15 tokens ran 2-4x faster than of 512)
    budget = cfg.max_batch_tokens if cfg.max_batch_tokens is not None else (
        16384 if info["device"].startswith("cuda") else 2048)
    batcher = Batcher(lambda op, items: op.run(items), budget, cfg.max_wait_ms / 1000, cfg.max_queue, metrics)
    limits = Limits(cfg.max_inputs, cfg.max_chars, read_timeout=cfg.read_timeout, max_queue=cfg.max_queue)
    return info, operations, create_app(info, operations, batcher, limits, metrics)


def run_app(app: Any, sock: socket.socket, cfg: ServeConfig, pending: list[int] | None = None,
            quiet: bool = False) -> tuple[int, int]:
    """Serve `app` on the listening `sock` under uvicorn (httptools and uvloop where installed)
    until SIGTERM/SIGINT and the drain that follows; (answered, accepted) requests. `pending`: stop
    signals caught before this was called (and any caught while it starts), which drain at once.
    quiet: without uvicorn's lines about starting and stopping (a worker's: the supervisor speaks)."""
    import uvicorn  # the [serve] extra, imported only here so the CLI's --help works without it

    config = uvicorn.Config(app, lifespan="on", access_log=cfg.access_log, log_level="info",
                            timeout_graceful_shutdown=cfg.grace_period, http=http_protocol(cfg.read_timeout),
                            timeout_keep_alive=min(5, cfg.read_timeout))  # type: ignore[arg-type]
    if quiet:  # its warnings and errors still show; the access log is another logger
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done; with these handlers in place
    # that only asks a stopped server to stop, so a graceful stop ends with our exit status instead
    # of "killed by SIGTERM"; before uvicorn installs its own, they stop it as uvicorn's would
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in pending or []:
        server.handle_exit(sig, None)
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    state = app.state.server
    return state.answered, state.accepted


def announce(info: dict, paths: list[str], host: str, port: int, seconds: float) -> None:
    """The two lines a server prints once it listens (scripts read the address from the second)."""
    host = f"[{host}]" if ":" in host else host
    workers = f", {info['workers']} workers" if info.get("workers", 1) > 1 else ""
    print(f"loaded {info['model']} ({info['task'] or 'encoder'}, {info['device']}{workers}) in {seconds:.1f}s",
          flush=True)
    print(f"serving on http://{host}:{port}  "
          f"POST {', '.join(paths)}; GET /health, /info, /metrics, /openapi.json", flush=True)


def serve(cfg: ServeConfig) -> int:
    """Serve `cfg.model` from this process until SIGTERM/SIGINT; 0 when every accepted request was
    answered. (`bert_kit.serving.serve` starts `cfg.workers` such processes where that is more than 1.)"""
    import uvicorn  # noqa: F401  (the [serve] extra: fail before loading anything)

    t0 = time.perf_counter()
    info, operations, app = build(cfg)
    sock = listen(cfg.host, cfg.port)
    announce(info, [op.path for op in operations], cfg.host, sock.getsockname()[1], time.perf_counter() - t0)
    answered, accepted = run_app(app, sock, cfg)
    print(f"stopped: answered {answered} of {accepted} accepted requests", flush=True)
    return 0 if answered == accepted else 1
