"""Bad arguments to the Python API: models, heads, tokenizer, SentenceEncoder, configs.

Each input gets a TypeError or ValueError whose message names the argument and what was wrong
(shape, dtype, value), before it could become an index error deep in torch, a CUDA assert or a
silently wrong output. Inputs that have a correct answer (an empty batch, a bool or float 0/1
mask) get it, checked against the usual call.

Run: python -m pytest -q tests/bad_inputs/test_python_api.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bert_kit.config import BertConfig
from bert_kit.embeddings import SentenceEncoder, cosine_similarity, mean_pool
from bert_kit.heads import BERTForMaskedLM, BERTForPreTraining, BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.tokenizer import get_tokenizer

CONFIG = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=64)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BERTModel(BertConfig(**CONFIG)).eval()


@pytest.fixture(scope="module")
def mlm():
    torch.manual_seed(0)
    return BERTForMaskedLM(BertConfig(**CONFIG)).eval()


@pytest.fixture(scope="module")
def tokenizer(assets):
    return get_tokenizer(assets.tokenizer)


@pytest.fixture(scope="module")
def encoder(assets):
    return SentenceEncoder.from_pretrained(assets.encoder, max_length=32, device="cpu")


IDS = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 20, 21, 3, 0, 0]])
MASK = (IDS != 0).long()


def ids(*shape, low=5, high=100):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(0))


# (call on the model, exception, text the message must hold)
MODEL_CASES = {
    "mask-2": (lambda m: m(IDS, torch.full_like(IDS, 2)), ValueError, "attention_mask must hold only 0"),
    "mask-negative": (lambda m: m(IDS, -MASK), ValueError, "found [-1"),
    "mask-half": (lambda m: m(IDS, MASK * 0.5), ValueError, "found [0.5"),
    "mask-empty-row": (lambda m: m(IDS, torch.stack([MASK[0], torch.zeros(6, dtype=torch.long)])), ValueError,
                       "attention_mask row 1 is all zeros"),
    "mask-shape": (lambda m: m(IDS, MASK[:, :5]), ValueError, "attention_mask shape (2, 5) does not match input_ids (2, 6)"),
    "mask-list": (lambda m: m(IDS, MASK.tolist()), TypeError, "attention_mask must be a torch.Tensor"),
    "mask-complex": (lambda m: m(IDS, MASK.to(torch.complex64)), TypeError, "attention_mask must hold 0/1"),
    "ids-list": (lambda m: m(IDS.tolist()), TypeError, "input_ids must be a torch.Tensor"),
    "ids-numpy": (lambda m: m(IDS.numpy()), TypeError, "got ndarray"),
    "ids-float": (lambda m: m(IDS.float()), TypeError, "input_ids must be an integer tensor"),
    "ids-uint8": (lambda m: m(IDS.to(torch.uint8)), TypeError, "got torch.uint8"),
    "ids-1d": (lambda m: m(IDS[0]), ValueError, "input_ids must have shape (batch, seq_len), got (6,)"),
    "ids-3d": (lambda m: m(IDS[None]), ValueError, "got (1, 2, 6)"),
    "ids-no-tokens": (lambda m: m(IDS[:, :0]), ValueError, "input_ids has no tokens (shape (2, 0))"),
    "ids-too-long": (lambda m: m(ids(1, 65)), ValueError, "sequence length 65 exceeds max_position_embeddings (64)"),
    "ids-negative": (lambda m: m(IDS - 5), ValueError, "token id -5 out of range for vocab_size 120"),
    "ids-too-big": (lambda m: m(IDS + 200), ValueError, "token id 221 out of range"),
    "types-float": (lambda m: m(IDS, MASK, torch.zeros(2, 6)), TypeError, "token_type_ids must be an integer tensor"),
    "types-2": (lambda m: m(IDS, MASK, torch.full_like(IDS, 2)), ValueError,
                "token_type id 2 out of range for type_vocab_size 2"),
    "types-shape": (lambda m: m(IDS, MASK, IDS[:1]), ValueError, "token_type_ids shape (1, 6) does not match"),
    "unpadded-mask-2": (lambda m: m(IDS, MASK * 2, unpadded=True), ValueError, "attention_mask must hold only 0"),
}


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_model_inputs(model, name):
    call, error, needle = MODEL_CASES[name]
    with pytest.raises(error) as info:
        call(model)
    assert needle in str(info.value)


HEAD_CASES = {
    "mlm-labels-shape": (lambda: BERTForMaskedLM(BertConfig(**CONFIG))(IDS, MASK, labels=IDS[:, :5]), ValueError,
                         "labels shape (2, 5) does not match input_ids (2, 6)"),
    "mlm-labels-float": (lambda: BERTForMaskedLM(BertConfig(**CONFIG))(IDS, MASK, labels=IDS.float()), TypeError,
                         "labels must be token ids"),
    "pretraining-labels-shape": (lambda: BERTForPreTraining(BertConfig(**CONFIG))(IDS, MASK, labels=IDS[:1]),
                                 ValueError, "labels shape (1, 6)"),
    "classifier-0-labels": (lambda: BERTForSequenceClassification(BertConfig(**CONFIG), num_labels=0), ValueError,
                            "num_labels must be >= 1, got 0"),
}


@pytest.mark.parametrize("name", list(HEAD_CASES))
def test_head_inputs(name):
    call, error, needle = HEAD_CASES[name]
    with pytest.raises(error) as info:
        call()
    assert needle in str(info.value)


# ---- inputs with a correct answer ------------------------------------------------------------------

@pytest.mark.parametrize("unpadded", [False, True])
def test_empty_batch_gives_an_empty_output(model, unpadded):
    out = model(IDS[:0], MASK[:0], unpadded=unpadded)
    assert out.shape == (0, 6, 32)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32])
def test_mask_of_another_dtype_gives_the_same_output(model, dtype):
    with torch.no_grad():
        torch.testing.assert_close(model(IDS, MASK.to(dtype)), model(IDS, MASK), rtol=0, atol=0)


# ---- tokenizer ------------------------------------------------------------------------------------------

TOKENIZER_CASES = {
    "texts-None": (lambda t: t(None), TypeError, "texts must be a str or a list of str, got NoneType"),
    "texts-int": (lambda t: t(123), TypeError, "got int"),
    "texts-bytes": (lambda t: t(b"a cat"), TypeError, "got bytes"),
    "texts-empty": (lambda t: t([]), ValueError, "texts is empty"),
    "texts-item-None": (lambda t: t(["a", None]), TypeError, "texts[1] must be a str, got NoneType"),
    "pairs-count": (lambda t: t(["a", "b"], ["c"]), ValueError, "texts has 2 items but text_pairs has 1"),
    "max-length-0": (lambda t: t("a b", max_length=0), ValueError, "max_length must be a positive int"),
    "max-length-float": (lambda t: t("a b", max_length=2.5), ValueError, "got 2.5"),
    "padding-yes": (lambda t: t("a", padding="yes"), ValueError, "padding must be True, False"),
    "tensors-tf": (lambda t: t("a", return_tensors="tf"), ValueError, "return_tensors must be 'pt', 'np' or None"),
    "stride-negative": (lambda t: t("a", stride=-1), ValueError, "stride must be >= 0"),
    "encode-None": (lambda t: t.encode(None), TypeError, "text must be a str, got NoneType"),
    "decode-str": (lambda t: t.decode("2 3"), TypeError, "ids must be a sequence of token ids, got a str"),
    "decode-floats": (lambda t: t.decode([2, 3.5]), TypeError, "ids must be integers"),
    "decode-label-ids": (lambda t: t.decode([2, -100]), ValueError, "ids [-100] are outside the vocabulary"),
    "decode-batch": (lambda t: t.decode([[2, 3]]), ValueError, "use batch_decode for a batch"),
    "ids-to-tokens-999": (lambda t: t.convert_ids_to_tokens([999]), ValueError, "token id 999 is outside"),
    "tokens-to-ids-int": (lambda t: t.convert_tokens_to_ids(5), TypeError, "tokens must be a str or a list of str"),
}


@pytest.mark.parametrize("name", list(TOKENIZER_CASES))
def test_tokenizer_inputs(tokenizer, name):
    call, error, needle = TOKENIZER_CASES[name]
    with pytest.raises(error) as info:
        call(tokenizer)
    assert needle in str(info.value)


def test_decode_accepts_numpy_and_tensor_ids(tokenizer):
    ids_ = tokenizer.encode("the cat sees the dog")
    text = tokenizer.decode(ids_)
    assert tokenizer.decode(np.array(ids_)) == text == tokenizer.decode(torch.tensor(ids_))


# ---- SentenceEncoder and pooling -----------------------------------------------------------------------

ENCODER_CASES = {
    "texts-None": (lambda e: e.encode(None), TypeError, "texts must be a str or a list of str, got NoneType"),
    "texts-int": (lambda e: e.encode(5), TypeError, "got int"),
    "texts-item-int": (lambda e: e.encode(["a", 3]), TypeError, "texts[1] must be a str, got int"),
    "batch-size-0": (lambda e: e.encode(["a"], batch_size=0), ValueError, "batch_size=0 is out of range"),
    "batch-size-float": (lambda e: e.encode(["a"], batch_size=2.5), ValueError, "batch_size=2.5 is not an integer"),
    "ids-row-empty": (lambda e: e.encode_ids([[2, 3], []]), ValueError, "ids[1] is empty"),
    "ids-out-of-vocab": (lambda e: e.encode_ids([[2, 999, 3]]), ValueError, "token id 999 out of range"),
    "pairs-count": (lambda e: e.similarity(["a"], ["b", "c"]), ValueError, "1 first texts but 2 second texts"),
}


@pytest.mark.parametrize("name", list(ENCODER_CASES))
def test_sentence_encoder_inputs(encoder, name):
    call, error, needle = ENCODER_CASES[name]
    with pytest.raises(error) as info:
        call(encoder)
    assert needle in str(info.value)


def construct(model=None, tokenizer=None, **kw):
    return lambda m, t: SentenceEncoder(model or m, tokenizer or t, **kw)


ENCODER_SETUP_CASES = {
    "max-length-0": (construct(max_length=0), ValueError, "max_length=0 is out of range: expected an integer in [3, 64]"),
    "max-length-2": (construct(max_length=2), ValueError, "max_length=2 is out of range"),
    "max-length-over-positions": (construct(max_length=100), ValueError, "max_length=100 is out of range"),
    "pooling-max": (construct(max_length=32, pooling="max"), ValueError, "pooling='max' is not a valid choice"),
    "device-bogus": (construct(max_length=32, device="bogus"), ValueError, "device='bogus' is not a device"),
    "device-cuda-7": (construct(max_length=32, device="cuda:7"), ValueError, "device='cuda:7'"),
    "model-linear": (construct(model=torch.nn.Linear(2, 2)), TypeError, "model must be an encoder (BERTModel or ModernBertModel), got Linear"),
    "model-head": (lambda m, t: SentenceEncoder(BERTForMaskedLM(BertConfig(**CONFIG)), t, max_length=32), TypeError,
                   "pass its encoder, model.bert"),
    "tokenizer-path": (construct(tokenizer="tok", max_length=32), TypeError,
                       "tokenizer must be a WordPieceTokenizer (get_tokenizer(folder)), got str"),
}


@pytest.mark.parametrize("name", list(ENCODER_SETUP_CASES))
def test_sentence_encoder_settings(model, tokenizer, name):
    call, error, needle = ENCODER_SETUP_CASES[name]
    with pytest.raises(error) as info:
        call(model, tokenizer)
    assert needle in str(info.value)


def test_encoder_empty_inputs_give_empty_outputs(encoder):
    assert encoder.encode([]).shape == (0, 32)
    assert encoder.encode_ids([]).shape == (0, 32)
    assert encoder.similarity([], []).shape == (0,)


def test_encoder_one_pair_as_strings(encoder):
    one = encoder.similarity("a cat sees a dog", "the dog sees a cat")
    assert one.shape == (1,)
    np.testing.assert_allclose(one, encoder.similarity(["a cat sees a dog"], ["the dog sees a cat"]), rtol=0, atol=0)


POOLING_CASES = {
    "cosine-3d": (lambda: cosine_similarity(np.zeros((2, 2, 3)), np.zeros((1, 3))), "a must be (n, H) embeddings"),
    "cosine-widths": (lambda: cosine_similarity(np.zeros((1, 2)), np.zeros((1, 3))), "embedding widths differ"),
    "mean-pool-shapes": (lambda: mean_pool(torch.zeros(2, 3, 4), torch.ones(2, 4)),
                         "mean_pool takes hidden (B, T, H) and attention_mask (B, T)"),
    "mean-pool-2d": (lambda: mean_pool(torch.zeros(3, 4), torch.ones(3, 4)), "got (3, 4)"),
}


@pytest.mark.parametrize("name", list(POOLING_CASES))
def test_pooling_inputs(name):
    call, needle = POOLING_CASES[name]
    with pytest.raises(ValueError, match=None) as info:
        call()
    assert needle in str(info.value)


# ---- BertConfig --------------------------------------------------------------------------------

CONFIG_CASES = {
    "layer-norm-eps-nan": ({"layer_norm_eps": math.nan}, "layer_norm_eps=nan is out of range"),
    "layer-norm-eps-inf": ({"layer_norm_eps": math.inf}, "layer_norm_eps=inf"),
    "initializer-range-negative": ({"initializer_range": -1.0}, "initializer_range=-1.0 is out of range"),
    "dropout-text": ({"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob='0.1' is not a number"),
    "dropout-1": ({"attention_probs_dropout_prob": 1.0}, "attention_probs_dropout_prob=1.0"),
    "hidden-size-float": ({"hidden_size": 768.0}, "hidden_size=768.0 is not an integer"),
    "pad-id-text": ({"pad_token_id": "0"}, "pad_token_id='0' is not a number"),
    "pad-id-outside-vocab": ({"vocab_size": 10, "pad_token_id": 10}, "pad_token_id=10 is out of range"),
    "vocab-size-bool": ({"vocab_size": True}, "vocab_size=True is not a number"),
    "activation-none": ({"hidden_act": None}, "hidden_act=None is not a valid choice"),
    "positions-type": ({"position_embedding_type": "rotary"}, "position_embedding_type='rotary'"),
    "type-vocab-0": ({"type_vocab_size": 0}, "type_vocab_size=0 does not fit model_type='bert': expected at least 1"),
    "type-vocab-negative": ({"type_vocab_size": -1}, "type_vocab_size=-1 is out of range: expected an integer >= 0"),
    "family-unknown": ({"model_type": "t5"}, "model_type='t5' is not a valid choice: expected one of"),
    "roberta-offset": ({"model_type": "roberta", "pad_token_id": 1, "position_offset": 0},
                       "position_offset=0 does not fit model_type='roberta': RoBERTa numbers positions from "
                       "pad_token_id + 1 = 2"),
    "distilbert-segments": ({"model_type": "distilbert"}, "type_vocab_size=2 does not fit model_type='distilbert'"),
    "bert-without-pooler": ({"pooler": False}, "pooler=False does not fit model_type='bert'"),
}


@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_bert_config_fields(name):
    fields, needle = CONFIG_CASES[name]
    with pytest.raises(ValueError) as info:
        BertConfig(**fields)
    assert needle in str(info.value)


def test_bert_config_numbers_written_as_text_in_a_file(tmp_path):
    """YAML reads 1e-5 (no dot) as text; a config file still gets the number."""
    path = tmp_path / "model.yaml"
    path.write_text("preset: bert-tiny\nlayer_norm_eps: 1e-5\nmax_position_embeddings: '128'\n")
    config = BertConfig.from_file(path)
    assert config.layer_norm_eps == 1e-5 and config.max_position_embeddings == 128


def test_input_checks_read_the_device_once(model, monkeypatch):
    """check_inputs stays cheap: on a valid batch it reads values back from the device once (each
    read waits for a GPU), whatever it checks; only a failing check reads more, to name the culprit."""
    from bert_kit.input_checks import check_inputs

    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    check_inputs(model.config, IDS, MASK, torch.zeros_like(IDS))
    assert reads == ["tolist"]
