"""ModernBERT: parity with transformers' ModernBertModel and every head within 1e-5 (fp32, CPU,
random init, tiny and base-shaped, padded and unpadded, sequences longer than the local window,
transformers' sdpa and eager attention), folders both ways, both config forms of the hub, the
sliding window's reach, and the pluggable attention function.

Run: .venv/bin/python -m pytest tests/test_modernbert.py -q
"""

import json
import warnings

import pytest
import torch
from torch.testing import assert_close

from bert_kit import BERTModel, BertConfig
from bert_kit.checks import ConfigError, UnsupportedModelError
from bert_kit.config import load_hf_config
from bert_kit.hf import NewWeightsWarning, load_into, to_hf_state_dict, undrawn_init
from bert_kit.modernbert import (HEAD_CLASSES, ModernBertForMaskedLM, ModernBertForQuestionAnswering,
                                 ModernBertForSequenceClassification, ModernBertForTokenClassification, ModernBertModel,
                                 sdpa_attention)
from bert_kit.modernbert_config import ModernBertConfig

transformers = pytest.importorskip("transformers")

ROLES = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
# a 4-layer model (global, local, local, global) whose window (+-4) is far shorter than the inputs
TINY = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=64, pad_token_id=0, local_attention=8, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2)
BIASES = dict(mlp_bias=True, attention_bias=True, norm_bias=True, classifier_bias=True)


def hf_model(role: str, attn: str = "sdpa", **changes) -> torch.nn.Module:
    """transformers' class for `role`, random init, with its norms and biases moved off 1 and 0."""
    config = transformers.ModernBertConfig(**{**TINY, **changes})
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = getattr(transformers, "ModernBert" + role)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def batch(T: int = 30, vocab: int = 99) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, T) ids and mask: a full row, one padded from 2/3 of T, one of 4 tokens."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (3, T), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 2 * T // 3:], mask[2, 4:] = 0, 0
    return ids.masked_fill(mask == 0, 0), mask


def outputs(result, role: str) -> torch.Tensor:
    if isinstance(result, tuple):
        return torch.stack(result)
    if isinstance(result, torch.Tensor):
        return result
    if role == "Model":
        return result.last_hidden_state
    if role == "ForQuestionAnswering":
        return torch.stack([result.start_logits, result.end_logits])
    return result.logits


def real(t: torch.Tensor, mask: torch.Tensor, role: str) -> torch.Tensor:
    if role == "ForSequenceClassification":
        return t
    return t[:, mask.bool()] if role == "ForQuestionAnswering" else t[mask.bool()]


@pytest.mark.parametrize("role, attn", [(role, "sdpa") for role in ROLES] + [("Model", "eager"),
                                                                            ("ForSequenceClassification", "eager")])
def test_transformers_folders_load_with_the_same_outputs_and_back(tmp_path, role, attn):
    hf = hf_model(role, attn, classifier_pooling="mean", **BIASES)
    hf.save_pretrained(tmp_path / "hf")
    cls = HEAD_CLASSES["ModernBert" + role]
    with warnings.catch_warnings():
        warnings.simplefilter("error", NewWeightsWarning)  # every weight is in the folder
        ours = cls.from_pretrained(tmp_path / "hf")
    assert isinstance(ours.config, ModernBertConfig) and ours.config.classifier_pooling == "mean"
    ids, mask = batch()
    with torch.no_grad():
        expect = outputs(hf(input_ids=ids, attention_mask=mask), role)
        got = outputs(ours(ids, mask), role)
        unpadded = outputs(ours(ids, mask, unpadded=True), role)
    assert expect.abs().max() > 1e-2
    assert_close(real(got, mask, role), real(expect, mask, role), rtol=1e-5, atol=1e-5)
    assert_close(real(unpadded, mask, role), real(expect, mask, role), rtol=1e-5, atol=1e-5)

    ours.save_pretrained(tmp_path / "ours")  # transformers loads bert-kit's folder unchanged
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["ModernBert" + role]
    auto = "AutoModel" + ("" if role == "Model" else role)
    back = getattr(transformers, auto).from_pretrained(tmp_path / "ours", attn_implementation=attn).eval()
    assert type(back).__name__ == "ModernBert" + role
    with torch.no_grad():
        assert_close(outputs(back(input_ids=ids, attention_mask=mask), role), expect, rtol=0, atol=0)


@pytest.mark.parametrize("changes", [{}, {"classifier_pooling": "cls", "hidden_activation": "gelu_pytorch_tanh"},
                                     {"local_attention": 16, "global_attn_every_n_layers": 2, "global_rope_theta": 500.0,
                                      "local_rope_theta": 50.0, "decoder_bias": False}])
def test_other_settings_give_the_same_outputs(tmp_path, changes):
    """No biases (ModernBERT's default), CLS pooling, the tanh GELU, another layer pattern and thetas."""
    for role in ("ForSequenceClassification", "ForMaskedLM"):
        hf = hf_model(role, **changes)
        hf.save_pretrained(tmp_path / role)
        ours = HEAD_CLASSES["ModernBert" + role].from_pretrained(tmp_path / role)
        ids, mask = batch(40)
        with torch.no_grad():
            expect, got = outputs(hf(input_ids=ids, attention_mask=mask), role), ours(ids, mask, unpadded=True)
        assert_close(real(got, mask, role), real(expect, mask, role), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers", [3, pytest.param(22, marks=pytest.mark.slow)])
def test_base_shaped_model_matches_transformers(layers):
    """ModernBERT-base's shape (width 768, 12 heads, GeGLU 1152, window 128, thetas 160,000 /
    10,000; its first 3 layers, or all 22: 20 s on 2 cores) at 150 tokens, past the window, with
    padding; the weights go over in memory (the mapping without a 600 MB file)."""
    config = ModernBertConfig.from_name("modernbert-base", vocab_size=512, pad_token_id=0, cls_token_id=1,
                                        sep_token_id=2, bos_token_id=1, eos_token_id=2, num_hidden_layers=layers)
    hf_config = transformers.ModernBertConfig(**{k: v for k, v in config.to_hf_dict().items() if k != "architectures"})
    # imported before torch's init functions are stubbed below: transformers keeps them when imported
    hf_class = transformers.ModernBertModel
    with undrawn_init():  # random weights drawn below, faster than either init (truncated normals)
        hf = hf_class(hf_config).eval()
        ours = ModernBertModel(config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.02)
    assert load_into(ours, hf.state_dict()) == []
    assert ours.num_parameters() == config.num_parameters() == sum(p.numel() for p in hf.parameters())
    ids, mask = batch(150, 512)
    ids, mask = ids[:2], mask[:2]  # a full row and a padded one: both longer than the window
    with torch.no_grad():
        expect = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask, unpadded=True)
    assert_close(got[mask.bool()], expect[mask.bool()], rtol=1e-5, atol=1e-5)


def test_bert_kits_own_model_loads_in_transformers(tmp_path):
    config = ModernBertConfig.from_name("modernbert-tiny")
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(config).eval()
    assert ours.decoder.weight is ours.bert.embeddings.word_embeddings.weight  # tied
    ours.save_pretrained(tmp_path)
    assert "decoder.weight" not in to_hf_state_dict(ours)
    hf = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = batch(40, 512)
    with torch.no_grad():
        keep = mask.bool()
        assert_close(ours(ids, mask)[keep], hf(input_ids=ids, attention_mask=mask).logits[keep], rtol=1e-5, atol=1e-5)
        labels = torch.full_like(ids, -100)
        labels[0, 3], labels[1, 7] = 5, 9
        assert_close(ours(ids, mask, labels=labels), ours(ids, mask)[labels != -100], rtol=1e-5, atol=1e-5)
    assert load_hf_config(tmp_path) == config


def test_packed_sequences_attend_only_to_themselves():
    config = ModernBertConfig(**{k: v for k, v in TINY.items() if k in ModernBertConfig.__dataclass_fields__})
    torch.manual_seed(0)
    model = ModernBertModel(config).eval()
    a, b = torch.randint(3, 99, (25,)), torch.randint(3, 99, (9,))
    with torch.no_grad():
        packed = model.forward_packed(torch.cat([a, b]), torch.tensor([0, 25, 34]), 25)
        assert_close(packed[:25], model(a[None])[0], rtol=1e-5, atol=1e-5)
        assert_close(packed[25:], model(b[None])[0], rtol=1e-5, atol=1e-5)


def test_a_sliding_layer_sees_64_positions_each_side():
    """One local layer, window 128 (HF's default): position 0 depends on 64 tokens to its right, no more."""
    config = ModernBertConfig.from_name("modernbert-tiny", num_hidden_layers=1, layer_types=["sliding_attention"])
    torch.manual_seed(0)
    model = ModernBertModel(config).eval()
    ids = torch.randint(3, 512, (1, 200))
    with torch.no_grad():
        base = model(ids)[0, 0]
        for far, changes in ((64, True), (65, False), (150, False)):
            other = ids.clone()
            other[0, far] = (other[0, far] + 1) % 512
            assert (model(other)[0, 0] - base).abs().max() > 1e-6 if changes else torch.equal(model(other)[0, 0], base)


def test_the_attention_function_is_pluggable():
    """A fast path swaps each layer's `attend`; it gets the window as a number, padded or packed."""
    config = ModernBertConfig.from_name("modernbert-tiny")
    model = ModernBertModel(config).eval()
    seen = []

    def spy(q, k, v, mask, packed, window, dropout_p):
        seen.append((q.dim(), window, packed is not None))
        return sdpa_attention(q, k, v, mask, packed, window, dropout_p)

    for layer in model.layers:
        layer.attention.attend = spy
    ids, mask = batch(20, 512)
    with torch.no_grad():
        model(ids, mask)
        model(ids, mask, unpadded=True)
    assert seen == [(4, None, False), (4, 64, False), (4, 64, False), (3, None, True), (3, 64, True), (3, 64, True)]


def test_new_heads_get_modernberts_init_and_a_warning(tmp_path):
    ModernBertModel(ModernBertConfig.from_name("modernbert-tiny")).save_pretrained(tmp_path)
    with pytest.warns(NewWeightsWarning, match="classifier.bias, classifier.weight, head.dense.weight, "
                                               "head.norm.weight are newly initialised"):
        model = ModernBertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert torch.equal(model.head.norm.weight, torch.ones(64))
    assert torch.equal(model.classifier.bias, torch.zeros(3))
    std = model.classifier.weight.std().item()
    assert 0.5 * 64 ** -0.5 < std < 1.1 * 64 ** -0.5 and model.classifier.weight.abs().max() <= 2 * 64 ** -0.5
    for cls in (ModernBertForTokenClassification, ModernBertForQuestionAnswering, ModernBertForMaskedLM):
        with pytest.warns(NewWeightsWarning):
            assert torch.isfinite(cls.from_pretrained(tmp_path).head.norm.weight).all()


def test_the_two_config_forms_of_the_hub_are_the_same_model():
    older = {"model_type": "modernbert", "num_hidden_layers": 6, "global_attn_every_n_layers": 3,
             "global_rope_theta": 80000.0, "local_rope_theta": 5000.0, "layer_norm_eps": 1e-5,
             "reference_compile": True, "position_embedding_type": "absolute"}
    newer = {"model_type": "modernbert", "num_hidden_layers": 6,
             "layer_types": ["full_attention", "sliding_attention", "sliding_attention"] * 2,
             "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 80000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}}
    a, b = ModernBertConfig.from_hf_dict(older), ModernBertConfig.from_hf_dict(newer)
    assert a == b and a.rope_theta("sliding_attention") == 5000.0
    hf = transformers.ModernBertConfig(**{k: v for k, v in a.to_hf_dict().items() if k != "architectures"})
    assert hf.layer_types == a.layer_types and hf.rope_parameters["full_attention"]["rope_theta"] == 80000.0
    assert hf.sliding_window == a.sliding_window == 64
    assert a.to_hf_dict()["global_attn_every_n_layers"] == 3  # transformers 4.x reads these


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0}}}, "rope_type 'yarn' is not implemented"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings: false"),
    ({"layer_types": ["full_attention"]}, "layer_types must name 22 layers"),
    ({"hidden_activation": "swish"}, "hidden_activation='swish' is not a valid choice"),
    ({"classifier_pooling": "max"}, "classifier_pooling='max' is not a valid choice"),
    ({"global_attn_every_n_layers": 0}, "global_attn_every_n_layers=0 is out of range"),
])
def test_configs_bert_kit_does_not_build_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModernBertConfig.from_hf_dict({"model_type": "modernbert", **changes})


def test_a_folder_of_the_other_architecture_is_refused_by_name(tmp_path):
    ModernBertModel(ModernBertConfig.from_name("modernbert-tiny")).save_pretrained(tmp_path / "modern")
    BERTModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=37)).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="holds a modernbert model, which BERTModel is not"):
        BERTModel.from_pretrained(tmp_path / "modern")
    with pytest.raises(ValueError, match="holds a bert model, which ModernBertModel is not"):
        ModernBertModel.from_pretrained(tmp_path / "bert")
    with pytest.raises(UnsupportedModelError, match="is read by ModernBertConfig"):
        BertConfig.from_hf_dict({"model_type": "modernbert"})


def test_flops_count_the_keys_each_window_really_holds():
    from bert_kit.modernbert import estimate_mfu, flops_per_token, keys_seen

    for T, w in [(1, 2), (5, 64), (128, 64), (129, 64), (300, 64), (8192, 64), (10, 0), (10, 3)]:
        pos = torch.arange(T)
        brute = ((pos[:, None] - pos[None, :]).abs() <= w).sum().item() / T
        assert keys_seen(T, w) == pytest.approx(brute, rel=1e-12), (T, w)
    assert keys_seen(8192, None) == 8192 and keys_seen(8192, 64) == pytest.approx(129 - 64 * 65 / 8192, rel=1e-12)
    base = ModernBertConfig.from_name("modernbert-base")  # 22 layers: 8 global, 14 within +-64
    H, I, V, T = 768, 1152, 50368, 1024
    per_layer = 4 * H * H + 3 * H * I
    attention = 2 * H * (8 * T + 14 * keys_seen(T, 64))
    assert flops_per_token(base, T) == pytest.approx(6 * (22 * per_layer + attention + 0.3 * (H * H + H * V)))
    assert flops_per_token(base, T, training=False) == pytest.approx(2 * (22 * per_layer + attention))
    everywhere = ModernBertConfig.from_name("modernbert-base", layer_types=["full_attention"] * 22)
    assert flops_per_token(everywhere, 8192) - flops_per_token(base, 8192) == pytest.approx(
        6 * 2 * H * 14 * (8192 - keys_seen(8192, 64)))
    assert estimate_mfu(base, T, 1e5, 1e15) == pytest.approx(flops_per_token(base, T) * 1e5 / 1e15)
