"""Bad input, long and endless inputs: a line of many megabytes without a space, /dev/zero as an
input, corpus or settings file. Each costs what max_length costs, or ends with a one-line error:
never memory or time that grows with the input.

The readers read a chunk at a time (`bert_kit.data.read_text`): a line past MAX_LINE characters
keeps its first MAX_LINE, with a warning naming it, and a NUL byte is a binary file at once.
The tokenizer squeezes what is left (tests/test_long_texts.py).
Run: .venv/bin/python -m pytest tests/bad_inputs/test_long_inputs.py -q
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest

from bert_kit.data import MAX_LINE, read_text


def test_a_line_past_max_line_is_cut_in_bounded_memory(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("first\n" + "x" * 30_000_000 + "\nlast\n" + "y" * (MAX_LINE + 1))
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            text = read_text(path, "input file")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [len(line) for line in text.split("\n")] == [5, MAX_LINE, 4, MAX_LINE]
    assert peak < 30e6  # bytes: chunks of 8 MB and the lines kept, never the 30 MB line
    assert [str(w.message) for w in caught] == [
        f"{path}: 2 line(s) longer than 1,000,000 characters were cut to their first 1,000,000 (line 2, 4)"]


def test_lines_within_max_line_read_as_before(tmp_path, monkeypatch):
    """Chunks of a few bytes: every line end, multi-byte character, CRLF and bad byte falls on
    a chunk's edge somewhere; the text and the error are those of a whole read."""
    import bert_kit.data as data

    path = tmp_path / "in.txt"
    text = "\ufeffh\u00e9llo\r\nw\u00f6rld \u4e2d\u6587\n\n" + "z" * 50 + "\nend"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(data, "READ_BYTES", 3)
    assert read_text(path) == text[1:]  # the byte-order mark dropped
    path.write_bytes(text.encode() + b"\nabc\xffd\n")
    with pytest.raises(ValueError, match=r"in.txt:6: not UTF-8 text \(byte 0xff at column 4\)"):
        read_text(path)
    assert read_text(tmp_path / "in.txt", max_line=None, encoding="latin-1").endswith("abc\xffd\n")


@pytest.mark.parametrize("command", ["embed", "predict"])
def test_dev_zero_as_input_is_a_binary_file_at_once(cli, assets, command):
    model = assets.encoder if command == "embed" else assets.classifier
    out = cli(command, "--model", model, "--input", "/dev/zero", "--output", "o.out", "--device", "cpu")
    out.one_line_error("/dev/zero:1: NUL byte: this is a binary file, not text", code=2)


def test_dev_zero_as_corpus_training_or_settings_file(cli, assets):
    from bert_kit.checks import CorruptFileError, read_json

    out = cli("pretrain", "--config", assets.pretrain_yaml, "train_files=[/dev/zero]", "output_dir=run")
    out.one_line_error("/dev/zero:1: NUL byte: this is a binary file, not text", code=2)
    out = cli("tokenizer", "train", "--files", "/dev/zero", "--vocab-size", "100", "--output", "tok")
    out.one_line_error("/dev/zero:1: NUL byte: this is a binary file, not text", code=2)
    with pytest.raises(CorruptFileError, match="/dev/zero: more than 64 MB: not a settings, config or vocabulary"):
        read_json("/dev/zero")


def test_embed_a_line_of_megabytes_without_a_space(cli, assets, tmp_path):
    """The line is cut to MAX_LINE characters as it is read (one warning) and squeezed by the
    tokenizer: it is one [UNK] word, as the whole line would be."""
    (tmp_path / "in.txt").write_text("the cat\n" + "x" * 5_000_000 + "\n")
    out = cli("embed", "--model", assets.encoder, "--input", "in.txt", "--output", "v.npy", "--device", "cpu")
    assert out.code == 0, out.err
    assert "1 line(s) longer than 1,000,000 characters were cut to their first 1,000,000 (line 2)" in out.err
    (tmp_path / "word.txt").write_text("x" * 200 + "\n")
    assert cli("embed", "--model", assets.encoder, "--input", "word.txt", "--output", "w.npy",
               "--device", "cpu").code == 0
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape[0] == 2
    np.testing.assert_allclose(vectors[1], np.load(tmp_path / "w.npy")[0], atol=1e-6, rtol=0)
