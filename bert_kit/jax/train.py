"""Training the JAX engine: losses as plain functions, AdamW with BERT's schedule, and one jitted
train step, data parallel over every device of every host through `jax.sharding`; the devices a
run's `device` setting names (`resolve_devices`), started early (`start_backend`), and its hosts;
the precision a run computes in on them (`resolve_jax_precision`).

    mesh = make_mesh()                                   # every device, one "data" axis
    tx = create_optimizer(lr_schedule(1e-4, warmup_steps=100, total_steps=1000), weight_decay=0.01)
    graphdef, state = init_train_state(model, tx, mesh)  # params replicated, float32
    step = make_train_step(graphdef, tx, mesh, precision="bf16")
    for batch in batches:                                # dicts of NumPy arrays (this host's share)
        state, metrics = step(state, shard_batch(batch, mesh))
    model = nnx.merge(graphdef, state.params)

What the step does, as the torch trainer does (`bert_kit/training/`):
- AdamW with weight decay on matrices only: biases and LayerNorm weights (every 1-D parameter) are
  not decayed (`optim.param_groups`); global-norm gradient clipping; linear warmup, then linear or
  cosine decay, update for update as `optim.lr_multiplier`;
- precision: float32 master weights; with bf16 the step casts them for the forward (the embedding
  tables stay float32), so gradients, optimizer moments and updates stay float32 (the cast's
  backward returns float32 gradients);
- one `jax.jit` over (TrainState, batch): the state is donated (updated in place), the batch is
  sharded on its first axis over the mesh and the state replicated, so XLA adds the gradient
  all-reduce. It returns device arrays only: nothing waits for the device until a metric is read;
- dropout keys come from the state's key and the step (`randomness.derive`): a resumed run draws the
  same masks.
  `prng` picks its generator: JAX's threefry by default; "rbg" (XLA's RngBitGenerator) measured
  the same on an H200 (benchmarks/jax_pretrain.py --prng), so the random bits are not what limits the step.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_kit.jax.compilation import compiler_options
from bert_kit.jax.model import BERTForSequenceClassification, BERTForTokenClassification, _TiedMLM
from bert_kit.jax.randomness import HostKeys, derive

IGNORE_INDEX = -100
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
SCHEDULES = ("linear", "cosine", "constant")


@dataclass
class JaxPrecision:
    """What the engine computes in, and where (results.json's "precision")."""

    name: str  # "bf16", "fp16" or "fp32": the compute dtype (master weights and optimizer are float32)
    devices: list
    reason: str

    def __str__(self) -> str:
        kinds = sorted({d.device_kind for d in self.devices})
        where = f"{len(self.devices)} {self.devices[0].platform} device(s) ({', '.join(kinds)})"
        scaling = " + dynamic loss scaling" if self.name == "fp16" else ""
        return f"JAX {self.name} compute{scaling}, fp32 weights, on {where} ({self.reason})"


def resolve_jax_precision(precision: str, devices: list) -> JaxPrecision:
    """auto: bf16 on GPUs and TPUs, fp32 on the CPU (as the torch engine's `resolve_precision`)."""
    if precision == "fp16" and devices[0].platform == "cpu":  # XLA's CPU backend emulates float16 arithmetic
        return JaxPrecision(precision, devices, "requested; on the CPU float16 runs many times slower than fp32")
    if precision != "auto":
        return JaxPrecision(precision, devices, "requested")
    if devices[0].platform in ("gpu", "tpu"):
        return JaxPrecision("bf16", devices, f"{devices[0].platform} computes in bfloat16")
    return JaxPrecision("fp32", devices, "cpu device: bfloat16 would not speed up training")


# ---- losses: plain functions of logits and labels, in float32 ----------------------------------

def _cross_entropy_sum(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy over the labels that are not -100, and their count. logits (..., C), labels (...)."""
    valid = labels != IGNORE_INDEX
    nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(valid, labels, 0))
    return jnp.where(valid, nll, 0.0).sum(), valid.sum()


def _mean_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    total, count = _cross_entropy_sum(logits, labels)
    return total / jnp.maximum(count, 1)  # nothing labelled: 0


def mlm_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy over the masked tokens: logits (B, T, V) with labels (B, T), or at the
    prediction slots, (B, P, V) with (B, P); -100 marks what is not predicted (0 if nothing is)."""
    return _mean_cross_entropy(logits, labels)


def nsp_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Next-sentence prediction: logits (B, 2), labels (B,) (0 = B follows A, 1 = random)."""
    return _mean_cross_entropy(logits, labels)


def classification_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Cross-entropy for (B, C) logits and (B,) class ids (-100: no label); mean squared error when
    C == 1 (regression), over the rows whose label is not NaN (rows padding a batch)."""
    if logits.shape[-1] == 1:
        labels = labels.astype(jnp.float32)
        valid = ~jnp.isnan(labels)
        error = jnp.where(valid, logits[..., 0].astype(jnp.float32) - jnp.where(valid, labels, 0.0), 0.0)
        return jnp.sum(jnp.square(error)) / jnp.maximum(valid.sum(), 1)
    return _mean_cross_entropy(logits, labels)


def token_classification_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Cross-entropy for (B, T, C) logits and (B, T) tags; -100 (padding, word pieces after the first) is skipped."""
    return _mean_cross_entropy(logits, labels)


def task_loss(model: nnx.Module, batch: Mapping[str, jax.Array],
              rngs: nnx.Rngs | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, its parts) of one batch for the model's head.

    Every batch holds input_ids, attention_mask, token_type_ids (B, T). MLM: labels (B, T) with
    -100, or prediction slots masked_positions and masked_labels (B, P) (`prediction_slots`);
    plus next_sentence_label (B,) for NSP. Classification: labels (B,) (floats for regression).
    Token classification: labels (B, T).
    """
    inputs = batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")
    if isinstance(model, _TiedMLM):
        positions = batch.get("masked_positions")
        out = model(*inputs, positions, rngs=rngs)
        mlm_logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
        loss = mlm_loss(mlm_logits, batch["labels"] if positions is None else batch["masked_labels"])
        parts = {"mlm_loss": loss}
        if nsp_logits is not None and "next_sentence_label" in batch:
            parts["nsp_loss"] = nsp_loss(nsp_logits, batch["next_sentence_label"])
            loss = loss + parts["nsp_loss"]
        return loss, parts
    if isinstance(model, BERTForTokenClassification):
        return token_classification_loss(model(*inputs, rngs=rngs), batch["labels"]), {}
    if isinstance(model, BERTForSequenceClassification):
        return classification_loss(model(*inputs, rngs=rngs), batch["labels"]), {}
    raise TypeError(f"no training loss for {type(model).__name__}; pass loss_fn to make_train_step")


def prediction_slots(labels: np.ndarray, slots: int | None = None, multiple: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """MLM labels (B, T) with -100 -> (masked_positions, masked_labels), each (B, P) int32, on the host.

    Each row's labelled positions come first, in order; the spare slots hold -100 targets. P is
    `slots`, or the most labels in a row rounded up to `multiple`. A fixed P keeps every step's
    shapes, so the jitted step never compiles again.
    """
    labels = np.asarray(labels)
    masked = labels != IGNORE_INDEX
    most = int(masked.sum(axis=1).max(initial=0))
    P_ = slots if slots is not None else max(multiple, -(-most // multiple) * multiple)
    if most > P_:
        raise ValueError(f"a row has {most} masked tokens, more than the {P_} prediction slots")
    order = np.argsort(~masked, axis=1, kind="stable")[:, :P_]  # labelled positions first
    targets = np.where(np.take_along_axis(masked, order, 1), np.take_along_axis(labels, order, 1), IGNORE_INDEX)
    return order.astype(np.int32), targets.astype(np.int32)


# ---- optimizer and schedule ----------------------------------------------------------------------

def lr_schedule(peak_lr: float, warmup_steps: int, total_steps: int, kind: str = "linear",
                min_ratio: float = 0.0) -> optax.Schedule:
    """The lr of optimizer update `count` (0-based), as `bert_kit.training.optim.lr_multiplier`:
    warmup (count + 1) / warmup_steps, then linear or cosine decay to `min_ratio` of the peak at
    total_steps, or constant."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    span = max(1, total_steps - warmup_steps)

    def schedule(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32)
        warm = (step + 1) / max(1, warmup_steps)
        progress = jnp.clip((step - warmup_steps) / span, 0.0, 1.0)
        if kind == "linear":
            decay = 1.0 - progress
        elif kind == "cosine":
            decay = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        else:
            decay = jnp.ones_like(progress)
        after = decay if kind == "constant" else min_ratio + (1.0 - min_ratio) * decay
        return peak_lr * jnp.where(step < warmup_steps, warm, after)

    return schedule


def decay_mask(params: Any) -> Any:
    """True for the parameters AdamW decays: matrices (kernels, embeddings), not biases or LayerNorm."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def update_rule(optimizer: str = "adamw", betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                weight_decay: float = 0.01, clip_grad: float | None = 1.0) -> optax.GradientTransformation:
    """The update the engine's step scales by -lr: global-norm clipping (0 or None: none), Adam's
    bias-corrected direction plus decoupled weight decay on matrices (AdamW); for "lamb", each
    matrix's update then scaled by ||p|| / ||update|| (1 where either is 0), as `bert_kit.training.optim.LAMB`
    does (biases and LayerNorm take the plain step, as in its no-decay group)."""
    if optimizer not in ("adamw", "lamb"):
        raise ValueError(f"optimizer must be adamw or lamb, got {optimizer!r}")
    rule = [optax.clip_by_global_norm(clip_grad) if clip_grad else optax.identity(),
            optax.scale_by_adam(*betas, eps=eps), optax.add_decayed_weights(weight_decay, mask=decay_mask)]
    if optimizer == "lamb":
        rule.append(optax.masked(optax.scale_by_trust_ratio(), decay_mask))
    return optax.chain(*rule)


def create_optimizer(learning_rate: float | optax.Schedule, weight_decay: float = 0.01,
                     betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                     clip_grad: float | None = 1.0) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay on matrices only) after global-norm clipping (0 or None: none):
    the engine's `update_rule`, scaled by the learning rate (a number or a schedule)."""
    return optax.chain(update_rule("adamw", betas, eps, weight_decay, clip_grad),
                       optax.scale_by_learning_rate(learning_rate))


# fp16's dynamic loss scaling, inside the step, with torch.amp.GradScaler's defaults: both engines
# scale, skip and grow alike
INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000


class LossScale(NamedTuple):
    """fp16's 5-bit exponent flushes small gradients to zero: the loss is multiplied by `scale`
    before the backward pass and the gradients divided by it after. A step whose gradients
    overflowed (the loss finite) is skipped and the scale halved; after `GROWTH_INTERVAL` finite
    steps in a row it doubles. bf16 and fp32 keep a scale of 1 that no step reads (`dynamic`)."""

    scale: jax.Array  # () float32
    good_steps: jax.Array  # () int32: finite steps since the scale last changed

    @staticmethod
    def dynamic(dtype: jnp.dtype) -> bool:
        """Whether a step computing in `dtype` scales its loss: fp16 only."""
        return jnp.dtype(dtype) == jnp.float16

    @classmethod
    def initial(cls, dtype: jnp.dtype) -> LossScale:
        return cls(jnp.asarray(INIT_SCALE if cls.dynamic(dtype) else 1.0, jnp.float32), jnp.zeros((), jnp.int32))

    def update(self, finite: jax.Array) -> LossScale:
        """After a step: halve on overflow, double after `GROWTH_INTERVAL` finite steps in a row
        (torch's `_amp_update_scale_`)."""
        good = self.good_steps + 1
        grow = finite & (good >= GROWTH_INTERVAL)
        scale = jnp.where(finite, jnp.where(grow, self.scale * GROWTH_FACTOR, self.scale), self.scale * BACKOFF_FACTOR)
        return LossScale(scale, jnp.where(finite & ~grow, good, 0).astype(jnp.int32))


# ---- state, sharding and the step ----------------------------------------------------------------

class TrainState(NamedTuple):
    """Everything a step updates: a pytree, so it is donated, replicated and saved as one."""

    step: jax.Array  # () int32, optimizer updates done
    params: nnx.State  # float32 master weights
    opt_state: optax.OptState
    key: jax.Array  # dropout keys are folded from it with the step


def cast(params: Any, dtype: jnp.dtype) -> Any:
    """Floating-point leaves of `params` in `dtype` (the compute copy of the master weights), but the
    embedding tables (`nnx.Embed`'s `embedding`) stay float32: rows are gathered, not multiplied, and
    the word table's gradient (every token's row scatter-added, plus the tied decoder's) sums in float32.
    So do scalars (a learned contrastive scale's log: bfloat16 would round log 20 by 0.4%)."""
    def one(path: tuple, p: Any) -> Any:
        table = any(getattr(key, "key", None) == "embedding" for key in path) or p.ndim == 0
        return p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) and not table else p

    return jax.tree_util.tree_map_with_path(one, params)


def make_mesh(devices: list | None = None) -> Mesh:
    """A one-axis ("data") mesh over `devices`, by default every device of every host."""
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), ("data",))


def data_sharding(mesh: Mesh) -> NamedSharding:
    """Arrays split on their first (batch) axis across the mesh."""
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def shard_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This host's share of a batch (NumPy arrays, batch axis first) -> global arrays split over the mesh."""
    local = len(mesh.local_devices)
    arrays = {name: np.asarray(array) for name, array in batch.items()}
    for name, array in arrays.items():
        if array.shape[0] % local:
            raise ValueError(f"batch {name} has {array.shape[0]} rows, not a multiple of the {local} local devices")
    return put_process_local(arrays, data_sharding(mesh))


def put_process_local(arrays: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """This process's share of each array -> global arrays laid out by `sharding`; in a single
    process, one transfer call for them all (one call per array costs milliseconds each)."""
    if jax.process_count() == 1:
        return jax.device_put(dict(arrays), sharding)
    return {name: jax.make_array_from_process_local_data(sharding, array) for name, array in arrays.items()}


def init_train_state(model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh,
                     seed: int = 0, prng: str = "threefry2x32") -> tuple[nnx.GraphDef, TrainState]:
    """Split `model` into its graph definition and a replicated float32 `TrainState`."""
    graphdef, params = nnx.split(model, nnx.Param)  # nothing but parameters: an error otherwise
    # a copy: the step donates the state's buffers, which must not be the model's own
    params = jax.tree.map(lambda p: jnp.array(p, dtype=jnp.float32, copy=True), params)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), jax.random.key(seed, impl=prng))
    return graphdef, jax.device_put(state, replicated(mesh))


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, mesh: Mesh,
                    precision: str = "fp32", loss_fn: Callable = task_loss, return_grads: bool = False) -> Callable:
    """The jitted `step(state, batch) -> (state, metrics)`; `batch` from `shard_batch`.

    metrics: loss, its parts (mlm_loss, nsp_loss), grad_norm (before clipping), all device scalars;
    with return_grads, also "grads" (shaped as the parameters: for tests and debugging).
    precision: "fp32", or "bf16" (bfloat16 forward and backward, float32 weights and updates);
    fp16 needs loss scaling: the engine's step has it (`engine=jax precision=fp16`).
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"make_train_step computes in fp32 or bf16, not {precision!r} (fp16, with its loss "
                         "scaling: the engine, engine=jax precision=fp16)")
    compute_dtype = DTYPES[precision]

    def step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        key = derive(state.key, state.step)

        def loss_of(params: nnx.State) -> tuple[jax.Array, dict]:
            model = nnx.merge(graphdef, cast(params, compute_dtype))
            return loss_fn(model, batch, HostKeys(key))

        (loss, parts), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), **parts}
        if return_grads:
            metrics["grads"] = grads
        return TrainState(state.step + 1, params, opt_state, state.key), metrics

    return jax.jit(step, in_shardings=(replicated(mesh), data_sharding(mesh)),
                   out_shardings=(replicated(mesh), replicated(mesh)), donate_argnums=0,
                   compiler_options=compiler_options(mesh.devices.flat[0].platform))


def make_eval_step(graphdef: nnx.GraphDef, mesh: Mesh, precision: str = "fp32",
                   loss_fn: Callable = task_loss) -> Callable:
    """The jitted `evaluate(params, batch) -> metrics`: the loss and its parts, no dropout."""
    compute_dtype = DTYPES[precision]

    def evaluate(params: nnx.State, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        loss, parts = loss_fn(nnx.merge(graphdef, cast(params, compute_dtype)), batch, None)
        return {"loss": loss, **parts}

    return jax.jit(evaluate, in_shardings=(replicated(mesh), data_sharding(mesh)), out_shardings=replicated(mesh),
                   compiler_options=compiler_options(mesh.devices.flat[0].platform))


# ---- several hosts ---------------------------------------------------------------------------------

def distributed_settings(env: Mapping[str, str]) -> dict[str, Any] | None:
    """`jax.distributed.initialize` arguments from the environment, or None for a single process.

    JAX_COORDINATOR_ADDRESS (host:port), JAX_NUM_PROCESSES, JAX_PROCESS_ID; or what torchrun and
    `bert-kit`'s PyTorch launches set: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK (with
    LOCAL_RANK and LOCAL_WORLD_SIZE > 1, each process takes one local device).
    """
    if "JAX_COORDINATOR_ADDRESS" in env:
        return {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
                "num_processes": int(env["JAX_NUM_PROCESSES"]), "process_id": int(env["JAX_PROCESS_ID"])}
    if int(env.get("WORLD_SIZE", "1")) > 1:
        settings = {"coordinator_address": f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                    "num_processes": int(env["WORLD_SIZE"]), "process_id": int(env["RANK"])}
        if int(env.get("LOCAL_WORLD_SIZE", "1")) > 1:
            settings["local_device_ids"] = [int(env.get("LOCAL_RANK", "0"))]
        return settings
    return None


def initialize_distributed(env: Mapping[str, str] | None = None) -> bool:
    """Join the other processes of a multi-host run when the environment describes one (call it
    before anything touches a device); True if it did. On Slurm, TPU pods and other clusters JAX
    detects itself, `jax.distributed.initialize()` needs no variables: set JAX_COORDINATOR_ADDRESS
    only where it does not."""
    settings = distributed_settings(os.environ if env is None else env)
    if settings is None:
        return False
    jax.distributed.initialize(**settings)
    return True


class JaxProcesses:
    """bert-kit's rank helpers (`bert_kit.training.distributed`) over the processes of a JAX run on
    several hosts (`jax.distributed`): one process per host, rank = `jax.process_index()`."""

    def rank(self) -> int:
        return jax.process_index()

    def world_size(self) -> int:
        return jax.process_count()

    def barrier(self) -> None:
        multihost_utils.sync_global_devices("bert-kit")

    def gather(self, values: list[float]) -> np.ndarray:
        """(processes, len(values)) float64: each process's values, exactly (sent as uint32 pairs)."""
        local = np.asarray(values, np.float64).view(np.uint32)
        return np.asarray(multihost_utils.process_allgather(local)).view(np.float64)

    def all_gather_object(self, obj: Any) -> list[Any]:
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int32)))[:, 0]
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[:len(data)] = data
        everything = np.asarray(multihost_utils.process_allgather(padded))
        return [pickle.loads(everything[i, :n].tobytes()) for i, n in enumerate(sizes)]


def join_processes() -> None:
    """A run on several hosts: join the other processes (`initialize_distributed`: JAX_* or
    torchrun's variables) and let them answer bert-kit's rank helpers. One host: nothing to do."""
    from bert_kit.training.distributed import use_processes

    if initialize_distributed() and jax.process_count() > 1:
        use_processes(JaxProcesses())


def start_backend(device: str) -> threading.Thread | None:
    """Start JAX's backends in a background thread (a GPU's: its driver, context and memory pool,
    seconds on an H200 host) while the job reads its data and builds its model, as the torch
    engine starts CUDA. JAX's backend lock holds the engine's first device call until it is done.
    Nothing for device=cpu. A failure is left for `resolve_devices` to report."""
    if device == "cpu":
        return None

    def start() -> None:
        try:
            jax.devices()
        except Exception:  # noqa: BLE001 (reported where the engine asks for its devices)
            pass

    thread = threading.Thread(target=start, name="jax-start", daemon=True)
    thread.start()
    return thread


def resolve_devices(device: str) -> list:
    """The devices `device` names: auto (every device of the default backend, on every host), cpu,
    cuda (every GPU) or cuda:N (GPU N of this host)."""
    if device == "auto":
        return jax.devices()
    if device == "cpu":
        return jax.devices("cpu")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        raise ValueError(f"device={device}, but JAX sees no GPU: install jax with CUDA (pip install "
                         "\"jax[cuda12]\"), or set device=auto") from None
    if ":" not in device:
        return gpus
    index = int(device.split(":")[1])
    if index >= len(gpus):
        raise ValueError(f"device={device}, but JAX sees {len(gpus)} GPU(s)")
    return [gpus[index]]
