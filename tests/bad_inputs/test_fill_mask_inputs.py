"""fill-mask's bounds: the number of [MASK] tokens in a text and top_k, in Python and on the command line.

Inputs: a text without [MASK], masks past the model's positions (the text is cut before them:
they were dropped without a word, or reported as 'no [MASK] token'), more masks than MAX_MASKS,
top_k of 0, a fraction, or more than the vocabulary. Outcome: a ConfigError (exit 2, one line)
saying which bound the input breaks and what to do; on the command line before the model loads
and before anything is printed.

Run: python -m pytest -q tests/bad_inputs/test_fill_mask_inputs.py
"""

from __future__ import annotations

import pytest

from bert_kit.checks import ConfigError
from bert_kit.tasks.fill_mask import MAX_MASKS, fill_mask, load_mlm_model

LONG = " ".join(["the red cat sees the dog"] * 20)  # 120 words: past the 64 positions of the asset models


@pytest.fixture(scope="module")
def mlm(assets):
    from bert_kit.tokenizer import get_tokenizer

    return load_mlm_model(assets.mlm), get_tokenizer(assets.mlm)


@pytest.mark.parametrize("text, message", [
    ("the red cat sees the dog", r"no \[MASK\] token in the text 'the red cat sees the dog': write \[MASK\] where"),
    ("", r"no \[MASK\] token in the text ''"),
    (f"{LONG} [MASK]", r"1 of the 1 \[MASK\] token\(s\) of the text .* lie past the model's 64 positions, where "
                       "the text is cut: shorten the text before them"),
    (f"the [MASK] cat {LONG} the [MASK] dog", r"1 of the 2 \[MASK\] token\(s\)"),
    ("the cat " + "[MASK] " * (MAX_MASKS + 1), rf"holds {MAX_MASKS + 1} \[MASK\] tokens; at most {MAX_MASKS}"),
])
def test_masks_are_counted(mlm, text, message):
    model, tokenizer = mlm
    with pytest.raises(ConfigError, match=message):
        fill_mask(model, tokenizer, text)


def test_as_many_masks_as_allowed_each_get_predictions(mlm):
    model, tokenizer = mlm
    result = fill_mask(model, tokenizer, "the cat " + "[MASK] " * MAX_MASKS, top_k=2)
    assert len(result) == MAX_MASKS and all(len(row) == 2 for row in result)


def test_top_k_is_an_integer_within_the_vocabulary(mlm):
    model, tokenizer = mlm
    vocab = model.config.vocab_size
    for top_k in (0, -1, 1.5, vocab + 1, 10**9):
        with pytest.raises(ConfigError, match=rf"top_k={top_k!r} is .*: expected an integer in \[1, {vocab}\] "
                                              r"\(the vocabulary size\)"):
            fill_mask(model, tokenizer, "the [MASK] cat", top_k=top_k)
    (row,) = fill_mask(model, tokenizer, "the [MASK] cat", top_k=vocab)  # all of it
    assert len(row) == vocab and sum(p["score"] for p in row) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("argv, needle", [
    (["the red cat"], "no [MASK] token in the text 'the red cat'"),
    (["the [MASK] cat", f"{LONG} [MASK]"], "lie past the model's 64 positions"),
    (["the cat " + "[MASK] " * (MAX_MASKS + 1)], f"at most {MAX_MASKS}"),
    (["the [MASK] cat", "--top-k", "1000"], "top_k=1000 is out of range: expected an integer in [1, VOCAB]"),
])
def test_the_command_checks_every_text_before_it_answers(cli, assets, mlm, argv, needle):
    needle = needle.replace("VOCAB", str(mlm[0].config.vocab_size))
    result = cli("fill-mask", "--model", assets.mlm, *argv)
    result.one_line_error(needle, code=2)
    assert result.out == ""  # not the first text's answers, then an error


def test_the_server_offers_no_more_predictions_than_the_vocabulary_has(mlm):
    """/fill-mask's top_k maximum is 100, or the vocabulary size where that is smaller: a model of
    fewer words asked for top_k=100 failed inside the batch instead of answering 422."""
    from bert_kit.config import BertConfig
    from bert_kit.heads import BERTForMaskedLM
    from bert_kit.serving.operations import FillMask

    model, tokenizer = mlm
    assert FillMask(model, tokenizer, 64).options["top_k"]["maximum"] == 100  # 110 words
    small = BERTForMaskedLM(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64))
    op = FillMask(small, tokenizer, 64)
    assert op.options["top_k"]["maximum"] == 60 and op.request_schema()["properties"]["top_k"]["maximum"] == 60
    assert FillMask.options["top_k"]["maximum"] == 100  # the class's own schema is left as it was
