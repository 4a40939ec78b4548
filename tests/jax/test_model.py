"""The JAX model against the PyTorch one: the same parameter names, and fp32 forwards of every head
equal within 1e-5 (max abs) on the same weights, padding included, on random tiny configs and on
the real all-MiniLM-L6-v2 weights.

Run: .venv/bin/python -m pytest tests/jax/test_model.py -q
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy
from flax import nnx  # noqa: E402

import bert_kit.jax as bj  # noqa: E402
from bert_kit import heads as torch_heads  # noqa: E402
from bert_kit.jax.model import attention  # noqa: E402
from bert_kit.jax.randomness import HostKeys, derive  # noqa: E402
from bert_kit.jax.weights import torch_name  # noqa: E402
from tests.jax.common import jax_twin, max_abs, padded_batch, tiny  # noqa: E402

# name -> (class name in HEAD_CLASSES, head arguments): every head, regression included
HEADS = {
    "base": ("BertModel", {}),
    "pretraining": ("BertForPreTraining", {}),
    "mlm": ("BertForMaskedLM", {}),
    "classification": ("BertForSequenceClassification", {"num_labels": 3}),
    "regression": ("BertForSequenceClassification", {"num_labels": 1}),
    "tokens": ("BertForTokenClassification", {"num_labels": 5}),
    "qa": ("BertForQuestionAnswering", {}),
}


def _outputs(out) -> list:
    return list(out) if isinstance(out, tuple) else [out]


def test_parameters_carry_the_torch_names_and_shapes():
    config = tiny(position_embedding_type="sinusoidal")
    for name, (arch, args) in HEADS.items():
        abstract = nnx.eval_shape(lambda: bj.HEAD_CLASSES[arch](config, **args))  # shapes only: no compute
        ours = {}
        for path, value in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
            name_, transposed = torch_name(path)
            ours[name_] = tuple(reversed(value.get_value().shape)) if transposed else tuple(value.get_value().shape)
        theirs = {k: tuple(v.shape) for k, v in torch_heads.HEAD_CLASSES[arch](config, **args).state_dict().items()
                  if k != "mlm.decoder.weight"}  # tied: the word embeddings, not a parameter of its own
        assert ours == theirs, name


@pytest.mark.parametrize("config, lengths, with_types", [
    (tiny(), [12, 7, 3, 12], True),
    (tiny(num_hidden_layers=1, num_attention_heads=2, hidden_act="relu", position_embedding_type="sinusoidal",
          type_vocab_size=3, layer_norm_eps=1e-5, pad_token_id=3), [5, 16, 9], False),
], ids=["learned-gelu", "sinusoidal-relu-no-segments"])
def test_every_head_matches_torch(config, lengths, with_types):
    batch = padded_batch(config, lengths, max(lengths), seed=len(lengths))
    types = batch["token_type_ids"] if with_types else None
    torch_models, jax_models = {}, {}
    for seed, (name, (arch, args)) in enumerate(HEADS.items()):
        torch.manual_seed(seed)
        torch_models[name] = torch_heads.HEAD_CLASSES[arch](config, **args).eval()
        jax_models[name] = jax_twin(torch_models[name], **args)

    @nnx.jit  # one program for every head: one compilation
    def forward(models, ids, mask, types):
        return {name: m(ids, mask, types) for name, m in models.items()}

    with jax.default_matmul_precision("highest"):  # float32 products on a GPU too (XLA's default there is TF32)
        got = forward(jax_models, batch["input_ids"], batch["attention_mask"], types)
    with torch.no_grad():
        inputs = [torch.as_tensor(batch["input_ids"]), torch.as_tensor(batch["attention_mask"]),
                  None if types is None else torch.as_tensor(types)]
        for name, model in torch_models.items():
            expected = _outputs(model(*inputs))
            ours = _outputs(got[name])
            assert [tuple(o.shape) for o in ours] == [tuple(e.shape) for e in expected], name
            for o, e in zip(ours, expected):
                assert max_abs(o, e) <= 1e-5, name


def test_minilm_matches_torch_on_real_text(minilm_path):
    """Hidden states within assert_close(rtol=1e-5, atol=5e-5): 6 layers of float32 rounding (1-2
    ulp a layer, XLA's and torch's CPU kernels summing in other orders, which differ from one CPU
    to another) reached 3.7e-5 on activations of up to 6 (an AMD EPYC; under 3e-5 on others). What
    users take from the model, the pooled output and the normalised mean-pooled sentence
    embedding, within 1e-5 max abs."""
    from bert_kit import BERTModel
    from bert_kit.tokenizer import get_tokenizer

    texts = ["A JAX model that reads the checkpoints everyone else uses.", "Short one.",
             "The quick brown fox jumps over the lazy dog, twice, and then sleeps."]
    batch = get_tokenizer(minilm_path)(texts, return_tensors="np")
    assert batch["attention_mask"].min() == 0  # padded rows are part of the check
    ours = bj.BERTModel.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")  # the hub name's local copy
    hidden, pooled = nnx.jit(lambda m, b: (h := m(**b), m.pool(h)))(ours, batch)
    reference = BERTModel.from_pretrained(minilm_path)
    with torch.no_grad():
        expected = reference(**{k: torch.as_tensor(v) for k, v in batch.items()})
        torch.testing.assert_close(torch.as_tensor(np.asarray(hidden)), expected, rtol=1e-5, atol=5e-5)
        assert max_abs(pooled, reference.pool(expected)) <= 1e-5
    mask = batch["attention_mask"][..., None]
    mean = (np.asarray(hidden) * mask).sum(1) / mask.sum(1)
    expected_mean = (expected.numpy() * mask).sum(1) / mask.sum(1)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    assert max_abs(unit(mean), unit(expected_mean)) <= 1e-5


def test_reference_attention_equals_jaxs_and_drops_with_a_seed():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 3, 8)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(np.arange(6)[None, :] < np.array([[6], [2]]))  # (B, T): row 1 has 2 tokens

    @jax.jit
    def attentions(q, k, v, mask):
        seed = jnp.asarray([1, 2], jnp.uint32)
        return (jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :], implementation="xla"),
                attention(q, k, v, mask), attention(q, k, v, mask, 0.0, seed), attention(q, k, v, mask, 0.5, seed))

    jaxs, plain, no_drop, dropped = attentions(q, k, v, mask)
    assert max_abs(plain, jaxs) <= 1e-6 and max_abs(no_drop, plain) == 0.0
    assert max_abs(dropped, plain) > 1e-2  # the probabilities were dropped


def test_fp16_attention_trains_on_the_cpu_of_a_machine_with_gpus(monkeypatch):
    """fp16 scores take XLA's F16_F16_F32 algorithm on GPUs, which XLA's CPU backend lacks: the
    choice follows the devices the program is compiled for, not JAX's default backend (a GPU where
    a run asks for device=cpu); its gradient is attention's in float32, to fp16's precision."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 3, 8)), jnp.float32) for _ in range(3))

    def loss(q, k, v):
        return (attention(q, k, v, None).astype(jnp.float32) ** 2).sum()

    half = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(x.astype(jnp.float16) for x in (q, k, v)))
    full = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for h, f in zip(half, full):
        assert h.dtype == jnp.float16 and max_abs(h.astype(jnp.float32), f) <= 2e-2 * float(jnp.abs(f).max())


def test_gelu_is_torchs_exact_gelu():
    """x/2 (1 + erf(x/sqrt 2)) as torch computes it: within 2e-6 in float32, two rounding steps in bfloat16."""
    from bert_kit.jax.model import gelu

    x = np.linspace(-12, 12, 4001, dtype=np.float32)
    expected = torch.nn.functional.gelu(torch.from_numpy(x))
    assert max_abs(np.asarray(gelu(jnp.asarray(x))), expected.numpy()) <= 2e-6
    half = np.asarray(gelu(jnp.asarray(x, jnp.bfloat16)).astype(jnp.float32))
    reference = torch.nn.functional.gelu(torch.from_numpy(x).bfloat16().float()).bfloat16().float().numpy()
    # two bfloat16 steps apart at most, or both within 1e-6 of zero (in the left tail 1 + erf cancels in float32)
    assert np.all(np.abs(half - reference) <= np.maximum(np.abs(reference) * 2.0 ** -7, 1e-6))


def test_dropout_runs_only_when_rngs_are_given():
    config = tiny(num_hidden_layers=1, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    batch = padded_batch(config, [6, 4], 6)
    torch.manual_seed(0)
    reference = torch_heads.BERTForSequenceClassification(config, num_labels=2).eval()
    model = jax_twin(reference, num_labels=2)

    @nnx.jit
    def logits(model, batch):
        return [model(**batch)] + [model(**batch, rngs=nnx.Rngs(dropout=key)) for key in (1, 2)]

    eval_logits, train_1, train_2 = logits(model, batch)
    with torch.no_grad():  # eval: no dropout, as the torch model in eval mode
        assert max_abs(eval_logits, reference(*(torch.as_tensor(v) for v in batch.values()))) <= 1e-5
    assert max_abs(train_1, eval_logits) > 1e-4 and max_abs(train_1, train_2) > 1e-4  # the key decides


def test_shapes_are_checked_with_clear_errors():
    config = tiny()
    model = nnx.eval_shape(lambda: bj.BERTModel(config))  # the checks come before any computation
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model(np.ones((1, config.max_position_embeddings + 1), np.int32))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model(np.ones((2, 5), np.int32), np.ones((2, 4), np.int32))
    with pytest.raises(ValueError, match="integers of shape"):
        model(np.ones((2, 5), np.float32))



@pytest.mark.parametrize("bad", [
    {"input_ids": [[1, 2, 999_999]]},  # past the vocabulary: NaN logits
    {"input_ids": [[1, -3, 2]]},
    {"token_type_ids": [[0, 5, 0]]},  # past type_vocab_size: finite garbage
    {"token_type_ids": [[0, -1, 0]]},
    {"attention_mask": [[1, 2, 1]]},
    {"attention_mask": [[1, 1, 1], [0, 0, 0]], "input_ids": [[1, 2, 3], [1, 2, 3]]},
])
def test_values_are_checked_on_the_host_as_the_torch_model_does(bad):
    """Token ids past the vocabulary (NaN logits) and type ids past type_vocab_size (wrong
    logits) are refused by both engines, with the same message; a jitted call is not stopped."""
    config = tiny()
    inputs = {"input_ids": [[1, 2, 3]], **bad}
    inputs = {k: np.asarray(v, np.int32) for k, v in inputs.items()}
    inputs = {"attention_mask": np.ones_like(inputs["input_ids"]), "token_type_ids": np.zeros_like(inputs["input_ids"]),
              **inputs}
    with pytest.raises(ValueError) as from_torch:
        torch_heads.BERTModel(config)(*(torch.as_tensor(inputs[k]).long() for k in
                                        ("input_ids", "attention_mask", "token_type_ids")))
    model = bj.BERTModel(config)
    args = [inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")]
    with pytest.raises(ValueError) as from_jax:
        model(*args)
    assert str(from_jax.value) == str(from_torch.value)
    with pytest.raises(ValueError, match="out of range|attention_mask"):
        model(*(jnp.asarray(a) for a in args))  # device arrays too
    nnx.jit(lambda m, *a: m(*a))(model, *args)  # traced: shapes only, no host sync


def test_the_engine_imports_without_torch():
    code = "import sys, bert_kit.jax; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_step_keys_draw_without_threefry_or_asking_tracers_their_origin(monkeypatch):
    """A training call's rngs (`HostKeys`): derive(key, 0), derive(key, 1), ... in order; a model
    with dropout draws its masks from the key alone; its traced forward runs no threefry (20 rounds
    inlined at each draw); and no draw makes JAX trace a tracer's origin (flax's update of a traced
    counter does: a scan of the program traced so far, per draw)."""
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer

    key = jax.random.key(3)
    keys = HostKeys(key)
    drawn = [jax.random.key_data(keys.dropout()) for _ in range(3)]
    for i, data in enumerate(drawn):
        np.testing.assert_array_equal(data, jax.random.key_data(derive(key, i)))
    assert len({tuple(np.asarray(d).tolist()) for d in drawn}) == 3

    model = bj.BERTForSequenceClassification(tiny(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                                             num_labels=2, rngs=nnx.Rngs(0))
    batch = padded_batch(model.config, [7, 4], 7)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, key: nnx.merge(graphdef, state)(**batch, rngs=HostKeys(key)))
    first = forward(state, jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(first), np.asarray(forward(state, jax.random.key(3))))
    assert max_abs(first, forward(state, jax.random.key(4))) > 1e-3  # the key draws the masks
    assert max_abs(first, nnx.merge(graphdef, state)(**batch)) > 1e-3  # and they drop something
    threefry = ("random_fold_in", "random_split", "random_bits")  # jax.random's draws, each threefry's rounds
    traced = str(jax.make_jaxpr(forward)(state, jax.random.key(3)))
    assert not [name for name in threefry if name in traced]
    assert threefry[0] in str(jax.make_jaxpr(lambda k: jax.random.fold_in(k, 1))(key))  # (what the check looks for)

    origins = []
    original = DynamicJaxprTracer._origin_msg
    monkeypatch.setattr(DynamicJaxprTracer, "_origin_msg", lambda self: origins.append(1) or original(self))
    jax.jit(lambda key: [HostKeys(key).dropout() for _ in range(3)]).trace(jax.random.key(0))
    assert origins == []
    jax.jit(lambda key: [nnx.Rngs(dropout=key).dropout() for _ in range(3)]).trace(jax.random.key(0))
    assert origins  # what the test guards against: flax's traced counter still asks


def test_the_scanned_encoder_computes_the_loop_and_draws_its_dropout_from_the_step_key():
    """`BertEncoder.scan` (the blocks as one lax.scan over stacked weights, for short fine-tunes):
    the loop's outputs and gradients within float32 rounding; in training, the same key gives the
    same outputs, another key others; blocks that differ in structure are called in turn."""
    config = tiny(num_hidden_layers=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = bj.BERTForSequenceClassification(config, num_labels=3, rngs=nnx.Rngs(0))
    batch = padded_batch(config, [12, 7, 3], 12)
    graphdef, state = nnx.split(model)

    def loss(state, scan: bool, key=None):
        m = nnx.merge(graphdef, state)
        m.bert.encoder.scan = scan
        return (m(**batch, rngs=None if key is None else HostKeys(key)) ** 2).sum()

    loop, scanned = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(state, scan) for scan in (False, True))
    assert abs(float(loop[0]) - float(scanned[0])) <= 1e-5 * abs(float(loop[0]))
    assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(loop[1]), jax.tree.leaves(scanned[1]))) <= 1e-5
    train = jax.jit(loss, static_argnums=1)
    key = jax.random.key(7)
    assert float(train(state, True, key)) == float(train(state, True, key))
    assert float(train(state, True, key)) not in (float(train(state, True, jax.random.key(8))), float(loop[0]))

    model.bert.encoder.scan = True
    model.bert.encoder.layers[1].attention.backend = lambda *args: attention(*args)  # one block unlike the others
    assert max_abs(model(**batch), nnx.merge(graphdef, state)(**batch)) <= 1e-5
