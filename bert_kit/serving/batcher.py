"""Dynamic batching: inputs of concurrent requests share model batches bounded by tokens and wait.

A request's inputs (already tokenized into `Item`s) join a FIFO queue, one per operation. One
worker thread owns the model: it takes the operation whose oldest input has waited longest,
waits until that input is `max_wait` seconds old or the queued inputs fill `max_batch_tokens`,
then takes a window of inputs from the front of the queue (up to `window` budgets of tokens,
always at least one), sorts it longest first and cuts it into batches of neighbouring lengths,
each within the token budget. For a model that computes on padded batches (`op.pads_batches`:
an exported ONNX graph, a compiled encoder) the budget counts padded tokens, so a batch of short
inputs never pays for the longest one that arrived with them: on STS-B sentences, first-come
batches of ~85 padded 2.7x the real tokens and ran ONNX Runtime at a third of its speed. While
the model runs, new requests queue up, so under load each window takes whatever has arrived:
batches grow with the load, and an idle server adds at most `max_wait` to a request.

Every output goes back to its request at its input's position; a request is answered when its
last input is done (its inputs may span batches). At most `max_queue` requests are inside the
batcher at once; past that `submit` raises `QueueFull` at once (the server answers 503), so the
backlog, and with it the wait, stays bounded. `close()` lets the worker finish everything
accepted before it stops. Should the worker thread die (a bug), every request inside gets
`BatcherStopped` at once and so does every later one: nothing waits for a thread that is gone.

The model runs in this one thread: torch releases the GIL inside its kernels, so the event loop
keeps reading and answering requests while a batch computes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from bert_kit.serving.metrics import ServerMetrics


@dataclass
class Item:
    """One input of a request, ready for the model: `tokens` is its cost in the token budget
    (and its length for sorting); `data` is whatever the operation's `run` takes."""

    tokens: int
    data: Any


class QueueFull(Exception):
    """The batcher holds `max_queue` requests already; try again later."""


class BatcherStopped(RuntimeError):
    """The worker thread has stopped (closed, or died of an error): no request can be answered."""


@dataclass(eq=False)
class _Job:
    """One accepted request: its items, where their outputs go, and the future that awaits them."""

    items: Sequence[Item]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float
    outputs: list = field(default_factory=list)
    remaining: int = 0
    failed: bool = False
    finished: bool = False


def batch_bounds(lengths: Sequence[int], budget: int, padded: bool) -> list[tuple[int, int]]:
    """Cut inputs sorted longest first into consecutive batches [lo, hi) within `budget` tokens:
    padded, a batch costs its size x its first (longest) length; otherwise the sum of its lengths.
    Every batch holds at least one input."""
    bounds, lo, tokens = [], 0, 0
    for hi, length in enumerate(lengths):
        cost = (hi - lo + 1) * lengths[lo] if padded else tokens + length
        if hi > lo and cost > budget:
            bounds.append((lo, hi))
            lo, cost = hi, length
        tokens = cost
    if lengths:
        bounds.append((lo, len(lengths)))
    return bounds


class Batcher:
    """Gathers the items of concurrent requests into batches and runs them on one worker thread.

    run: `run(op, items) -> outputs`, one output per item in order; it runs on the worker thread.
    max_batch_tokens: most tokens in one batch (a longer single input still runs alone); padded
    tokens (batch size x longest input) for an operation whose `pads_batches` is true.
    max_wait: seconds the oldest queued input may wait for company before its batch starts.
    max_queue: most requests inside the batcher (queued or computing); past it `QueueFull`.
    window: real tokens taken from the queue at once, in budgets, to be sorted into batches.
    """

    def __init__(self, run: Callable[[Any, list[Item]], Sequence[Any]], max_batch_tokens: int = 8192,
                 max_wait: float = 0.005, max_queue: int = 256, metrics: ServerMetrics | None = None,
                 window: int = 4):
        # a wait of inf (or 1e300) s would be an OverflowError inside Condition.wait: the thread would die
        if max_batch_tokens < 1 or max_queue < 1 or not 0 <= max_wait <= 3600 or window < 1:
            raise ValueError(f"need max_batch_tokens >= 1, max_queue >= 1, 0 <= max_wait <= 3600 s, window >= 1; "
                             f"got {max_batch_tokens}, {max_queue}, {max_wait}, {window}")
        self.run, self.metrics = run, metrics or ServerMetrics()
        self.max_batch_tokens, self.max_wait, self.max_queue = max_batch_tokens, max_wait, max_queue
        self.window = window
        self._cond = threading.Condition()
        self._queues: dict[Any, deque[tuple[_Job, int]]] = {}  # op -> (job, item index), oldest first
        self._queued_tokens: dict[Any, int] = {}
        self._jobs = 0  # requests inside the batcher
        self._live: set[_Job] = set()  # the same requests, to answer them should the thread die
        self._closing = False
        self.stopped: BaseException | None = None  # why the worker thread died
        self._thread = threading.Thread(target=self._work, name="batcher", daemon=True)

    # ---- event-loop side ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.stopped is None

    @property
    def in_flight(self) -> int:
        return self._jobs

    @property
    def queued_inputs(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(self, op: Any, items: Sequence[Item]) -> list:
        """Outputs of `op` for `items`, in order, once their batches have run.

        Raises QueueFull when `max_queue` requests are inside already, BatcherStopped after
        `close()` or once the worker thread has died, and whatever `run` raised for a batch that
        held one of the items."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        job = _Job(items, loop, loop.create_future(), time.perf_counter(), [None] * len(items), len(items))
        with self._cond:
            if self.stopped is not None:
                raise BatcherStopped(f"the batching thread stopped: {type(self.stopped).__name__}: {self.stopped}")
            if self._closing:
                raise BatcherStopped("the batcher is closed")
            if self._jobs >= self.max_queue:
                raise QueueFull(f"{self._jobs} requests are queued (the bound is {self.max_queue})")
            self._jobs += 1
            self._live.add(job)
            queue = self._queues.setdefault(op, deque())
            queue.extend((job, i) for i in range(len(items)))
            self._queued_tokens[op] = self._queued_tokens.get(op, 0) + sum(it.tokens for it in items)
            self._update_gauges()
            self._cond.notify()
        return await job.future

    def close(self, timeout: float | None = None) -> bool:
        """Stop after every accepted request is answered; False if the worker is still busy after `timeout`."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- worker side --------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        self.metrics.queue_depth.set(self.queued_inputs)
        self.metrics.in_flight.set(self._jobs)

    def _next_batch(self) -> tuple[Any, list[tuple[_Job, int]]] | None:
        """Block until a batch is due; None once closing with nothing left."""
        with self._cond:
            while True:
                waiting = [(q[0][0].queued_at, op) for op, q in self._queues.items() if q]
                if not waiting:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                oldest, op = min(waiting, key=lambda w: w[0])
                # wait for company until the oldest input is max_wait old or the budget is full
                left = oldest + self.max_wait - time.perf_counter()
                if left > 0 and self._queued_tokens[op] < self.max_batch_tokens and not self._closing:
                    self._cond.wait(left)
                    continue
                queue, batch, tokens = self._queues[op], [], 0
                while queue:
                    job, i = queue[0]
                    cost = job.items[i].tokens
                    if batch and tokens + cost > self.window * self.max_batch_tokens:
                        break
                    batch.append(queue.popleft())
                    tokens += cost
                self._queued_tokens[op] -= tokens
                self._update_gauges()
                return op, batch

    def _work(self) -> None:
        try:
            self._batches()
        except BaseException as e:  # a bug: answer everyone inside, and everyone after, at once
            logging.getLogger("bert_kit.serve").exception("the batching thread stopped")
            with self._cond:
                self.stopped = e
                self._queues.clear()
                self._queued_tokens.clear()
                jobs = list(self._live)
            error = BatcherStopped(f"the batching thread stopped: {type(e).__name__}: {e}")
            for job in jobs:
                self._finish(job, None, error)

    def _batches(self) -> None:
        while True:
            found = self._next_batch()
            if found is None:
                return
            op, window = found
            start = time.perf_counter()
            for job, _ in window:
                self.metrics.queue_wait.observe(start - job.queued_at)
            window.sort(key=lambda entry: -entry[0].items[entry[1]].tokens)  # longest first
            lengths = [entry[0].items[entry[1]].tokens for entry in window]
            for lo, hi in batch_bounds(lengths, self.max_batch_tokens, getattr(op, "pads_batches", False)):
                self._run_batch(op, window[lo:hi])

    def _run_batch(self, op: Any, batch: list[tuple[_Job, int]]) -> None:
        start = time.perf_counter()
        items = [job.items[i] for job, i in batch]
        try:
            outputs = self.run(op, items)
            if len(outputs) != len(items):
                raise RuntimeError(f"{op} returned {len(outputs)} outputs for {len(items)} inputs")
        except Exception as e:  # every request with an input in this batch gets the error
            self._fail({job for job, _ in batch}, e)
            return
        path = getattr(op, "path", str(op))
        self.metrics.batch_seconds.observe(time.perf_counter() - start, path)
        self.metrics.batch_inputs.observe(len(items), path)
        self.metrics.batch_tokens.observe(sum(it.tokens for it in items), path)
        self.metrics.inputs.inc(path, amount=len(items))
        for (job, i), out in zip(batch, outputs):
            if job.failed:
                continue
            job.outputs[i] = out
            job.remaining -= 1
            if job.remaining == 0:
                self._finish(job, job.outputs, None)

    def _fail(self, jobs: set[_Job], error: Exception) -> None:
        for job in jobs:
            if not job.failed:
                job.failed = True
                with self._cond:  # drop its other inputs still queued
                    for q in self._queues.values():
                        if any(j is job for j, _ in q):
                            kept = [(j, i) for j, i in q if j is not job]
                            q.clear()
                            q.extend(kept)
                    self._queued_tokens = {op: sum(j.items[i].tokens for j, i in q) for op, q in self._queues.items()}
                self._finish(job, None, error)

    def _finish(self, job: _Job, outputs: list | None, error: Exception | None) -> None:
        with self._cond:
            if job.finished:
                return
            job.finished = True
            self._live.discard(job)
            self._jobs -= 1
            self._update_gauges()
            self._cond.notify_all()

        def resolve() -> None:
            if job.future.done():  # the handler was cancelled (client gone, forced shutdown)
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(outputs)

        try:
            job.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the event loop has closed: nobody waits for this answer any more
            pass
