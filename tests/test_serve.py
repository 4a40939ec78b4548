"""`bert-kit serve`: the batcher alone, then real server processes on loopback talked to over HTTP.

Each server is `python -m bert_kit serve --port 0` on a folder this module writes (tiny heads on
the real MiniLM tokenizer; the real all-MiniLM-L6-v2 for /embed parity), started all at once and
reached with httpx. Answers must equal what the library computes locally (`SentenceEncoder.encode`
within 1e-5, `bert-kit predict`, `fill_mask`), concurrent callers must each get their own
results, every error status must carry a JSON message naming the field, and a SIGTERM under load
must answer every accepted request before the process exits.

Run: .venv/bin/python -m pytest tests/test_serve.py -q
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.heads import (
    BERTForMaskedLM,
    BERTForQuestionAnswering,
    BERTForSequenceClassification,
    BERTForTokenClassification,
)
from bert_kit.serving.batcher import Batcher, BatcherStopped, Item, QueueFull, batch_bounds
from bert_kit.tokenizer import get_tokenizer
from tests.tasks.test_inference import saved

REPO = Path(__file__).resolve().parents[1]
TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=256)
NER_LABELS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
TEXTS = ["A man is playing a guitar.", "The cat sat on the mat near the door.", "Stocks fell sharply on Monday.",
         "John Smith lives in New York and works for the United Nations.", "Hi.",
         "A woman is slicing onions in a small kitchen while the radio plays."]

# one worker starts the module's servers, first (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("serve"), pytest.mark.slow]


# ---- the batcher on its own ---------------------------------------------------------------------

class Doubler:
    """A fake operation: output = 2 * data; remembers every batch's token counts."""

    path = "/double"

    def __init__(self, fail_on: int | None = None, gate: threading.Event | None = None):
        self.batches: list[list[int]] = []
        self.sources: list[set[int]] = []
        self.fail_on, self.gate = fail_on, gate

    def run(self, items: list[Item]) -> list:
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append([it.tokens for it in items])
        self.sources.append({it.data // 100 for it in items})  # which requests the batch served
        if any(it.data == self.fail_on for it in items):
            raise RuntimeError(f"cannot double {self.fail_on}")
        return [2 * it.data for it in items]


def run_batcher(batcher: Batcher, requests: list[tuple[object, list[Item]]]) -> list:
    async def main():
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(op, items) for op, items in requests),
                                        return_exceptions=True)
        finally:
            batcher.close(5)
    return asyncio.run(main())


def double_concurrently(op: Doubler, n_requests: int, seed: int) -> None:
    """`n_requests` requests of 1-8 inputs of 1-39 tokens, all at once through a batcher with a
    budget of 120 tokens; each must get back its own outputs, every input in exactly one batch."""
    rng = np.random.default_rng(seed)
    requests = [(op, [Item(int(rng.integers(1, 40)), 100 * r + i) for i in range(int(rng.integers(1, 9)))])
                for r in range(n_requests)]
    results = run_batcher(Batcher(lambda o, items: o.run(items), max_batch_tokens=120, max_wait=0.05), requests)
    for (_, items), out in zip(requests, results):
        assert out == [2 * it.data for it in items]
    assert sum(len(b) for b in op.batches) == sum(len(items) for _, items in requests)


def test_batcher_fills_token_budget_and_returns_each_request_its_outputs():
    op = Doubler()
    double_concurrently(op, 30, seed=0)
    assert max(len(s) for s in op.sources) >= 3  # requests shared batches
    for tokens in op.batches:
        assert sum(tokens) <= 120 or len(tokens) == 1  # a budget, never crossed by more than one input
        assert tokens == sorted(tokens, reverse=True)  # longest first


def test_batch_bounds_cut_sorted_inputs_within_the_budget():
    lengths = [50, 40, 30, 30, 10, 10, 10, 5, 5]
    assert batch_bounds(lengths, 100, padded=False) == [(0, 2), (2, 9)]  # sums 90 and 100 (the budget fits)
    assert batch_bounds(lengths, 99, padded=False) == [(0, 2), (2, 8), (8, 9)]  # 90, 95, 5
    assert batch_bounds(lengths, 100, padded=True) == [(0, 2), (2, 5), (5, 9)]  # 2x50, 3x30, 4x10
    assert batch_bounds([300, 20], 100, padded=True) == [(0, 1), (1, 2)]  # too long alone: still runs
    assert batch_bounds([], 100, padded=True) == []


class PaddedDoubler(Doubler):
    pads_batches = True


@pytest.mark.parametrize("op_class", [Doubler, PaddedDoubler])
def test_batcher_sorts_a_window_of_the_queue_into_batches_of_neighbouring_lengths(op_class):
    """Under load the batcher takes several budgets of queued inputs at once and cuts them, sorted,
    into batches; a padded model's budget counts padded tokens, so short inputs are not padded to
    the longest that arrived with them."""
    op = op_class()
    double_concurrently(op, 40, seed=1)
    padded_model = isinstance(op, PaddedDoubler)
    cost = (lambda b: len(b) * b[0]) if padded_model else sum
    assert all(cost(b) <= 120 or len(b) == 1 for b in op.batches)
    padded = sum(len(b) * b[0] for b in op.batches) / sum(sum(b) for b in op.batches)
    if padded_model:  # first come, first served, random lengths 1-39 pad about 2x
        assert padded < 1.35, (padded, op.batches)


def test_batcher_failure_reaches_only_the_requests_in_that_batch():
    op = Doubler(fail_on=13)
    batcher = Batcher(lambda o, items: o.run(items), max_batch_tokens=1, max_wait=0)  # one input per batch
    results = run_batcher(batcher, [(op, [Item(1, 1), Item(1, 13)]), (op, [Item(1, 5)])])
    assert isinstance(results[0], RuntimeError) and "cannot double 13" in str(results[0])
    assert results[1] == [10]


def test_batcher_refuses_past_its_queue_bound_and_drains_on_close():
    gate = threading.Event()
    op = Doubler(gate=gate)
    batcher = Batcher(lambda o, items: o.run(items), max_queue=1, max_wait=0)

    async def main():
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(op, [Item(1, 3)]))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await batcher.submit(op, [Item(1, 4)])
        closing = asyncio.get_running_loop().run_in_executor(None, batcher.close, 5)
        gate.set()  # the accepted request still gets its answer after close() began
        assert await first == [6]
        assert await closing is True

    asyncio.run(main())


def test_a_dead_batching_thread_answers_every_request_at_once():
    """Whatever kills the worker thread (here the OverflowError that `--max-wait-ms inf` caused
    in Condition.wait), the requests inside get BatcherStopped at once and so do later ones:
    before, they waited forever."""
    op = Doubler()
    batcher = Batcher(lambda o, items: o.run(items), max_wait=0.05)
    batcher.max_wait = float("inf")  # refused by the constructor (and by ServeConfig): forced here

    async def main():
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(op, [Item(1, 3)]))
        with pytest.raises(BatcherStopped, match="OverflowError"):
            await asyncio.wait_for(first, 30)
        with pytest.raises(BatcherStopped, match="the batching thread stopped"):
            await batcher.submit(op, [Item(1, 4)])
        assert not batcher.alive and batcher.in_flight == 0

    asyncio.run(main())
    with pytest.raises(ValueError, match="max_wait <= 3600"):
        Batcher(lambda o, items: o.run(items), max_wait=float("inf"))


# ---- model folders and server processes ---------------------------------------------------------

class ServerProcess:
    """`python -m bert_kit serve` on a free loopback port; its output is collected line by line."""

    def __init__(self, folder: Path, *flags: str):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "bert_kit", "serve", "--model", str(folder), "--port", "0",
                                      *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.url = ""
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            found = re.match(r"serving on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                self.ready.set()
        self.ready.set()

    def wait_ready(self, timeout: float = 300) -> "ServerProcess":  # 8 servers import torch at once
        if not self.ready.wait(timeout) or not self.url:
            self.stop()
            pytest.fail("server did not start:\n" + "\n".join(self.lines))
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer, minilm_path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    torch.manual_seed(0)
    return {
        "minilm": minilm_path,
        "cls": saved(root / "cls", BERTForSequenceClassification(TINY, num_labels=3), tokenizer,
                     ["negative", "neutral", "positive"], task="classification", max_length=64),
        "ner": saved(root / "ner", BERTForTokenClassification(TINY, num_labels=9), tokenizer, NER_LABELS,
                     task="token-classification", max_length=64),
        "qa": saved(root / "qa", BERTForQuestionAnswering(TINY), tokenizer, task="qa", max_length=64,
                    doc_stride=32, max_query_length=16),
        "sim": saved(root / "sim", BERTForSequenceClassification(TINY, num_labels=1), tokenizer, ["score"],
                     task="similarity", max_length=64, similarity_mode="cross-encoder"),
        "mlm": saved(root / "mlm", BERTForMaskedLM(TINY), tokenizer),  # no task: /embed and /fill-mask
    }


@pytest.fixture(scope="module")
def servers(folders):
    """Every server of this module, started at once (each start is mostly importing torch)."""
    for module in ("starlette", "uvicorn", "httpx"):
        pytest.importorskip(module, reason=f"bert-kit serve needs the [serve] extra and the tests httpx ({module})")
    specs = {"minilm": ("minilm", "--max-wait-ms", "10"), "cls": ("cls",), "ner": ("ner",), "qa": ("qa",),
             "sim": ("sim",), "mlm": ("mlm", "--max-inputs", "4", "--max-chars", "200"),
             "queue": ("cls", "--max-queue", "1", "--max-wait-ms", "1500"),
             "sigterm": ("cls", "--grace-period", "10", "--max-wait-ms", "20")}
    started = {name: ServerProcess(folders[spec[0]], *spec[1:]) for name, spec in specs.items()}
    try:
        yield {name: s.wait_ready() for name, s in started.items()}
    finally:
        for s in started.values():  # all stop at once
            if s.proc.poll() is None:
                s.proc.terminate()
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def http():
    httpx = pytest.importorskip("httpx")
    with httpx.Client(timeout=60) as client:
        yield client


def predicted(tmp_path: Path, folder: Path, name: str, text: str) -> list[dict]:
    """What `bert-kit predict` writes for an input file with `text`."""
    source, out = tmp_path / name, tmp_path / (name + ".out.jsonl")
    source.write_text(text)
    assert cli_main(["predict", "--model", str(folder), "--input", str(source), "--output", str(out),
                     "--device", "cpu"]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


# ---- every endpoint answers what the library computes ---------------------------------------------

def test_embed_equals_sentence_encoder(servers, http, minilm_path):
    from bert_kit.embeddings import SentenceEncoder

    url = servers["minilm"].url
    got = http.post(f"{url}/embed", json={"inputs": TEXTS})
    assert got.status_code == 200
    vectors = np.array(got.json()["embeddings"], dtype=np.float32)
    encoder = SentenceEncoder.from_pretrained(minilm_path, device="cpu")
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS), atol=1e-5, rtol=0)
    raw = np.array(http.post(f"{url}/embed", json={"inputs": TEXTS[:2], "normalize": False}).json()["embeddings"])
    plain = SentenceEncoder.from_pretrained(minilm_path, normalize=False, device="cpu")
    np.testing.assert_allclose(raw, plain.encode(TEXTS[:2]), atol=1e-5, rtol=0)
    assert abs(np.linalg.norm(raw[0]) - 1) > 0.1  # really not normalised


def test_classify_equals_predict_and_the_model(servers, http, folders, tokenizer, tmp_path):
    got = http.post(f"{servers['cls'].url}/classify", json={"inputs": TEXTS}).json()["predictions"]
    assert got == [{k: r[k] for k in ("label", "label_id", "probabilities")}
                   for r in predicted(tmp_path, folders["cls"], "texts.txt", "\n".join(TEXTS) + "\n")]
    model = BERTForSequenceClassification.from_pretrained(folders["cls"]).eval()
    enc = tokenizer(["How old are you?"], ["What is your age?"], max_length=64)
    with torch.no_grad():
        probs = model(**enc)[0].softmax(-1).tolist()
    pair = http.post(f"{servers['cls'].url}/classify", json={"inputs": [["How old are you?", "What is your age?"]]})
    assert list(pair.json()["predictions"][0]["probabilities"].values()) == pytest.approx(probs, abs=1e-6)


def test_tag_equals_predict(servers, http, folders, tmp_path):
    """Also on a sentence of 300 words, 5 times the folder's 64 tokens: every word is tagged."""
    sentences = ["John Smith lives in New York .", "EU rejects German call to boycott British lamb .",
                 " ".join(f"Paris{i} is in France ." for i in range(60))]
    got = http.post(f"{servers['ner'].url}/tag", json={"inputs": [sentences[0], sentences[1].split(), sentences[2]]})
    assert got.json()["predictions"] == predicted(tmp_path, folders["ner"], "ner.txt", "\n".join(sentences) + "\n")
    assert len(got.json()["predictions"][2]["tags"]) == 300


def test_answer_equals_predict(servers, http, folders, tmp_path):
    context = ("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
               "region in France. They were descended from Norse raiders and pirates from Denmark, Iceland and "
               "Norway who, under their leader Rollo, agreed to swear fealty to King Charles III.")  # > 1 window
    questions = [{"question": "Who was the leader of the Norse?", "context": context},
                 {"question": "Where is Normandy?", "context": context}]
    got = http.post(f"{servers['qa'].url}/answer", json={"inputs": questions}).json()["predictions"]
    lines = "".join(json.dumps({**q, "id": str(i)}) + "\n" for i, q in enumerate(questions))
    assert [g["answer"] for g in got] == [r["answer"] for r in predicted(tmp_path, folders["qa"], "q.jsonl", lines)]
    assert all(g["answer"] in context for g in got)


def test_similarity_equals_predict(servers, http, folders, tmp_path):
    pairs = [["A man is eating.", "Someone eats food."], ["A plane takes off.", "The cat sleeps."]]
    got = http.post(f"{servers['sim'].url}/similarity", json={"inputs": pairs}).json()["scores"]
    want = [r["score"] for r in predicted(tmp_path, folders["sim"], "pairs.txt",
                                          "".join(f"{a}\t{b}\n" for a, b in pairs))]
    assert got == pytest.approx(want, abs=1e-6)


def test_fill_mask_equals_fill_mask(servers, http, folders, tokenizer):
    from bert_kit.tasks.fill_mask import fill_mask, load_mlm_model

    texts = ["the [MASK] sat on the mat.", "paris is the [MASK] of [MASK] ."]
    got = http.post(f"{servers['mlm'].url}/fill-mask", json={"inputs": texts, "top_k": 3}).json()["predictions"]
    model = load_mlm_model(folders["mlm"])
    for text, answer in zip(texts, got):
        want = fill_mask(model, tokenizer, text, top_k=3)
        assert [[p["token"] for p in m] for m in answer] == [[p["token"] for p in m] for m in want]
        assert [p["score"] for m in answer for p in m] == pytest.approx([p["score"] for m in want for p in m],
                                                                        rel=1e-5, abs=0)
    assert http.post(f"{servers['mlm'].url}/embed", json={"inputs": ["one"]}).status_code == 200


def test_concurrent_callers_each_get_their_own_results(servers, http, minilm_path):
    from bert_kit.embeddings import SentenceEncoder

    httpx = pytest.importorskip("httpx")
    url = servers["minilm"].url
    words = "the quick brown fox jumps over a lazy dog near this old river bank today".split()
    texts = [" ".join(words[: 1 + (i * 7) % len(words)]) + f" number {i}" for i in range(64)]
    expected = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(texts)
    before = metric_values(http.get(f"{url}/metrics").text)
    failures: list[str] = []

    def caller(c: int) -> None:
        with httpx.Client(timeout=60) as client:
            for r in range(3):
                chosen = [(c * 5 + r * 11 + k * 3) % len(texts) for k in range(1 + (c + r) % 8)]
                got = client.post(f"{url}/embed", json={"inputs": [texts[i] for i in chosen]})
                vectors = np.array(got.json()["embeddings"], dtype=np.float32)
                if not np.allclose(vectors, expected[chosen], atol=1e-5, rtol=0):
                    failures.append(f"caller {c} request {r}")

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    after = metric_values(http.get(f"{url}/metrics").text)
    key = 'bert_kit_requests_total{path="/embed",status="200"}'
    batches = 'bert_kit_batch_size_count{path="/embed"}'
    assert after[key] - before.get(key, 0) == 48
    assert after[batches] - before.get(batches, 0) < 48  # requests shared model batches


# ---- errors, limits, queue bound ---------------------------------------------------------------

@pytest.mark.parametrize("body, status, field, words", [
    (b'{"inputs": ["a", ', 400, "body", "not valid JSON"),
    (b'[1, 2]', 422, "body", "must be an object, got array"),
    (b'{"texts": ["a"]}', 422, "inputs", "is required"),
    (b'{"inputs": "a"}', 422, "inputs", "must be an array"),
    (b'{"inputs": []}', 422, "inputs", "at least 1"),
    (b'{"inputs": ["ok", 7]}', 422, "inputs[1]", "must be a string, got integer"),
    (b'{"inputs": ["a [MASK]"], "top_k": "3"}', 422, "top_k", "must be an integer, got string"),
    (b'{"inputs": ["a [MASK]"], "top_k": 0}', 422, "top_k", "must be >= 1"),
    (b'{"inputs": ["a [MASK]"], "topk": 3}', 422, "topk", "not a known field"),
    (b'{"inputs": ["a [MASK] b", "no mask here"]}', 422, "inputs[1]", "has no [MASK] token"),
    (b'{"inputs": ["a", "b", "c", "d", "e"]}', 413, "inputs", "at most 4 per request"),
    (b'{"inputs": ["' + b"x" * 201 + b'"]}', 413, "inputs[0]", "201 characters; at most 200"),
    (b'{"inputs": ["' + b"x" * 80_000 + b'"]}', 413, "body", "bytes; the limit is"),
])
def test_bad_requests_get_a_status_and_a_message_naming_the_field(servers, http, body, status, field, words):
    got = http.post(f"{servers['mlm'].url}/fill-mask", content=body, headers={"Content-Type": "application/json"})
    assert got.status_code == status
    assert got.json()["field"] == field and words in got.json()["error"]


def test_wrong_task_fields_and_unknown_routes(servers, http):
    qa = http.post(f"{servers['qa'].url}/answer", json={"inputs": [{"question": "Who?", "context": 3}]})
    assert qa.status_code == 422 and qa.json()["field"] == "inputs[0].context"
    pair = http.post(f"{servers['cls'].url}/classify", json={"inputs": [["one", "two", "three"]]})
    assert pair.status_code == 422 and "a string or an array of 2 strings" in pair.json()["error"]
    missing = http.post(f"{servers['cls'].url}/tag", json={"inputs": ["a"]})  # a classifier has no /tag
    assert missing.status_code == 404 and "POST /tag" in missing.json()["error"]
    wrong = http.get(f"{servers['cls'].url}/classify")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


def test_past_the_queue_bound_503_with_retry_after(servers, http):
    url = servers["queue"].url  # max_queue 1 and a 1.5 s wait: the first request holds the only place
    first: list = []
    thread = threading.Thread(target=lambda: first.append(http.post(f"{url}/classify", json={"inputs": ["a"]})))
    thread.start()
    deadline = time.time() + 60  # only a hang fails
    while metric_values(http.get(f"{url}/metrics").text).get("bert_kit_requests_in_flight") != 1:
        assert time.time() < deadline, "the first request never reached the batcher"
        time.sleep(0.02)
    busy = http.post(f"{url}/classify", json={"inputs": ["b"]})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1" and "busy" in busy.json()["error"]
    thread.join()
    assert first[0].status_code == 200
    assert http.post(f"{url}/classify", json={"inputs": ["c"]}).status_code == 200  # room again


# ---- health, info, metrics, OpenAPI -------------------------------------------------------------

def metric_values(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition, keyed by name{labels} as printed."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def test_health_info_and_prometheus_metrics(servers, http):
    url = servers["ner"].url
    assert http.get(f"{url}/health").json() == {"status": "ok"}
    info = http.get(f"{url}/info").json()
    assert info["task"] == "token-classification" and info["labels"] == NER_LABELS
    assert info["endpoints"] == ["/embed", "/tag"] and info["limits"]["max_inputs_per_request"] == 64
    for _ in range(3):
        http.post(f"{url}/tag", json={"inputs": ["a b c", "d e"]})
    http.post(f"{url}/tag", json={"inputs": [5]})
    got = http.get(f"{url}/metrics")
    assert got.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = metric_values(got.text)
    assert values['bert_kit_requests_total{path="/tag",status="200"}'] >= 3
    assert values['bert_kit_requests_total{path="/tag",status="422"}'] >= 1
    assert values['bert_kit_inputs_total{path="/tag"}'] >= 6
    assert values["bert_kit_queue_depth"] == 0 and values["bert_kit_requests_in_flight"] == 0
    families = {}
    parser = pytest.importorskip("prometheus_client.parser")
    for family in parser.text_string_to_metric_families(got.text):
        families[family.name] = family
    assert families["bert_kit_request_duration_seconds"].type == "histogram"
    for sample_family in ("bert_kit_request_duration_seconds", "bert_kit_batch_size", "bert_kit_batch_tokens"):
        samples = families[sample_family].samples
        buckets = [s.value for s in samples if s.name.endswith("_bucket") and s.labels.get("path") == "/tag"]
        count = next(s.value for s in samples if s.name.endswith("_count") and s.labels.get("path") == "/tag")
        assert buckets == sorted(buckets) and buckets[-1] == count > 0  # cumulative, +Inf is the count


def test_openapi_describes_every_endpoint_and_its_examples_work(servers, http):
    for name in ("cls", "ner", "qa", "sim", "mlm"):
        url = servers[name].url
        spec = http.get(f"{url}/openapi.json").json()
        assert spec["openapi"].startswith("3.1")
        posts = {path: item["post"] for path, item in spec["paths"].items() if "post" in item}
        assert set(posts) == set(http.get(f"{url}/info").json()["endpoints"])
        assert {"/health", "/info", "/metrics", "/openapi.json"} <= set(spec["paths"])
        for path, op in posts.items():
            body = op["requestBody"]["content"]["application/json"]
            assert body["schema"]["properties"]["inputs"]["maxItems"] > 0
            assert {"200", "400", "413", "422", "503"} <= set(op["responses"])
            answer = http.post(f"{url}{path}", json=body["example"])  # the published example is accepted
            assert answer.status_code == 200, (path, answer.text)
            key = next(iter(op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]))
            assert len(answer.json()[key]) == len(body["example"]["inputs"])


# ---- shutdown ---------------------------------------------------------------------------------

def test_sigterm_under_load_answers_every_accepted_request(servers):
    httpx = pytest.importorskip("httpx")
    server = servers["sigterm"]  # grace period 10 s
    outcomes: list[str] = []
    stop = time.time() + 20  # the load is bounded even if the server never stops

    def client(c: int) -> None:
        with httpx.Client(timeout=30) as session:
            while time.time() < stop:
                try:
                    got = session.post(f"{server.url}/classify", json={"inputs": TEXTS[: 1 + c % 6]})
                    outcomes.append(str(got.status_code))
                except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                    outcomes.append("not accepted")  # listener closed, or closed before reading the request
                    return

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    deadline = time.time() + 15  # under load: answers arriving (however slowly the machine runs)
    while len(outcomes) <= 10 and time.time() < deadline:
        time.sleep(0.05)
    during = len(outcomes)
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(60)  # a server that never exits fails here; a busy machine may take its time
    for t in threads:
        t.join()
    stopped = next(line for line in server.lines if line.startswith("stopped:"))
    answered, accepted = map(int, re.match(r"stopped: answered (\d+) of (\d+)", stopped).groups())
    assert during > 10  # it was under load
    assert code == 0
    assert set(outcomes) <= {"200", "not accepted"}
    assert answered == accepted == outcomes.count("200")


# ---- the command line -------------------------------------------------------------------------

def test_cli_errors_without_the_extra_or_the_folder(monkeypatch, capsys, folders, tmp_path):
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "starlette", None)  # as if the [serve] extra were not installed
        assert cli_main(["serve", "--model", str(folders["cls"])]) == 1
    assert "pip install 'bert-kit[serve]'" in capsys.readouterr().err
    for module in ("starlette", "uvicorn"):
        pytest.importorskip(module)
    assert cli_main(["serve", "--model", str(tmp_path / "nowhere"), "--port", "0"]) == 2
    assert "model folder not found" in capsys.readouterr().err


def test_exported_onnx_folders_serve_the_same_answers(folders, http, tmp_path, minilm_path):
    """A folder written by `bert-kit export` serves too (ONNX Runtime on the CPU): an encoder's
    /embed equals the PyTorch encoder's within 1e-4, a classifier's /classify equals `predict`."""
    for module in ("starlette", "uvicorn", "onnx", "onnxruntime"):
        pytest.importorskip(module, reason=f"needs the [serve] and [onnx] extras ({module})")
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.onnx_export import export_onnx

    encoder, classifier = tmp_path / "minilm-onnx", tmp_path / "cls-onnx"
    export_onnx(minilm_path, encoder)
    export_onnx(folders["cls"], classifier)
    started = [ServerProcess(encoder), ServerProcess(classifier)]
    try:
        emb, cls = (s.wait_ready() for s in started)
        info = http.get(f"{emb.url}/info").json()
        assert info["backend"] == "onnx"
        vectors = np.array(http.post(f"{emb.url}/embed", json={"inputs": TEXTS}).json()["embeddings"])
        torch_side = SentenceEncoder.from_pretrained(minilm_path, device="cpu").encode(TEXTS)
        np.testing.assert_allclose(vectors, torch_side, atol=1e-4, rtol=0)
        texts = ["a gripping film", "dull and long"]
        answers = http.post(f"{cls.url}/classify", json={"inputs": texts}).json()["predictions"]
        expected = predicted(tmp_path, classifier, "cls.txt", "\n".join(texts) + "\n")
        assert len(answers) == len(expected) == 2
        for got, want in zip(answers, expected):
            assert got["label"] == want["label"]
            for name, p in want["probabilities"].items():
                assert got["probabilities"][name] == pytest.approx(p, abs=1e-5)
    finally:
        for s in started:
            s.stop()
