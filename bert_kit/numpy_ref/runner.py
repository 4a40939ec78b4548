"""Train and evaluate the NumPy BERT on synthetic MLM + NSP data, driven by a YAML file.

    python -m bert_kit.numpy_ref --config configs/numpy_ref.yaml --output results.json

The loop is plain SGD through ``BertModel.backward(grad_mlm, grad_nsp, lr)``. MLM batches score only
the MLM loss and pair batches only the NSP loss: single-segment batches carry nsp label 1 in the
original API, but scoring them would reward the trivial rule "no segment B means 1".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .data import BertBatch, generate_synthetic_bert_batches
from .model import BertModel

logger = logging.getLogger("bert_kit.numpy_ref")


@dataclass
class RunConfig:
    """Settings of one run; every field is a valid YAML key."""

    vocab_size: int = 24
    """Vocabulary size, special tokens included."""
    dim_model: int = 32
    """Hidden size H."""
    num_heads: int = 2
    """Attention heads; must divide dim_model."""
    dim_ff: int = 64
    """Feed-forward inner size."""
    num_layers: int = 2
    """Encoder layers."""
    activation: str = "gelu"
    """Feed-forward and MLM-transform activation: gelu or relu."""
    position_embedding: str = "learned"
    """learned or sinusoidal (fixed)."""
    dtype: str = "float32"
    """float32 (fast) or float64 (exact reference)."""
    seq_len: int = 15
    """Tokens per sequence, specials included; also the model's max_seq_len."""
    batch_size: int = 32
    """Sequences per batch."""
    mask_prob: float = 0.15
    """Probability that a content token is masked."""
    num_train_batches: int = 1000
    """Size of the training set, in batches (cycled through when steps exceed it)."""
    num_test_batches: int = 16
    """Size of the held-out test set, in batches."""
    steps: int = 1000
    """SGD steps."""
    lr: float = 0.5
    """Peak SGD learning rate."""
    warmup_steps: int = 50
    """Linear warm-up from 0 to lr over this many steps, then linear decay to 0 at the last step."""
    initializer_range: float = 0.1
    """Std of the initial weight matrices. BERT uses 0.02; a tiny model under plain SGD escapes the
    uniform-attention start much sooner from ~0.1."""
    seed: int = 0
    """Seed of the weights and of the data (the test set uses seed + 1)."""
    log_every: int = 100
    """Log the running losses every this many steps (0 = never)."""
    num_threads: int = 1
    """BLAS threads (0 = the library's default). Small matrices run fastest on one thread."""

    CHOICES = {"activation": ("gelu", "relu"), "position_embedding": ("learned", "sinusoidal"),
               "dtype": ("float32", "float64")}

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "float" and isinstance(value, str):
                try:  # YAML 1.1 reads "5e-1" (no dot) as a string
                    value = float(value)
                    setattr(self, field.name, value)
                except ValueError:
                    pass
            expected = {"int": int, "float": (int, float), "str": str}[field.type]
            if isinstance(value, bool) or not isinstance(value, expected):
                raise ValueError(f"{field.name} must be {field.type}, got {value!r}")
            if field.name in self.CHOICES and value not in self.CHOICES[field.name]:
                raise ValueError(f"{field.name} must be one of {self.CHOICES[field.name]}, got {value!r}")
        for name in ("vocab_size", "dim_model", "num_heads", "dim_ff", "num_layers", "seq_len", "batch_size",
                     "num_train_batches", "num_test_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dim_model % self.num_heads:
            raise ValueError(f"dim_model ({self.dim_model}) must be divisible by num_heads ({self.num_heads})")
        if self.seq_len < 5:
            raise ValueError(f"seq_len must be >= 5 (room for [CLS] A [SEP] B [SEP]), got {self.seq_len}")
        if not 0.0 <= self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in [0, 1], got {self.mask_prob}")
        for name in ("lr", "initializer_range"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps", "log_every", "num_threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "RunConfig":
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = [key for key in values if key not in valid]
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown}; valid keys: {valid}")
        try:
            return cls(**values)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RunConfig":
        from bert_kit.checks import load_yaml, read_text, resolve_plain  # the YAML reader of every run config

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        values = resolve_plain(load_yaml(read_text(path), str(path)))  # YAML 1.2 numbers; duplicate keys refused
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: top level must be a mapping of keys to values, got {type(values).__name__}")
        return cls.from_dict(values, source=str(path))


@contextlib.contextmanager
def blas_threads(num_threads: int) -> Iterator[None]:
    """Limit BLAS threads inside the block (needs threadpoolctl; 0 leaves the default).

    Tiny matrices gain nothing from threads, and on a busy machine spinning BLAS threads can make
    a step ten times slower.
    """
    if num_threads == 0:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        logger.info("threadpoolctl not installed: BLAS keeps its default thread count")
        yield
        return
    with threadpool_limits(limits=num_threads, user_api="blas"):
        yield


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def learning_rate(step: int, config: RunConfig) -> float:
    """BERT's schedule for step 1..steps: linear warm-up to ``lr``, then linear decay to 0."""
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    return config.lr * (config.steps - step + 1) / max(config.steps - config.warmup_steps, 1)


def train_step(model: BertModel, batch: BertBatch, lr: float) -> tuple[float, float]:
    """Forward, both losses, backward with an SGD step; returns (mlm_loss, nsp_loss)."""
    mlm_logits, nsp_logits = model.forward(batch.input_ids, batch.segment_ids, batch.masked_positions)
    mlm_loss, grad_mlm = model.mlm_loss_and_grad(mlm_logits, batch.mlm_labels)
    nsp_labels = batch.nsp_labels if batch.is_pair else np.full_like(batch.nsp_labels, -100)
    nsp_loss, grad_nsp = model.nsp_loss_and_grad(nsp_logits, nsp_labels)
    model.backward(grad_mlm, grad_nsp, lr)
    return mlm_loss, nsp_loss


def evaluate(model: BertModel, batches: list[BertBatch]) -> dict[str, float]:
    """Token-weighted MLM loss/accuracy and sequence-weighted NSP loss/accuracy (None if absent)."""
    mlm_sum = mlm_correct = mlm_count = nsp_sum = nsp_correct = nsp_count = 0.0
    for batch in batches:
        mlm_logits, nsp_logits = model.forward(batch.input_ids, batch.segment_ids, batch.masked_positions)
        real = batch.mlm_labels >= 0
        if real.any():
            loss, _ = model.mlm_loss_and_grad(mlm_logits, batch.mlm_labels)
            mlm_sum += loss * real.sum()
            mlm_correct += (mlm_logits.argmax(-1) == batch.mlm_labels)[real].sum()
            mlm_count += real.sum()
        if batch.is_pair:
            loss, _ = model.nsp_loss_and_grad(nsp_logits, batch.nsp_labels)
            nsp_sum += loss * len(batch.nsp_labels)
            nsp_correct += (nsp_logits.argmax(-1) == batch.nsp_labels).sum()
            nsp_count += len(batch.nsp_labels)

    def ratio(a: float, b: float) -> float | None:
        return float(a / b) if b else None  # None: no batch of that kind (null in the JSON)

    return {"mlm_loss": ratio(mlm_sum, mlm_count), "mlm_accuracy": ratio(mlm_correct, mlm_count),
            "nsp_loss": ratio(nsp_sum, nsp_count), "nsp_accuracy": ratio(nsp_correct, nsp_count)}


class BertRunner:
    """Loads a YAML run config (defaults when ``config_path`` is None), then ``run()`` trains and evaluates.

    ``overrides`` replaces single keys (validated like the file), e.g. ``{"steps": 10}``.
    """

    def __init__(self, config_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> None:
        base = RunConfig() if config_path is None else RunConfig.from_yaml(config_path)
        values = dataclasses.asdict(base) | dict(overrides or {})
        self.config = RunConfig.from_dict(values, source="overrides" if overrides else "config")
        logger.info("run config: %s", json.dumps(dataclasses.asdict(self.config)))

    def build_model(self) -> BertModel:
        c = self.config
        return BertModel(c.vocab_size, c.dim_model, c.num_heads, c.dim_ff, c.num_layers, c.seq_len,
                         activation=c.activation, position_embedding=c.position_embedding,
                         dtype=np.dtype(c.dtype), seed=c.seed, initializer_range=c.initializer_range)

    def run(self) -> dict[str, float | None]:
        """Returns train/test MLM and NSP losses, test accuracies, the initial test losses and timing.

        A metric is None when its data set holds no batch of that kind (possible with very few batches).
        """
        with blas_threads(self.config.num_threads):
            return self._run()

    def _run(self) -> dict[str, float | None]:
        c = self.config
        model = self.build_model()
        logger.info("model: %d parameters, %s", model.num_parameters(), c.dtype)
        make = dict(batch_size=c.batch_size, seq_len=c.seq_len, vocab_size=c.vocab_size, mask_prob=c.mask_prob)
        train = generate_synthetic_bert_batches(c.num_train_batches, random_seed=c.seed, **make)
        test = generate_synthetic_bert_batches(c.num_test_batches, random_seed=c.seed + 1, **make)
        initial = evaluate(model, test)
        logger.info("before training: test mlm %s nsp %s", _fmt(initial["mlm_loss"]), _fmt(initial["nsp_loss"]))

        start = time.perf_counter()
        window: dict[str, list[float]] = {"mlm": [], "nsp": []}
        for step in range(1, c.steps + 1):
            batch = train[(step - 1) % len(train)]
            mlm_loss, nsp_loss = train_step(model, batch, learning_rate(step, c))
            window["nsp" if batch.is_pair else "mlm"].append(nsp_loss if batch.is_pair else mlm_loss)
            if c.log_every and (step % c.log_every == 0 or step == c.steps):
                means = {k: float(np.mean(v)) if v else None for k, v in window.items()}
                logger.info("step %d/%d  mlm %s  nsp %s  (%.1f steps/s)", step, c.steps, _fmt(means["mlm"]),
                            _fmt(means["nsp"]), step / (time.perf_counter() - start))
                window = {"mlm": [], "nsp": []}
        seconds = time.perf_counter() - start

        on_train, on_test = evaluate(model, train), evaluate(model, test)
        results = {
            "train_mlm_loss": on_train["mlm_loss"], "train_nsp_loss": on_train["nsp_loss"],
            "test_mlm_loss": on_test["mlm_loss"], "test_nsp_loss": on_test["nsp_loss"],
            "test_nsp_accuracy": on_test["nsp_accuracy"], "test_mlm_accuracy": on_test["mlm_accuracy"],
            "initial_test_mlm_loss": initial["mlm_loss"], "initial_test_nsp_loss": initial["nsp_loss"],
            "train_seconds": seconds, "steps": c.steps,
        }
        self.model = model  # kept for inspection or save_pretrained
        logger.info("results: %s", json.dumps(results))
        return results


def main(argv: list[str] | None = None) -> dict[str, float | None]:
    """CLI: ``--config`` YAML (defaults if omitted), ``--output`` JSON file for the results."""
    parser = argparse.ArgumentParser(prog="python -m bert_kit.numpy_ref", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="YAML run config (keys of RunConfig)")
    parser.add_argument("--output", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        runner = BertRunner(args.config)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))  # exits with status 2 and the message
    results = runner.run()
    print(json.dumps(results, indent=2))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return results
