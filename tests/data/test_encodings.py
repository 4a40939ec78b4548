"""Every reader takes an `encoding` (a Python codec name) and reads any readable path once.

TREC's official train_5500.label is ISO-8859-1: `encoding="latin-1"` reads it; without it the
error names the file, line and byte and says how to name the encoding. An unknown codec is
refused naming the setting. A FIFO (or /dev/stdin, or `<(command)`) is a file to every reader.

Run: .venv/bin/python -m pytest tests/data/test_encodings.py -q
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from bert_kit.checks import ConfigError
from bert_kit.data import read_lines, read_text, setting, settings_named_as
from bert_kit.data.classification import read_classification_file
from bert_kit.data.corpus import StreamingTextDataset, iter_documents
from bert_kit.data.token_cache import tokenize_to_cache
from bert_kit.data.ner import read_conll
from bert_kit.data.squad import read_squad
from bert_kit.data.sts import read_pair_file, read_sts
from bert_kit.data.tables import read_table, read_texts

# the first lines of TREC's train_5500.label, and one with its one non-ASCII byte (0xe9, é in ISO-8859-1)
TREC = ("DESC:manner How did serfdom develop in and then leave Russia ?\n"
        "ENTY:cremat What films featured the character Popeye Doyle ?\n"
        "HUM:ind Who was the first Pok\u00e9mon trainer ?\n")
TREC_PATTERN = r"(?P<label>[A-Z]+):\S+ (?P<text>.*)"


def test_trec_in_latin1_reads_with_its_encoding_and_names_it_otherwise(tmp_path):
    path = tmp_path / "train_5500.label"
    path.write_bytes(TREC.encode("latin-1"))
    data = read_classification_file(path, text_column=0, header=False, label_pattern=TREC_PATTERN, encoding="latin-1")
    assert data.texts[2] == "Who was the first Pok\u00e9mon trainer ?"
    assert data.label_names == ["DESC", "ENTY", "HUM"] and data.labels == [0, 1, 2]
    with pytest.raises(ValueError) as e:  # UTF-8 by default: file, line, byte, and the setting to name it
        read_classification_file(path, text_column=0, header=False, label_pattern=TREC_PATTERN)
    assert str(e.value) == (f"{path}:3: not UTF-8 text (byte 0xe9 at column 30); save the file as UTF-8, or name "
                            "its encoding with encoding=latin-1 (or cp1252, ...)")
    with settings_named_as({"encoding": "--encoding"}):  # a command of flags names its flag
        with pytest.raises(ValueError, match="name its encoding with --encoding latin-1"):
            read_lines(path)
    assert read_lines(path, "latin-1")[2].endswith("Pok\u00e9mon trainer ?")


def test_unknown_or_binary_codecs_are_refused_naming_the_setting(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    for name in ("utf9", "base64", "", "zlib"):
        with pytest.raises(ConfigError, match=f"^encoding={name!r} is not a known text encoding"):
            read_lines(path, name)
    with settings_named_as({"encoding": "--encoding"}), pytest.raises(ConfigError, match="^--encoding 'utf9' is not"):
        read_text(path, encoding="utf9")


def test_bytes_invalid_in_the_named_encoding_keep_the_clear_error(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_bytes(b"sentence\tlabel\nok\t1\n\x81\x8d\t0\n")  # 0x81 is no cp1252 character
    with pytest.raises(ValueError, match=r"a.tsv:3: not cp1252 text \(byte 0x81 at column 1\); name the file's "
                                         "encoding with encoding=NAME"):
        read_table(path, ["sentence"], encoding="cp1252")


def test_utf16_with_a_byte_order_mark(tmp_path):
    """UTF-16 is not split at newline bytes; the error for it as UTF-8 says utf-16."""
    path = tmp_path / "t.csv"
    path.write_bytes("sentence,label\nna\u00efve,1\nplain,0\n".encode("utf-16"))
    with pytest.raises(ValueError, match="t.csv:1: not UTF-8 text .*name its encoding with encoding=utf-16$"):
        read_table(path, ["sentence"])
    rows = read_table(path, ["sentence", "label"], encoding="utf-16")
    assert [values for _, values in rows] == [["na\u00efve", "1"], ["plain", "0"]]
    corpus = tmp_path / "c.txt"
    corpus.write_bytes("first doc\n\nsecond caf\u00e9 doc\n".encode("utf-16"))
    assert list(iter_documents(corpus, encoding="utf-16")) == ["first doc", "second caf\u00e9 doc"]


def test_every_reader_takes_the_encoding(tmp_path):
    enc = "latin-1"
    conll = tmp_path / "c.txt"
    conll.write_bytes("Caf\u00e9 B-ORG\nopens O\n".encode(enc))
    assert read_conll(conll, encoding=enc) == [(["Caf\u00e9", "opens"], ["B-ORG", "O"])]
    sts = tmp_path / "sts.csv"
    sts.write_bytes("g\tf\t2012\t1\t4.0\tA caf\u00e9.\tA bar.\n".encode(enc))
    assert read_sts(sts, encoding=enc) == (["A caf\u00e9."], ["A bar."], [4.0])
    pairs = tmp_path / "p.csv"
    pairs.write_bytes("a,b,s\ncaf\u00e9,bar,3\n".encode(enc))
    assert read_pair_file(pairs, "a", "b", "s", encoding=enc) == (["caf\u00e9"], ["bar"], [3.0])
    squad = tmp_path / "s.json"
    context = "The caf\u00e9 opened in 1901."
    squad.write_bytes(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "1", "question": "When?", "answers": [{"text": "1901", "answer_start": 19}]}]}]}]},
        ensure_ascii=False).encode(enc))
    assert read_squad(squad, encoding=enc)[0]["context"] == context
    assert read_texts(pairs, "a", encoding=enc) == ["caf\u00e9"]
    for reader in (lambda: read_conll(conll), lambda: read_sts(sts), lambda: read_squad(squad)):
        with pytest.raises(ValueError, match="not UTF-8 text .* encoding=latin-1"):
            reader()


def test_corpora_take_the_encoding(tmp_path, minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("un caf\u00e9 noir\n\nle th\u00e9 vert\n".encode("latin-1"))
    assert list(iter_documents(corpus, encoding="latin-1")) == ["un caf\u00e9 noir", "le th\u00e9 vert"]
    with pytest.raises(ValueError, match=r"corpus.txt:1: not UTF-8 text \(byte 0xe9 at column 7\).*encoding=latin-1"):
        list(iter_documents(corpus))
    tok = get_tokenizer(minilm_path)
    cache = tokenize_to_cache(corpus, tok, tmp_path / "cache", mode="blank_line", progress=False, encoding="latin-1")
    assert cache.document(0).tolist() == tok.encode("un caf\u00e9 noir")[1:-1]
    stream = StreamingTextDataset(corpus, mode="blank_line", shuffle=False, encoding="latin-1")
    assert sorted(stream) == ["le th\u00e9 vert", "un caf\u00e9 noir"]
    with pytest.raises(ConfigError, match="encoding='utf9'"):
        StreamingTextDataset(corpus, encoding="utf9")


def test_the_config_settings_check_the_codec():
    from bert_kit.tasks.finetuning import FinetuneConfig
    from bert_kit.tasks.pretraining_config import PretrainConfig

    assert FinetuneConfig(encoding="latin-1").encoding == "latin-1"
    for cls in (FinetuneConfig, PretrainConfig):
        with pytest.raises(ConfigError, match="^encoding='utf9' is not a known text encoding"):
            cls(encoding="utf9")


def test_setting_spells_a_setting_as_the_command_takes_it():
    assert setting("header", False) == "header=false"
    assert setting("score_range", ["LOW", "HIGH"]) == "score_range=[LOW, HIGH]"
    assert setting("label_names") == "label_names"
    flags = {"header": "--header", "score_range": "--score-range", "encoding": "--encoding"}
    with settings_named_as(flags):
        assert setting("header", False) == "--no-header" and setting("header", True) == "--header"
        assert setting("score_range", ["LOW", "HIGH"]) == "--score-range LOW HIGH"
        assert setting("encoding", "latin-1") == "--encoding latin-1"
        assert setting("label_names") == "label_names"  # no flag: the key
    assert setting("header", False) == "header=false"  # and back after the command


def write_fifo(path, data: bytes) -> threading.Thread:
    """A FIFO at `path` that a thread fills with `data` once a reader opens it."""
    os.mkfifo(path)

    def feed() -> None:
        with open(path, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_read_once_by_every_reader(tmp_path):
    cases = [
        (b"sentence\tlabel\na\t1\nb\t0\n", lambda p: read_classification_file(p).texts, ["a", "b"]),
        (b"x y\nz\n", lambda p: read_lines(p), ["x y", "z"]),
        (b"EU B-ORG\n", lambda p: read_conll(p), [(["EU"], ["B-ORG"])]),
        (b"g\tf\t2012\t1\t4.0\ta\tb\n", lambda p: read_sts(p), (["a"], ["b"], [4.0])),
        (b"doc one\n\ndoc two\n", lambda p: list(iter_documents(p)), ["doc one", "doc two"]),
    ]
    for n, (data, read, expected) in enumerate(cases):
        path = tmp_path / f"pipe{n}"
        thread = write_fifo(path, data)
        assert read(path) == expected
        thread.join(timeout=10)
    with pytest.raises(FileNotFoundError, match="^data file is a folder, not a file: "):
        read_table(tmp_path, ["a"])
    with pytest.raises(FileNotFoundError, match="^STS file not found: .*nope.csv$"):
        read_sts(tmp_path / "nope.csv")


def test_tokenizer_train_takes_the_encoding(tmp_path, capsys):
    """`bert-kit tokenizer train` read only UTF-8: a latin-1 corpus could not be trained on, and the
    error advised no flag."""
    from bert_kit.cli import main
    from bert_kit.tokenizer import get_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(("caf\u00e9 au lait. " * 50 + "\n\n" + TREC * 20).encode("latin-1"))
    assert main(["tokenizer", "train", "--files", str(corpus), "--vocab-size", "200", "--cased",
                 "--output", str(tmp_path / "utf8")]) == 2
    error = capsys.readouterr().err
    assert "corpus.txt:1: not utf-8 text" in error.lower() and "--encoding latin-1" in error
    assert main(["tokenizer", "train", "--files", str(corpus), "--vocab-size", "200", "--cased",
                 "--encoding", "latin-1", "--output", str(tmp_path / "latin1")]) == 0
    assert "\u00e9" in get_tokenizer(tmp_path / "latin1").get_vocab()
    assert main(["tokenizer", "train", "--files", str(corpus), "--encoding", "utf9",
                 "--output", str(tmp_path / "bad")]) == 2
    assert "--encoding 'utf9' is not a known text encoding" in capsys.readouterr().err
