"""Tokenizers of the BERT family's other members (RoBERTa's and ModernBERT's byte-level BPE,
XLM-R's Unigram) read from their tokenizer.json give the ids of `transformers.AutoTokenizer`:
single texts, pairs (<s> a </s></s> b </s>; [CLS] a [SEP] b [SEP]), special tokens written in
the text, truncation, overflow windows and offsets; token_type_ids are zeros where the family
takes none; a saved folder reloads the same in both. The folders are built offline
(tests/tokenizer_folders.py).

Run: .venv/bin/python -m pytest tests/test_tokenizer_families.py -q
"""

import pytest

from bert_kit.tokenizer import FastTokenizer, WordPieceTokenizer, get_tokenizer
from tests.tokenizer_folders import FOLDERS, PAIRS, SENTENCES

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(FOLDERS))
def family(request, tmp_path_factory):
    """(name, folder, bert-kit's tokenizer, transformers' AutoTokenizer) of one family."""
    folder = FOLDERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, folder, get_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)


def test_ids_and_masks_of_single_texts_equal_autotokenizers(family):
    name, _, ours, hf = family
    assert type(ours) is FastTokenizer
    expect = hf(SENTENCES, padding=True)
    got = ours(SENTENCES, padding=True, return_tensors=None)
    assert got["input_ids"] == expect["input_ids"]
    assert got["attention_mask"] == expect["attention_mask"]
    assert "token_type_ids" not in expect  # none of these families takes segment ids
    assert got["token_type_ids"] == [[0] * len(row) for row in got["input_ids"]]
    for text in SENTENCES:
        assert ours.encode(text) == hf(text)["input_ids"], text
        assert ours.tokenize(text) == hf.tokenize(text), text


def test_pairs_special_tokens_and_ids_equal_autotokenizers(family):
    name, _, ours, hf = family
    for role in ("cls", "sep", "pad", "unk", "mask"):
        assert getattr(ours, f"{role}_token_id") == getattr(hf, f"{role}_token_id"), role
    a, b = zip(*PAIRS)
    expect = hf(list(a), list(b), padding=True)
    got = ours(list(a), list(b), padding=True, return_tensors=None)
    assert got["input_ids"] == expect["input_ids"]
    ids, cls, sep = ours.encode("hello", "world"), ours.cls_token_id, ours.sep_token_id
    specials = [t for t in ids if t in (cls, sep)]
    assert ids[0] == cls and ids[-1] == sep
    assert specials == ([cls, sep, sep] if name == "modernbert" else [cls, sep, sep, sep])  # RoBERTa: </s></s>
    for x, y in PAIRS:
        assert ours.encode(x, y) == hf(x, y)["input_ids"]


@pytest.mark.parametrize("max_length", [5, 8, 12])
def test_truncation_equals_autotokenizers(family, max_length):
    _, _, ours, hf = family
    texts = [s for s in SENTENCES if s]
    expect = hf(texts, truncation=True, max_length=max_length, padding=True)
    got = ours(texts, max_length=max_length, padding=True, return_tensors=None)
    assert got["input_ids"] == expect["input_ids"]
    a, b = zip(*PAIRS)
    expect = hf(list(a), list(b), truncation=True, max_length=max_length + 2, padding=True)
    got = ours(list(a), list(b), max_length=max_length + 2, padding=True, return_tensors=None)
    assert got["input_ids"] == expect["input_ids"]


def test_overflow_windows_and_offsets_equal_autotokenizers(family):
    """What SQuAD features need: windows over the second text, with offsets into it."""
    _, _, ours, hf = family
    question, context = "What jumps?", " ".join(SENTENCES[:5])
    expect = hf(question, context, truncation="only_second", max_length=32, stride=4,
                return_overflowing_tokens=True, return_offsets_mapping=True)
    got = ours(question, context, max_length=32, stride=4, return_overflowing_tokens=True,
               return_offsets_mapping=True, return_tensors=None, padding=False)
    assert len(expect["input_ids"]) > 2 and got["input_ids"] == expect["input_ids"]
    assert [[tuple(o) for o in row] for row in got["offset_mapping"]] == \
        [[tuple(o) for o in row] for row in expect["offset_mapping"]]


def test_decode_equals_autotokenizers(family):
    _, _, ours, hf = family
    for text in SENTENCES[:5]:
        ids = hf(text)["input_ids"]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text


def test_a_saved_tokenizer_loads_the_same_in_both(family, tmp_path):
    _, _, ours, _ = family
    ours.save(tmp_path)
    again, hf = get_tokenizer(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in SENTENCES:
        assert again.encode(text) == ours.encode(text) == hf(text)["input_ids"], text
    assert again.model_max_length == ours.model_max_length and not again.token_types


def test_bpe_is_refused_where_wordpiece_is_asked_for(family):
    name, folder, _, _ = family
    kind = "Unigram" if name == "xlm-roberta" else "BPE"
    with pytest.raises(ValueError, match=f"holds a {kind} model, expected WordPiece"):
        WordPieceTokenizer.from_pretrained(folder)


def test_a_bare_tokenizer_json_finds_robertas_special_tokens(family, tmp_path):
    """Without tokenizer_config.json the roles are BERT's tokens, else RoBERTa's."""
    name, folder, ours, _ = family
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    bare = get_tokenizer(tmp_path)
    assert (bare.cls_token_id, bare.sep_token_id, bare.mask_token_id) == \
        (ours.cls_token_id, ours.sep_token_id, ours.mask_token_id)
    assert bare.encode("hello", "world") == ours.encode("hello", "world")
