"""Tests for bert_kit.data.corpus: readers, streaming shards, and the on-disk token cache.

Run: .venv/bin/python -m pytest tests/data/test_corpus.py -q
"""

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from bert_kit.data import corpus, token_cache
from bert_kit.data.corpus import (
    StreamingTextDataset,
    iter_documents,
    read_documents,
    read_hf_documents,
)
from bert_kit.data.token_cache import tokenize_to_cache


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def wikitext_valid(data_dir):
    return data_dir / "wikitext-2" / "valid.txt"


def test_wikitext_mode_counts_articles(wikitext_valid):
    docs = read_documents(wikitext_valid, mode="wikitext")
    assert len(docs) == 60
    assert docs[0].startswith("Homarus gammarus , known as the European lobster")
    # Headings are dropped, paragraphs kept one per line.
    assert not any(line.startswith("= ") for d in docs for line in d.splitlines())
    n_paragraphs = sum(len(d.splitlines()) for d in docs)
    raw = wikitext_valid.read_text(encoding="utf-8").splitlines()
    expected = sum(1 for ln in raw if ln.strip() and not ln.strip().startswith("= "))
    assert n_paragraphs == expected
    # The lazy reader yields the same documents.
    assert list(iter_documents(wikitext_valid, mode="wikitext"))[:3] == docs[:3]


def test_plain_text_modes(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first doc line one\nline two\n\n\n  second doc  \n \nthird\n", encoding="utf-8")
    assert read_documents(path) == ["first doc line one\nline two", "second doc", "third"]
    assert read_documents(path, mode="line") == [
        "first doc line one", "line two", "second doc", "third"]


def test_jsonl_reader_and_errors(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"body": "alpha beta", "id": 1}, {"body": "gamma\ndelta", "id": 2}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert read_documents(path, text_field="body") == ["alpha beta", "gamma\ndelta"]
    with pytest.raises(KeyError, match=r"docs\.jsonl:1: .*'text'"):
        read_documents(path)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "fine"}\n{"text": broken\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: invalid JSON"):
        read_documents(bad)
    wrong_type = tmp_path / "num.jsonl"
    wrong_type.write_text('{"text": 5}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"num\.jsonl:1: field 'text' is int"):
        read_documents(wrong_type)


def test_missing_paths_directories_and_globs(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_documents(missing)
    with pytest.raises(FileNotFoundError, match=r"\*\.md"):
        read_documents(str(tmp_path / "*.md"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("bravo\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("alpha\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"text": "charlie"}\n', encoding="utf-8")
    # Directory: every file below it, sorted by path; mode "auto" picks JSONL by suffix.
    assert read_documents(tmp_path) == ["alpha", "charlie", "bravo"]
    assert read_documents(str(tmp_path / "**" / "*.txt")) == ["alpha", "bravo"]
    assert read_documents([tmp_path / "c.jsonl", tmp_path / "a.txt"]) == ["charlie", "alpha"]


def test_hf_datasets_source_is_optional(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n{"text": "two"}\n', encoding="utf-8")
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install datasets"):
            read_hf_documents(path)
    else:
        assert read_hf_documents(path) == ["one", "two"]


def _collect(ds, num_workers):
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    return list(loader)


def test_streaming_shards_cover_each_line_once(tmp_path):
    lines = [f"line {i} of the corpus" for i in range(203)]
    path = tmp_path / "stream.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    seen, per_shard = [], []
    for rank in range(2):
        ds = StreamingTextDataset(path, buffer_size=16, seed=3, rank=rank, world_size=2)
        got = _collect(ds, num_workers=2)
        per_shard.append(got)
        seen.extend(got)
    assert Counter(seen) == Counter(lines)  # 2 ranks x 2 workers: each line exactly once
    assert all(50 <= len(s) <= 102 for s in per_shard)
    # The buffer really shuffles, reproducibly per (seed, epoch), and differently per epoch.
    one = StreamingTextDataset(path, buffer_size=64, seed=3)
    first, again = list(one), list(one)
    one.set_epoch(1)
    second = list(one)
    assert sorted(first) == sorted(lines) and first != lines
    assert first == again and first != second
    assert list(StreamingTextDataset(path, shuffle=False)) == lines


def test_streaming_tokenized_items(tmp_path, tokenizer):
    path = tmp_path / "s.txt"
    path.write_text("hello world\n" + "word " * 300 + "\n", encoding="utf-8")
    items = list(StreamingTextDataset(path, tokenizer=tokenizer, max_length=32, shuffle=False))
    assert items[0]["input_ids"] == tokenizer.encode("hello world")
    assert len(items[1]["input_ids"]) == 32 and items[1]["input_ids"][-1] == tokenizer.sep_token_id


@pytest.fixture()
def small_corpus(tmp_path, wikitext_valid):
    # The first ~300 lines of WikiText-2 valid: a few articles, a real vocabulary.
    lines = wikitext_valid.read_text(encoding="utf-8").splitlines(keepends=True)[:300]
    path = tmp_path / "corpus" / "wiki.txt"
    path.parent.mkdir()
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_token_cache_matches_direct_tokenization(small_corpus, tmp_path, tokenizer):
    cache = tokenize_to_cache(small_corpus, tokenizer, tmp_path / "cache", mode="wikitext",
                              progress=False)
    docs = read_documents(small_corpus, mode="wikitext")
    assert not cache.from_cache
    assert len(cache) == cache.num_documents == len(docs) >= 3
    assert isinstance(cache.tokens, np.memmap) and cache.tokens.dtype == np.uint16
    assert cache.offsets.dtype == np.int64 and cache.offsets[-1] == cache.num_tokens
    for i, doc in enumerate(docs):
        expected = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(doc))
        assert cache.document(i).tolist() == expected
    assert len(cache.document(0)) > 200  # not cut at the tokenizer's 128-token setting
    # Written atomically: only the final files remain.
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(names) == 3 and not any(n.endswith(".tmp") for n in names)


def test_token_cache_hit_and_invalidation(small_corpus, tmp_path, tokenizer, monkeypatch):
    calls = []
    real = corpus._encode_documents

    def counting(backend, texts):
        calls.append(len(texts))
        return real(backend, texts)

    monkeypatch.setattr(token_cache, "_encode_documents", counting)
    first = tokenize_to_cache(small_corpus, tokenizer, tmp_path / "c", mode="wikitext",
                              progress=False)
    assert sum(calls) == first.num_documents
    calls.clear()
    second = tokenize_to_cache(small_corpus, tokenizer, tmp_path / "c", mode="wikitext",
                               progress=False)
    assert calls == [] and second.from_cache  # no re-tokenisation
    np.testing.assert_array_equal(np.asarray(second.tokens), np.asarray(first.tokens))
    np.testing.assert_array_equal(np.asarray(second.offsets), np.asarray(first.offsets))

    # Changing the file (size and mtime) invalidates the cache.
    with open(small_corpus, "a", encoding="utf-8") as f:
        f.write(" = New Article = \n The added article text . \n")
    st = small_corpus.stat()
    os.utime(small_corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = tokenize_to_cache(small_corpus, tokenizer, tmp_path / "c", mode="wikitext",
                              progress=False)
    assert sum(calls) == third.num_documents == first.num_documents + 1
    assert not third.from_cache
    assert third.document(-1).tolist() == tokenizer.convert_tokens_to_ids(
        tokenizer.tokenize("The added article text ."))
    # A different reading mode is a different cache too.
    calls.clear()
    tokenize_to_cache(small_corpus, tokenizer, tmp_path / "c", mode="line", progress=False)
    assert sum(calls) > third.num_documents


def test_token_cache_document_index_errors(tmp_path, tokenizer):
    path = tmp_path / "t.txt"
    path.write_text("one two\n\nthree\n", encoding="utf-8")
    cache = tokenize_to_cache(path, tokenizer, tmp_path / "c", progress=False)
    assert len(cache) == 2
    with pytest.raises(IndexError, match="document 2 out of range for 2"):
        cache.document(2)
    assert torch.tensor(cache.document(1).astype(np.int64)).tolist() == tokenizer.convert_tokens_to_ids(["three"])


def test_sentence_cache_keeps_document_and_sentence_boundaries(small_corpus, tmp_path, tokenizer, monkeypatch):
    from bert_kit.data.corpus import plain_backend
    from bert_kit.data.pretraining import split_sentences

    docs = read_documents(small_corpus)
    cache = tokenize_to_cache(small_corpus, tokenizer, tmp_path, sentences=True, progress=False)
    backend = plain_backend(tokenizer)
    expect = [[backend.encode(s, add_special_tokens=False).ids for s in split_sentences(d)] for d in docs]
    assert cache.sentence_documents() == expect
    # a second call is a cache hit (no tokenisation) and keeps the grouping; plain caches have none
    monkeypatch.setattr(corpus, "_encode_documents", lambda *a: pytest.fail("re-tokenised"))
    again = tokenize_to_cache(small_corpus, tokenizer, tmp_path, sentences=True, progress=False)
    assert again.from_cache and again.sentence_documents() == expect
    monkeypatch.undo()
    plain = tokenize_to_cache(small_corpus, tokenizer, tmp_path, progress=False)
    assert plain.groups is None and plain.num_documents == len(docs)
    with pytest.raises(ValueError, match="sentences=True"):
        plain.sentence_documents()


# ------------------------------------------------------------------------------ WikiText <unk>, encodings


def test_wikitext_unk_is_the_tokenizers_unknown_token(wikitext_valid, tokenizer, tmp_path):
    lines = wikitext_valid.read_text(encoding="utf-8").splitlines()
    raw = "\n".join(ln for ln in lines if not corpus._is_heading(ln.strip()))  # headings are dropped
    docs = read_documents(wikitext_valid, mode="wikitext")
    text = "\n".join(docs)
    assert "<unk>" not in text and text.count("[UNK]") == raw.count("<unk>") > 500
    assert "<unk>" in read_documents(wikitext_valid, mode="blank_line")[1]  # other formats keep the text as is
    cache = tokenize_to_cache(wikitext_valid, tokenizer, tmp_path / "cache", mode="wikitext", progress=False)
    ids = np.asarray(cache.tokens)
    lt, gt = tokenizer.convert_tokens_to_ids(["<", ">"])
    assert int((ids == tokenizer.unk_token_id).sum()) == raw.count("<unk>")  # one [UNK] per <unk>
    # the only "<" and ">" left are the ones the articles really contain
    assert int((ids == lt).sum()) == raw.count("<") - raw.count("<unk>")
    assert int((ids == gt).sum()) == raw.count(">") - raw.count("<unk>")


def test_wikitext_unk_in_a_stream_and_with_another_unknown_token(tmp_path, tokenizer):
    path = tmp_path / "wiki.txt"
    path.write_text(" = Title = \n the <unk> sat on the <unk> \n", encoding="utf-8")
    stream = StreamingTextDataset(path, tokenizer, max_length=16, mode="wikitext", shuffle=False)
    ids = next(iter(stream))["input_ids"]
    assert ids == tokenizer.encode("the [UNK] sat on the [UNK]")
    assert ids.count(tokenizer.unk_token_id) == 2
    assert read_documents(path, mode="wikitext", wikitext_unk="<UNKNOWN>") == ["the <UNKNOWN> sat on the <UNKNOWN>"]


def test_corpus_byte_order_mark_crlf_and_bad_bytes(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"\xef\xbb\xbffirst doc\r\n\r\nsecond doc\r\n")
    assert read_documents(path) == ["first doc", "second doc"]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n{"text": "b"}\r\n')
    assert read_documents(jsonl) == ["a", "b"]
    path.write_bytes(b"good line\n\nbad \xff line\n")
    with pytest.raises(ValueError, match=r"corpus\.txt:3: not UTF-8 text \(byte 0xff at column 5\)"):
        read_documents(path)
    stream = StreamingTextDataset(path, mode="line", shuffle=False)
    with pytest.raises(ValueError, match=r"corpus\.txt:3: not UTF-8 text"):
        list(stream)


def test_compressed_corpus_files_are_read_as_they_are_distributed(tmp_path):
    """JSON Lines compressed with xz (as ../shared/corpus ships it), gzip and bz2 text: read lazily,
    the mode taken from the suffix before the compression one."""
    import bz2
    import gzip
    import lzma

    docs = ["First document.\nIts second paragraph.", "Second document."]
    with lzma.open(tmp_path / "part.jsonl.xz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d, "title": str(i)}) + "\n" for i, d in enumerate(docs))
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress("\n\n".join(docs).encode()))
    (tmp_path / "notes.txt.bz2").write_bytes(bz2.compress(("\ufeff" + "\n\n".join(docs)).encode()))
    for name in ("part.jsonl.xz", "notes.txt.gz", "notes.txt.bz2"):
        assert read_documents(tmp_path / name) == docs, name
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(b"ok line\n\xff\xfe bad\n"))
    with pytest.raises(ValueError, match=r"bad.txt.gz:2: not UTF-8"):
        read_documents(tmp_path / "bad.txt.gz")
