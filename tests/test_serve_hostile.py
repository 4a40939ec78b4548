"""`bert-kit serve` against hostile clients and broken models: every client mistake is a 4xx naming
the field, no request inside the limits stalls the server, stalled connections are dropped, a
model that computes NaN is a 500 saying so, and SIGTERM ends the process within its grace period
even with a stuck batch or a stuck request.

Real server processes on loopback (as tests/test_serve.py), started all at once; the "stuck" one
runs `serve` in a small script that first makes two steps hang on a given input. No assert here
is on the clock: waits have generous timeouts that only a server that never answers (the
behaviour before these fixes) runs into.

Run: .venv/bin/python -m pytest tests/test_serve_hostile.py -q
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_kit.heads import BERTForMaskedLM, BERTForSequenceClassification
from bert_kit.serving.batcher import Item
from bert_kit.serving.schema import InputError
from tests.tasks.test_inference import saved
from tests.test_serve import REPO, TINY, ServerProcess, metric_values

# one worker starts the module's servers, first (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("serve_hostile"), pytest.mark.slow]

# `serve` (grace period 2 s) where computing the input "stuck run" never ends, and nor does
# tokenizing the input "stuck prepare"
STUCK_SERVE = """
import sys, threading
from bert_kit.serving import operations, server
real_prepare, real_run = operations.Classify.prepare, operations.Classify.run
def prepare(self, inputs, options):
    if inputs == ["stuck prepare"]:
        threading.Event().wait()
    return real_prepare(self, inputs, options)
def run(self, items):
    if any(it.data["input_ids"][1:-1] == self.tokenizer.encode("stuck run")[1:-1] for it in items):
        threading.Event().wait()
    return real_run(self, items)
operations.Classify.prepare, operations.Classify.run = prepare, run
sys.exit(server.serve(server.ServeConfig(model=sys.argv[1], port=0, grace_period=2)))
"""


class StuckServer(ServerProcess):
    def __init__(self, folder: Path):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", STUCK_SERVE, str(folder)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines, self.url, self.ready = [], "", threading.Event()
        threading.Thread(target=self._read, daemon=True).start()


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path) -> dict[str, Path]:
    from bert_kit.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(minilm_path)
    root = tmp_path_factory.mktemp("hostile")
    torch.manual_seed(0)
    classifier = BERTForSequenceClassification(TINY, num_labels=3)
    with torch.no_grad():  # finite weights, but "zebra" makes the embedding LayerNorm overflow to NaN
        classifier.bert.embeddings.word_embeddings.weight[tokenizer.convert_tokens_to_ids("zebra")] = 1e20
    return {"cls": saved(root / "cls", classifier, tokenizer, ["negative", "neutral", "positive"],
                         task="classification", max_length=64),
            "mlm": saved(root / "mlm", BERTForMaskedLM(TINY), tokenizer)}


@pytest.fixture(scope="module")
def servers(folders):
    for module in ("starlette", "uvicorn", "httpx"):
        pytest.importorskip(module, reason=f"bert-kit serve needs the [serve] extra and the tests httpx ({module})")
    started = {"cls": ServerProcess(folders["cls"], "--read-timeout", "1"), "mlm": ServerProcess(folders["mlm"]),
               "stuck": StuckServer(folders["cls"])}
    try:
        yield {name: s.wait_ready() for name, s in started.items()}
    finally:
        for s in started.values():
            if s.proc.poll() is None:
                s.proc.terminate()
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def http():
    httpx = pytest.importorskip("httpx")
    with httpx.Client(timeout=120) as client:
        yield client


# ---- client mistakes are 4xx ---------------------------------------------------------------------

HOSTILE = [  # (body, status, field, words)
    (b'{"inputs": ["\\ud800"]}', 422, "inputs[0]", "lone surrogate"),
    (b'{"inputs": ["ok", "ok", "ok", ["a", "b\\udc00"]]}', 422, "inputs[3][1]", "lone surrogate '\\udc00'"),
    (b'{"inputs": ["ok"], "\\ud800": 1}', 422, "\\ud800", "not a known field"),
    (b'{"inputs": [' + b"7" * 5000 + b']}', 400, "body", "more than 4300 digits"),
    (b"[" * 50_000 + b"]" * 50_000, 400, "body", "nested too deeply"),
    (b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "body", "nested too deeply"),
    (b'{"inputs": ["ok"], "x": ' + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}", 422, "x", "not a known field"),
    (b'{"inputs": ' + b"[" * 500 + b'"a"' + b"]" * 500 + b"}", 422, "inputs[0]", "must be a string or an array"),
    (b'{"inputs": [NaN]}', 400, "body", "NaN is not a JSON value"),
    (b'{"inputs": [Infinity]}', 400, "body", "Infinity is not a JSON value"),
    (b'{"inputs": [1e999]}', 422, "inputs[0]", "got number"),
    (b'{"inputs": ["ok"]}\xff', 400, "body", "not valid JSON"),
    (b"\xfe\xff\x00{", 400, "body", "not valid JSON"),
    (b'{"inputs": [["a", "b"], ["c"]]}', 422, "inputs[1]", "array of 2 strings"),
    (b'{"inputs": [{"text": "a"}]}', 422, "inputs[0]", "got object"),
    (b'{"inputs": [null]}', 422, "inputs[0]", "got null"),
    (b'{"inputs": [true]}', 422, "inputs[0]", "got boolean"),
    (b'{"inputs": "' + b"a" * 100 + b'"}', 422, "inputs", "must be an array"),
]


@pytest.mark.parametrize("body, status, field, words", HOSTILE)
def test_hostile_bodies_are_4xx_naming_the_field(servers, http, body, status, field, words):
    """A lone surrogate, a 5,000-digit number and 50k nested arrays were 500s with a traceback."""
    got = http.post(f"{servers['cls'].url}/classify", content=body, headers={"Content-Type": "application/json"})
    assert got.status_code == status, got.text
    assert got.json()["field"] == field and words in got.json()["error"]


def test_no_hostile_body_was_a_server_error(servers, http):
    for body, *_ in HOSTILE:
        http.post(f"{servers['cls'].url}/classify", content=body)
    values = metric_values(http.get(f"{servers['cls'].url}/metrics").text)
    assert not [k for k, v in values.items() if 'status="500"' in k and v > 0]
    assert http.get(f"{servers['cls'].url}/health").json() == {"status": "ok"}


# JSON-like values, with the strings and keys that break naive handling
hostile_text = st.sampled_from(["", "\ud800", "a\udfffb", "[MASK]", "\x00", "é" * 3, "中文", "x" * 50]) | st.text()
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | hostile_text,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
                           max_leaves=30)
bodies = json_values | st.fixed_dictionaries({"inputs": json_values}) | st.fixed_dictionaries(
    {"inputs": st.lists(json_values, max_size=4)}, optional={"normalize": json_values, "top_k": json_values})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_property_the_checks_raise_only_input_errors(body):
    """Parsing and checking a body of any shape (through every operation's schema) either gives
    inputs and options or an InputError: 400, 413 or 422, whose message encodes as UTF-8."""
    from bert_kit.serving.app import Limits, error, parse_json, validate
    from bert_kit.serving.operations import Answer, Classify, Embed, FillMask, Similarity, Tag

    for op_class in (Embed, Classify, Tag, Answer, Similarity, FillMask):
        op = object.__new__(op_class)  # the schemas only: no model
        try:
            validate(op, body, Limits(max_inputs=3, max_chars=40))
        except InputError as e:
            assert e.status in (400, 413, 422)
        for raw in (json.dumps(body).encode(), json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")):
            try:
                validate(op, parse_json(raw), Limits(max_inputs=3, max_chars=40))
            except InputError as e:
                assert e.status in (400, 413, 422)
                answer = error(e.status, str(e), e.field)  # what the client gets: UTF-8 JSON
                assert json.loads(answer.body.decode("utf-8"))["field"] == e.field.encode(
                    "utf-8", "backslashreplace").decode("utf-8")


# ---- nothing inside the limits stalls the server ---------------------------------------------------

def test_long_pairs_are_answered_and_health_answers_meanwhile(servers, http):
    """Pairs of 20,000-character texts (the limit): pair truncation inside the tokenizer grew with
    the product of the lengths (one pair of 5,000 words took 7 s) and ran on the event loop, so
    /health waited too; 64 such pairs took 15 GB and no answer in 120 s."""
    url = servers["cls"].url
    pair = ["word " * 4000, "other words " * 1666]
    answer: list = []
    thread = threading.Thread(target=lambda: answer.append(http.post(f"{url}/classify", json={"inputs": [pair] * 8})))
    thread.start()
    health = [http.get(f"{url}/health", timeout=30).status_code for _ in range(3)]
    thread.join()
    assert health == [200] * 3
    assert answer[0].status_code == 200 and len(answer[0].json()["predictions"]) == 8


def test_fill_mask_bounds_masks_per_input_and_per_request(servers, http):
    """64 inputs of 2,800 masks with top_k=100 took 96 s and returned 70 MB."""
    url = servers["mlm"].url
    many = http.post(f"{url}/fill-mask", json={"inputs": ["[MASK] " * 2800], "top_k": 100})
    assert many.status_code == 413 and many.json()["field"] == "inputs[0]" and "at most 16" in many.json()["error"]
    spread = http.post(f"{url}/fill-mask", json={"inputs": ["a [MASK] b [MASK] c"] * 40})
    assert spread.status_code == 413 and spread.json()["field"] == "inputs"
    assert "80 [MASK] tokens; at most 64 per request" in spread.json()["error"]
    cut = http.post(f"{url}/fill-mask", json={"inputs": ["a [MASK] " + "word " * 300 + "[MASK]"]})
    assert cut.status_code == 422 and "1 [MASK] token(s) past its first 256 tokens" in cut.json()["error"]
    k = http.post(f"{url}/fill-mask", json={"inputs": ["a [MASK] b"], "top_k": 101})
    assert k.status_code == 422 and k.json()["field"] == "top_k"
    assert http.post(f"{url}/fill-mask", json={"inputs": ["a [MASK] b"] * 64, "top_k": 100}).status_code == 200
    limits = http.get(f"{url}/info").json()["limits"]
    assert (limits["max_masks_per_input"], limits["max_masks_per_request"], limits["max_top_k"]) == (16, 64, 100)
    post = http.get(f"{url}/openapi.json").json()["paths"]["/fill-mask"]["post"]
    assert "16 masks per input, 64 masks per request" in post["responses"]["413"]["description"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["properties"]["top_k"]["maximum"] == 100


# ---- stalled clients --------------------------------------------------------------------------------

def raw_connection(url: str) -> socket.socket:
    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(60)  # the server (read timeout 1 s) must act long before this
    return sock


def read_reply(sock: socket.socket) -> tuple[bytes, bytes]:
    """(status line and headers, body) of one HTTP response."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4000)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length:
        body += sock.recv(4000)
    return head, body


def test_stalled_connections_are_dropped_and_a_stalled_body_is_a_408(servers):
    url = servers["cls"].url
    with raw_connection(url) as silent:  # connects and sends nothing
        assert silent.recv(1000) == b""
    with raw_connection(url) as partial:  # half a request head, then nothing
        partial.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\n")
        assert partial.recv(1000) == b""
    with raw_connection(url) as stalled:  # the head, then 10 of 100 body bytes
        stalled.sendall(b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100\r\n\r\n{\"inputs\":")
        head, body = read_reply(stalled)
        assert head.startswith(b"HTTP/1.1 408 ")
        assert json.loads(body) == {
            "error": "body did not arrive within 1 s (the server's read timeout)", "field": "body"}
    with raw_connection(url) as trickle:  # the head a byte at a time, never all of it
        trickle.sendall(b"POST /classify HTTP/1.1\r\n")
        closed = False
        for _ in range(600):  # 60 s at most
            try:
                trickle.sendall(b"x")
            except OSError:  # reset by the server
                closed = True
                break
            if select.select([trickle], [], [], 0.1)[0] and trickle.recv(1000) == b"":
                closed = True
                break
        assert closed
    with raw_connection(url) as idle:  # a whole request, then an idle keep-alive connection
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(idle)[0].startswith(b"HTTP/1.1 200 ")
        assert idle.recv(1000) == b""


def test_a_client_that_leaves_with_pipelined_requests_is_counted_quietly(servers, http):
    """A client that sends requests back to back on one connection and closes it before the
    answers: uvicorn wrote them to the closed connection and logged "Exception in ASGI
    application" with a traceback per request. Now each answer is dropped quietly and counted."""
    server = servers["cls"]
    before = len(server.lines)
    body = json.dumps({"inputs": ["a fine film " * 20] * 8}).encode()
    request = (b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    dropped = 0.0
    for attempt in range(30):  # until an answer met a closed connection (the first attempt, mostly)
        with raw_connection(server.url) as sock:
            sock.sendall(request * 10)
            threading.Event().wait(0.02 * (attempt % 5))
        threading.Event().wait(0.5)
        dropped = metric_values(http.get(f"{server.url}/metrics").text)["bert_kit_client_disconnects_total"]
        if dropped:
            break
    assert dropped >= 1
    assert http.get(f"{server.url}/health").status_code == 200
    new_lines = server.lines[before:]
    assert not [line for line in new_lines if "Traceback" in line or "Exception in ASGI" in line
                or "without completing response" in line], new_lines

# ---- broken models, broken threads, SIGTERM --------------------------------------------------------

def test_a_model_output_with_nan_is_a_500_saying_so(servers, http):
    """Finite weights whose sum overflows for one word: that input's logits and states are NaN.
    The answer was `NaN` in the JSON (invalid) or a label read from NaN logits."""
    url = servers["cls"].url
    fine = http.post(f"{url}/classify", json={"inputs": ["a horse"]})
    assert fine.status_code == 200 and json.loads(fine.text)  # valid JSON
    for path in ("/classify", "/embed"):
        got = http.post(f"{url}{path}", json={"inputs": ["a zebra"]})
        assert got.status_code == 500
        assert "the model produced non-finite values (NaN or inf)" in got.json()["error"]
    assert http.post(f"{url}/classify", json={"inputs": ["a horse"]}).json() == fine.json()  # still serving
    assert any("non-finite values" in line for line in servers["cls"].lines)


def test_a_dead_batching_thread_is_503_at_once_and_health_says_so():
    """The app around a batcher whose thread dies at its first batch (in this process)."""
    from starlette.testclient import TestClient

    from bert_kit.serving.app import create_app
    from bert_kit.serving.batcher import Batcher
    from bert_kit.serving.operations import Operation

    class Echo(Operation):
        path = "/echo"

        def prepare(self, inputs: list, options: dict) -> list:
            return [Item(1, x) for x in inputs]

    def broken(op, items):
        raise SystemExit("the worker broke")  # not even an Exception: the thread itself ends

    with TestClient(create_app({"model": "x"}, [Echo()], Batcher(broken, max_wait=0))) as client:
        first = client.post("/echo", json={"inputs": ["a", "b"]})
        assert first.status_code == 503 and "the batching thread stopped: SystemExit: the worker broke" in \
            first.json()["error"]
        assert client.post("/echo", json={"inputs": ["c"]}).status_code == 503
        health = client.get("/health")
        assert health.status_code == 503 and "the worker broke" in health.json()["error"]


def test_sigterm_exits_within_the_grace_period_with_stuck_requests(servers):
    """A batch that never ends, and a request whose tokenizing never ends (before: on the event
    loop, so SIGTERM was never even handled, and the process had to be killed): the process stops
    after its grace period (2 s), tells the waiting clients so (503), and exits 1 (requests were cut)."""
    httpx = pytest.importorskip("httpx")
    server = servers["stuck"]
    replies: list = []

    def send(text: str) -> None:
        with httpx.Client(timeout=120) as client:
            replies.append(client.post(f"{server.url}/classify", json={"inputs": [text]}))

    threads = []
    with httpx.Client(timeout=60) as client:
        for text, pending in (("stuck run", 1), ("stuck prepare", 2)):  # the batch first: tokenizing is one thread
            threads.append(threading.Thread(target=send, args=(text,)))
            threads[-1].start()
            for _ in range(600):  # until the request is inside the server
                if metric_values(client.get(f"{server.url}/metrics").text)["bert_kit_requests_pending"] == pending:
                    break
                threading.Event().wait(0.1)
        assert client.get(f"{server.url}/health").status_code == 200  # stuck work holds up no other answer
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(90)  # the grace period is 2 s: 90 s only to fail rather than hang
    for t in threads:
        t.join(60)
    assert code == 1
    assert any(re.match(r"stopped: answered 0 of 2 accepted", line) for line in server.lines)
    assert [r.status_code for r in replies] == [503, 503]
    assert all("grace period ran out" in r.json()["error"] for r in replies)


def test_a_model_with_nan_on_every_input_is_refused_at_start(folders, tmp_path):
    """Warm-up runs each endpoint's example: a model that answers nothing but NaN is not served."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(folders["cls"], tmp_path / "all-nan")
    weights = load_file(folder / "model.safetensors")
    scale = "bert.embeddings.LayerNorm.weight"  # finite; the attention scores overflow
    weights[scale] = torch.full_like(weights[scale], 1e20)
    save_file(weights, folder / "model.safetensors")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "bert_kit", "serve", "--model", str(folder), "--port", "0"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "serving on" not in done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "POST /embed on its example" in done.stderr
    assert "the model produced non-finite values (NaN or inf)" in done.stderr


def test_a_word_list_counts_its_characters_together():
    """A sentence sent to /tag as a list of words is as long as the same sentence sent as a text."""
    from bert_kit.serving.app import Limits, validate
    from bert_kit.serving.operations import Tag

    op = object.__new__(Tag)  # the schema only
    assert validate(op, {"inputs": [["ab"] * 13]}, Limits(max_chars=40))[0] == [["ab"] * 13]  # 38 characters
    with pytest.raises(InputError, match=r"inputs\[0\] has 41 characters; at most 40") as caught:
        validate(op, {"inputs": [["ab"] * 14]}, Limits(max_chars=40))
    assert caught.value.status == 413
