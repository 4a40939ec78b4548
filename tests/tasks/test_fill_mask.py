"""fill-mask: top-k predictions equal the model's softmax at each [MASK]; the CLI prints them.

Run: .venv/bin/python -m pytest tests/tasks/test_fill_mask.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from bert_kit.cli import main as cli
from bert_kit.config import BertConfig
from bert_kit.tasks.fill_mask import fill_mask
from bert_kit.heads import BERTForMaskedLM, BERTForPreTraining
from bert_kit.model import BERTModel
from bert_kit.tokenizer_training import train_tokenizer

torch.set_num_threads(1)  # tiny models: threads only add contention on a shared machine
TEXTS = ["the dog sat on the mat.", "the cat sat on the hat.", "a bird sang in the tree."] * 5


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(texts=TEXTS, vocab_size=80, min_frequency=1)


def make_model(cls, tokenizer, boost: str | None = "dog"):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    model = cls(config)
    if boost is not None:
        with torch.no_grad():  # make one token overwhelmingly likely everywhere
            model.mlm.decoder.bias[tokenizer.convert_tokens_to_ids(boost)] = 30.0
    return model


def test_top_prediction_and_scores_match_the_softmax(tokenizer):
    model = make_model(BERTForMaskedLM, tokenizer, boost=None)
    text = "the [MASK] sat on the mat."
    result = fill_mask(model, tokenizer, text, top_k=4)
    assert len(result) == 1 and len(result[0]) == 4
    enc = tokenizer(text, return_tensors="pt")
    position = int((enc["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    model.eval()  # fill_mask predicts without dropout
    with torch.no_grad():
        probs = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])[0, position].softmax(-1)
    expected = probs.topk(4)
    torch.testing.assert_close(torch.tensor([p["score"] for p in result[0]]), expected.values, rtol=1e-6, atol=1e-7)
    assert [p["token_id"] for p in result[0]] == expected.indices.tolist()
    assert [p["token"] for p in result[0]] == tokenizer.convert_ids_to_tokens(expected.indices.tolist())
    scores = [p["score"] for p in result[0]]
    assert scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6


def test_each_mask_gets_its_own_predictions(tokenizer):
    model = make_model(BERTForPreTraining, tokenizer, boost="dog")  # (mlm, nsp) output works too
    result = fill_mask(model, tokenizer, "the [MASK] sat on the [MASK].", top_k=2)
    assert len(result) == 2
    for row in result:
        assert row[0]["token"] == "dog" and row[0]["score"] > 0.99
    assert result[0][0]["sequence"] == "the dog sat on the."  # the other mask is left out (special)
    assert model.training  # the caller's mode is restored


def test_text_without_mask_is_an_error(tokenizer):
    model = make_model(BERTForMaskedLM, tokenizer)
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        fill_mask(model, tokenizer, "nothing to fill here", top_k=3)
    with pytest.raises(ValueError, match="top_k"):
        fill_mask(model, tokenizer, "the [MASK]", top_k=0)


def test_cli_prints_predictions_and_rejects_encoder_only_folders(tokenizer, tmp_path, capsys):
    folder = tmp_path / "mlm"
    make_model(BERTForPreTraining, tokenizer, boost="cat").save_pretrained(folder)
    tokenizer.save(folder)
    assert cli(["fill-mask", "--model", str(folder), "a [MASK] sang in the tree.", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "mask 1:" in out and "a cat sang in the tree." in out
    assert cli(["fill-mask", "--model", str(folder), "the [MASK] sat.", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["text"] == "the [MASK] sat." and data["predictions"][0][0]["token"] == "cat"
    assert len(data["predictions"][0]) == 5  # default top-k

    encoder_only = tmp_path / "encoder"
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(encoder_only)
    tokenizer.save(encoder_only)
    assert cli(["fill-mask", "--model", str(encoder_only), "the [MASK]"]) == 2
    assert "no MLM head weights" in capsys.readouterr().err
