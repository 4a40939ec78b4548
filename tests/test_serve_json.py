"""The server's JSON (`bert_kit.serving.jsonio`): orjson and the standard library give the same values.

An embedding must leave as the model's float32 values, no rounding: both writers are read back
here, into float32, bit for bit equal to the array written (including subnormals, the largest
float32 and -0.0); both refuse NaN and inf. Reading: orjson's refusals are read again by the
standard library, so a body gets the same value or the same error either way.

Run: .venv/bin/python -m pytest tests/test_serve_json.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_kit.serving import jsonio

orjson = pytest.importorskip("orjson", reason="the fast writer needs orjson (the [serve] extra)")


def float32_edges() -> np.ndarray:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((200, 384)).astype(np.float32)
    values /= np.linalg.norm(values, axis=1, keepdims=True)  # unit vectors, as /embed answers
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 1e-5, 0.1,
                      1 / 3, 123456.79, 2.0 ** -126, 0.30000001], dtype=np.float32)
    values[0, : len(edges)] = edges
    values[1] = rng.uniform(-1e-3, 1e-3, 384).astype(np.float32)  # small values: exponent notation
    return values


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
def test_embeddings_read_back_as_the_model_float32_values(fast):
    vectors = float32_edges()
    body = jsonio.dumps({"embeddings": vectors}, fast=fast)
    for reader in (json.loads, orjson.loads):
        back = np.array(reader(body)["embeddings"], dtype=np.float32)
        assert back.shape == vectors.shape
        assert np.array_equal(back.view(np.uint32), vectors.view(np.uint32))  # every bit, -0.0 included


def test_both_writers_give_the_same_values_and_orjson_the_shorter_text():
    vectors = float32_edges()
    fast, plain = jsonio.dumps({"embeddings": vectors}, fast=True), jsonio.dumps({"embeddings": vectors}, fast=False)
    as32 = [np.array(json.loads(b)["embeddings"], dtype=np.float32) for b in (fast, plain)]
    assert np.array_equal(as32[0].view(np.uint32), as32[1].view(np.uint32))
    assert plain == json.dumps({"embeddings": vectors.tolist()}, separators=(",", ":")).encode()  # as before
    assert len(fast) < 0.65 * len(plain)  # float32's shortest decimals, not float64's
    records = {"predictions": [{"label": "pos", "label_id": 1, "probabilities": {"neg": 0.25, "pos": 0.75}}],
               "text": "café \u4e2d\u6587"}
    assert json.loads(jsonio.dumps(records, fast=True)) == json.loads(jsonio.dumps(records, fast=False)) == records


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "stdlib"])
@pytest.mark.parametrize("content", [
    {"embeddings": np.array([[0.5, np.nan]], dtype=np.float32)},
    {"embeddings": np.array([[np.inf]], dtype=np.float32)},
    {"scores": [0.5, float("-inf")]},
    {"predictions": [{"probabilities": {"a": float("nan")}}]},
])
def test_nan_and_inf_are_refused_never_written(content, fast):
    with pytest.raises(jsonio.NotFinite):
        jsonio.dumps(content, fast=fast)


def test_what_orjson_cannot_write_falls_back_to_the_standard_library():
    big = {"n": 2 ** 70, "v": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]}  # > 64 bits; not contiguous
    assert json.loads(jsonio.dumps(big, fast=True)) == {"n": 2 ** 70, "v": [[0.0, 2.0], [3.0, 5.0]]}


BODIES = [b'{"inputs": ["a", "b"], "normalize": false}', b'{"inputs": ["\\ud800"]}', b'{"inputs": [1e999]}',
          b'{"a": 1, "a": 2}', b'[' * 2000 + b']' * 2000, b'\xef\xbb\xbf{"inputs": ["bom"]}',
          b'{"inputs": ["ok"]}\xff', b'{"inputs": [NaN]}', b'[' + b'7' * 5000 + b']', b'{"inputs": ["caf\xc3\xa9"]}']


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_reading_gives_the_standard_library_value_or_error(body):
    def read(fast: bool):
        try:
            return "ok", jsonio.loads(body, fast=fast)
        except (ValueError, RecursionError) as e:
            return "error", type(e).__name__, str(e)

    assert read(True) == read(False)
