"""Helpers of the JAX engine's tests: tiny configs, padded batches, torch weights into a JAX model."""

from __future__ import annotations

import numpy as np

from bert_kit.config import BertConfig


def tiny(**overrides) -> BertConfig:
    """A 2-layer, 32-wide BERT with dropout off (parity needs deterministic forwards)."""
    fields = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertConfig(**{**fields, **overrides})


def padded_batch(config: BertConfig, lengths: list[int], T: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded input_ids, attention_mask and token_type_ids (B, T); row b holds lengths[b] tokens."""
    rng = np.random.default_rng(seed)
    B = len(lengths)
    mask = (np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, config.vocab_size, (B, T)), config.pad_token_id)
    types = np.where(mask == 1, rng.integers(0, config.type_vocab_size, (B, T)), 0)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def jax_twin(torch_model, **head_args):
    """The `bert_kit.jax` model of the torch model's class, holding its weights. Built from shapes
    only (`nnx.eval_shape`): random weights would cost a compilation per shape, then be replaced."""
    from flax import nnx

    from bert_kit.jax import HEAD_CLASSES
    from bert_kit.jax.weights import load_torch_state_dict

    cls = HEAD_CLASSES[torch_model.hf_architecture]
    model = nnx.eval_shape(lambda: cls(torch_model.config, **head_args))
    state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items() if k != "mlm.decoder.weight"}
    load_torch_state_dict(model, state, strict=True)
    return model


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def classifier_with_dropout(config: BertConfig):
    """A 2-label `bert_kit.jax` classifier of `config` (nnx seed 0), the summed logits of a fixed
    padded batch (2 x 32, rows of 32 and 20 tokens) with dropout from key 3 as a function of the
    model, and that loss and its gradients jitted: (model, loss, step)."""
    from flax import nnx

    from bert_kit.jax.model import BERTForSequenceClassification

    model = BERTForSequenceClassification(config, num_labels=2, rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(1, config.vocab_size, (2, 32)).astype(np.int32)
    mask = (np.arange(32)[None] < np.array([[32], [20]])).astype(np.int32)

    def loss(m):
        return m(ids, mask, rngs=nnx.Rngs(dropout=3)).sum()

    return model, loss, nnx.jit(lambda m: nnx.value_and_grad(loss)(m))


def random_model(cls, config: BertConfig, seed: int = 0, **head_args):
    """A `bert_kit.jax` model of random weights drawn by NumPy: N(0, 0.05) matrices and biases,
    LayerNorm scales around 1. Nonzero biases and scales catch more than BERT's init would; and
    NumPy draws them without compiling a random-number program per parameter shape, as nnx would."""
    import jax.numpy as jnp
    from flax import nnx

    model = nnx.eval_shape(lambda: cls(config, **head_args))
    rng = np.random.default_rng(seed)
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = variable.get_value().shape
        value = rng.normal(0.0, 0.05, shape)
        if "norm" in str(path[-2]) and path[-1] == "weight":
            value += 1.0
        variable.set_value(jnp.asarray(value, jnp.float32))
    return model


def tiny_engine(num_labels: int, **settings):
    """A `JaxEngine` over the CPU devices for a seeded 1-layer, 16-wide classifier (`num_labels` 1:
    regression), with the run settings the engine reads (`settings` overrides them: parallel=...)."""
    from types import SimpleNamespace

    import torch

    from bert_kit.heads import BERTForSequenceClassification
    from bert_kit.jax.engine import JaxEngine

    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    job = SimpleNamespace(model=BERTForSequenceClassification(config, num_labels=num_labels),
                          tokenizer=SimpleNamespace(pad_token_id=0))
    cfg = SimpleNamespace(**{**dict(device="cpu", precision="fp32", optimizer="adamw", clip_grad=1.0,
                                    betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, seed=0, max_length=16,
                                    batch_size=4), **settings})
    return JaxEngine(job, cfg, None)
