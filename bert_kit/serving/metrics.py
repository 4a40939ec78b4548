"""Counters, gauges and histograms in the Prometheus text format (version 0.0.4), for `GET /metrics`.

Small on purpose: the server needs three metric types with labels, safe to update from the
event loop and from the batching thread, and one `render()` that Prometheus can scrape. The
format is the one documented at prometheus.io ("Exposition formats"): a `# HELP` and a `# TYPE`
line per family, then one `name{label="value"} number` line per sample; histograms give
cumulative `_bucket{le=...}` counts ending at `le="+Inf"`, plus `_sum` and `_count`.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# request latency (seconds): 1 ms to 30 s
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# inputs and tokens per model batch: powers of two
SIZE_BUCKETS = tuple(float(2 ** i) for i in range(11))  # 1 .. 1024
TOKEN_BUCKETS = tuple(float(2 ** i) for i in range(4, 17))  # 16 .. 65536


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if x != int(x) else str(int(x))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Family:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: Sequence[str]) -> tuple[str, ...]:
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")
        return tuple(str(v) for v in labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    """A count that only goes up (requests, inputs)."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()):
        super().__init__(name, help_text, labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        key = self._key(labels)
        with self._lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, *labels: str) -> float:
        return self.values.get(self._key(labels), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self.values.items())
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(_Family):
    """A value that goes up and down (queue depth, requests in flight); unlabelled."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str):
        super().__init__(name, help_text)
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def lines(self) -> list[str]:
        return self.header() + [f"{self.name} {_number(self.value)}"]


class Histogram(_Family):
    """Observations counted into fixed buckets (latency, batch sizes)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labels: Sequence[str] = ()):
        super().__init__(name, help_text, labels)
        self.bounds = tuple(sorted(buckets))
        # labels -> (per-bucket counts with a last +Inf bucket, sum)
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts, total = self.series.setdefault(key, ([0] * (len(self.bounds) + 1), [0.0]))
            counts[bisect.bisect_left(self.bounds, value)] += 1  # le is inclusive: value == bound counts
            total[0] += value

    def count(self, *labels: str) -> int:
        found = self.series.get(self._key(labels))
        return sum(found[0]) if found else 0

    def lines(self) -> list[str]:
        out = self.header()
        with self._lock:
            items = sorted((k, (list(c), s[0])) for k, (c, s) in self.series.items())
        for key, (counts, total) in items:
            running = 0
            for bound, n in zip(self.bounds + (math.inf,), counts):
                running += n
                le = 'le="' + ("+Inf" if math.isinf(bound) else repr(float(bound))) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {running}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {running}")
        return out


class ServerMetrics:
    """Every metric the server exposes; `render()` is the body of `GET /metrics`."""

    def __init__(self) -> None:
        self.requests = Counter("bert_kit_requests_total", "HTTP requests answered, by path and status code",
                                ("path", "status"))
        self.inputs = Counter("bert_kit_inputs_total", "inputs (texts, pairs, questions) computed, by path",
                              ("path",))
        self.latency = Histogram("bert_kit_request_duration_seconds",
                                 "time from reading a request to its response, by path", LATENCY_BUCKETS, ("path",))
        self.queue_wait = Histogram("bert_kit_queue_wait_seconds",
                                    "time an input waited in the queue before its batch started", LATENCY_BUCKETS)
        self.batch_inputs = Histogram("bert_kit_batch_size", "inputs per model batch, by path", SIZE_BUCKETS,
                                      ("path",))
        self.batch_tokens = Histogram("bert_kit_batch_tokens", "tokens per model batch, by path", TOKEN_BUCKETS,
                                      ("path",))
        self.batch_seconds = Histogram("bert_kit_batch_duration_seconds", "model time per batch, by path",
                                       LATENCY_BUCKETS, ("path",))
        self.queue_depth = Gauge("bert_kit_queue_depth", "inputs waiting for a batch")
        self.in_flight = Gauge("bert_kit_requests_in_flight", "requests accepted by the batcher and not yet answered")
        self.pending = Gauge("bert_kit_requests_pending", "requests read and not yet answered: being tokenized, "
                             "queued or computed (at most --max-queue)")
        self.disconnects = Counter("bert_kit_client_disconnects_total",
                                   "answers not delivered: the client closed its connection first")
        self.disconnects.inc(amount=0)  # shown from the start, at 0
        self.families: list[_Family] = [self.requests, self.inputs, self.latency, self.queue_wait, self.batch_inputs,
                                        self.batch_tokens, self.batch_seconds, self.queue_depth, self.in_flight,
                                        self.pending, self.disconnects]

    def render(self) -> str:
        return "\n".join(line for family in self.families for line in family.lines()) + "\n"
