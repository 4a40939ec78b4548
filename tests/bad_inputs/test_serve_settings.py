"""`bert-kit serve` settings: every flag checked where `ServeConfig` is defined (a one-line usage
error, exit 2, before anything loads), max_length against the model's positions when it loads,
and the defaults taken from the model folder, for every backend.

Before: `--max-wait-ms inf` was accepted and the first request killed the batching thread;
`--max-length 0` and `--max-batch-tokens 0` fell back to defaults; `--grace-period nan` acted
as 0; `serve --model runs/demo/pretrain` (64 positions, no task) failed with max_length=256.
"""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.mark.parametrize("flags, needle", [
    (["--max-wait-ms", "inf"], "max_wait_ms=inf is out of range: expected a finite number in [0, 60000]"),
    (["--max-wait-ms", "nan"], "max_wait_ms=nan"),
    (["--max-wait-ms", "1e300"], "max_wait_ms=1e+300 is out of range"),
    (["--max-length", "0"], "max_length=0 is out of range: expected an integer >= 3"),
    (["--max-batch-tokens", "0"], "max_batch_tokens=0 is out of range"),
    (["--grace-period", "nan"], "grace_period=nan is out of range"),
    (["--grace-period", "-1"], "grace_period=-1.0 is out of range"),
    (["--read-timeout", "0"], "read_timeout=0.0 is out of range: expected a finite number in (0, 86400]"),
    (["--read-timeout", "inf"], "read_timeout=inf"),
    (["--port", "65536"], "port=65536 is out of range: expected an integer in [0, 65535]"),
    (["--port", "-1"], "port=-1 is out of range"),
    (["--max-queue", "0"], "max_queue=0 is out of range"),
    (["--max-inputs", "0"], "max_inputs=0 is out of range"),
    (["--max-chars", "-5"], "max_chars=-5 is out of range"),
    (["--device", "gpu"], "device='gpu' is not a device"),
])
def test_bad_serve_settings_are_usage_errors(cli, assets, flags, needle):
    cli("serve", "--model", assets.classifier, *flags).one_line_error(needle, code=2)


def test_max_length_past_the_model_positions_is_a_usage_error(cli, assets):
    for folder in (assets.classifier, assets.mlm):  # a task folder and a plain one (64 positions)
        cli("serve", "--model", folder, "--max-length", "65").one_line_error(
            "max_length=65 is out of range: expected an integer in [3, 64]", "64 positions", code=2)


def test_the_default_max_length_comes_from_the_model_folder(assets, single_thread):
    """A pretraining run (64 positions, no task) serves at 64 tokens; a fine-tuned folder at the
    length it was fine-tuned with (32); both /embed and /fill-mask or the task."""
    from bert_kit.serving.operations import BACKENDS

    info, ops = BACKENDS["torch"](assets.run, "cpu", "auto", None)
    assert info["max_length"] == 64 and [op.path for op in ops] == ["/embed", "/fill-mask"]
    assert ops[0].encoder.max_length == ops[1].max_length == 64
    info, ops = BACKENDS["torch"](assets.classifier, "cpu", "auto", None)
    assert info["max_length"] == 32 and [op.path for op in ops] == ["/embed", "/classify"]
    info, _ = BACKENDS["torch"](assets.mlm, "cpu", "auto", 40)
    assert info["max_length"] == 40


def test_the_default_max_length_of_an_exported_folder(assets, tmp_path, single_thread):
    pytest.importorskip("onnxruntime")
    from bert_kit.onnx_export import export_onnx
    from bert_kit.serving.operations import BACKENDS

    export_onnx(assets.classifier, tmp_path / "onnx")
    info, ops = BACKENDS["torch"](tmp_path / "onnx", "cpu", "auto", None)
    assert info["backend"] == "onnx" and info["max_length"] == 32 and "/classify" in [op.path for op in ops]
    export_onnx(assets.encoder, tmp_path / "onnx-encoder")  # no metadata: its 64 positions
    info, ops = BACKENDS["torch"](tmp_path / "onnx-encoder", "cpu", "auto", None)
    assert info["max_length"] == 64 and [op.path for op in ops] == ["/embed"]
