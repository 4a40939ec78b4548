"""The JAX engine of the one training loop: `bert-kit pretrain ... engine=jax`, `bert-kit finetune ... engine=jax`.

The loop (`bert_kit/training/loop.py`) and the jobs stay what they are for PyTorch: the same
configs, readers, masking and packing, the same lr schedule (on the host: a time budget moves it
with the clock), checkpoint folders, signals, metrics and model folders. This engine takes the
job's PyTorch model as built (its architecture and first weights), trains a Flax NNX twin of it,
and writes the weights back into it wherever the run saves (`checkpoint_state`, `model_state`), so
checkpoints, best/ and final/ are written by the same code as the torch engine's.

One optimizer update is one compiled program, `train_step(state, frozen, batch, lr) -> state`, or
for a short fine-tune two, compiled side by side: `gradients(state, frozen, batch) -> grads, losses`
for each batch shape and `update(state, grads, losses, lr) -> state` once (`SHORT_MAX_STEPS`):
- the batch is the step's micro-batches stacked on a leading axis (A, B, ...), split over every
  device on B (a `Mesh` with one "data" axis); the state is replicated and XLA adds the gradient
  all-reduce, or under `parallel: fsdp` the weights and optimizer state are sharded over the axis
  (`bert_kit.jax.sharding`); A > 1 is gradient accumulation, a `lax.scan` over the micro-batches;
- bf16 compute from float32 master weights (`train.cast`), AdamW with torch's decay mask, global
  norm clipping, and the lr an argument: no recompilation when it changes, and no host sync;
- the model runs the kernels of its devices (`kernels.fast_path.apply`: on GPUs, attention fused
  with its dropout in a Pallas kernel, cuDNN's attention where there is no dropout);
- a NaN or inf loss, or a non-finite gradient in `MAX_SKIPPED_IN_A_ROW` steps in a row, freezes the
  weights from that step on and is reported when the loop reads the window (as the torch engine's
  deferred checks); a single non-finite gradient skips its update and is counted;
- the window's losses are summed inside the state: the loop's one sync per log step reads them.
Shapes are static: pretraining batches are padded to max_length with per-row MLM prediction slots
(the masking caps a row's masked tokens at them); fine-tuning batches are padded to a length
bucket and to a full batch of examples (`batches.HostBatches`), so a run compiles a program per
bucket (a small evaluation one: `compilation.eval_lengths`). On GPUs the programs a fine-tune will
need (its likely training buckets, then the evaluation's) compile in threads from the start, the
evaluation's while the run trains; compiled programs are kept between runs
(`compilation.use_compilation_cache`), and so are traced ones (`trace_cache`). The engine holds the
train state as its leaves.

Checkpoints hold model.safetensors (HF names), trainer_state.pt (engine: jax) and
`optimizer.safetensors`: the optax state flattened by path, the step, the dropout key and the
non-finite counters; a resumed run continues bit for bit on the CPU (on a GPU, runs of one seed
differ slightly: docs/jax.md).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_kit.checks import CorruptFileError
from bert_kit.jax.batches import HostBatches
from bert_kit.jax.compilation import (AheadOfTime, abstract, compiler_options, eval_lengths, item_tokens, kept_traces,
                                      likely_buckets, over_leaves, use_compilation_cache)
from bert_kit.jax.kernels import fast_path
from bert_kit.jax.model import HEAD_CLASSES, BERTForPreTraining, BertEncoder, _TiedMLM
from bert_kit.jax.randomness import HostKeys, derive
from bert_kit.jax.sharding import describe_fsdp, fsdp_shardings, replicated_shardings, to_host
from bert_kit.jax.tasks import TaskHead, task_head
from bert_kit.jax.trace_cache import TraceCache
from bert_kit.jax.train import (DTYPES, IGNORE_INDEX, LossScale, _cross_entropy_sum, cast, join_processes,
                                put_process_local, resolve_devices, resolve_jax_precision, start_backend, task_loss,
                                update_rule)
from bert_kit.jax.weights import copy_into_torch, from_torch, torch_name, torch_state_dict
from bert_kit.training.checkpoint import load_checkpoint
from bert_kit.training.engine import Engine
from bert_kit.training.losses import mlm_metrics
from bert_kit.training.precision import Precision, resolve_precision
from bert_kit.training.trainer import MAX_SKIPPED_IN_A_ROW, NonFiniteLossError

STATE_FILE = "optimizer.safetensors"
# steps dispatched ahead of the device: enough to hide the host's work, few enough that the progress
# bar, the time budget and Ctrl-C see what the device has done (a CPU runs far behind the host)
IN_FLIGHT = 2
COMPILE_AHEAD_ON_CPU = False  # on a CPU, compiling ahead would take the cores the steps run on
# GPU fine-tunes of at most 500 steps are compiled sooner, and their steps are slower:
# - they scan the encoder's blocks (`BertEncoder.scan`): on an H200 MiniLM's step compiled in 5.5 s, not
#   11.7, and ran 3 ms slower; pretraining (BERT-base 19% slower) and CPUs (7.3 s against 5.0 s to
#   compile, and slower) call them in turn;
# - their gradients and update are two programs compiled side by side: MiniLM's took XLA 3.4 s and
#   2.5 s, its whole step 6.3 s; each step took 0.5 ms longer;
# - their add & norm is XLA's with its backward written out (`kernels/residual_norm_xla.py`), not the
#   Pallas kernel (one fewer to compile and check): MiniLM's gradients took 4.17 ms, not 5.4-5.6
SHORT_MAX_STEPS, SHORT_PLATFORMS = 500, ("gpu",)


class StepState(NamedTuple):
    """Everything a step updates, one pytree (donated to the step, saved with a checkpoint); replicated
    but for params and opt_state under fsdp."""

    step: jax.Array  # () int32: optimizer steps taken (skipped ones too)
    params: nnx.State  # the trained float32 master weights
    opt_state: optax.OptState
    key: jax.Array  # dropout keys are folded from it with the step (and the micro-batch)
    sums: dict[str, jax.Array]  # the log window's losses, summed over its steps
    grad_norm: jax.Array  # the last step's, before clipping
    skipped: jax.Array  # steps skipped for a non-finite gradient of a finite loss
    in_a_row: jax.Array  # ... of which the latest came in a row
    first_bad: jax.Array  # the first step (1-based) that must stop the run; 0 while none
    bad: dict[str, jax.Array]  # its losses and gradient norm
    loss_scale: LossScale  # fp16's; 1 otherwise


def write_state(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    """optimizer.safetensors in a checkpoint folder (`JaxEngine.saved_state`)."""
    from safetensors.numpy import save_file

    save_file(arrays, str(folder / STATE_FILE))


def loss_names(model: nnx.Module) -> tuple[str, ...]:
    """The losses `task_loss` reports for the model's head (the window sums them)."""
    if isinstance(model, BERTForPreTraining):
        return "loss", "mlm_loss", "nsp_loss"
    return ("loss", "mlm_loss") if isinstance(model, _TiedMLM) else ("loss",)


def checked_ahead(buckets: list[int], traces: TraceCache | None) -> list[int]:
    """The lengths whose kernels' checks start with the model: a fine-tune's likely ones, unless
    traced programs are kept. A warm run reads its step back and never traces the kernel, and a
    step that is traced starts its check then (`compilation.assume`). RTE's warm runs on H200s
    ended 0.33 s sooner in the mean without the checks in one call, as soon in another."""
    return list(buckets) if traces is None or not traces.keeps_any() else []


class Programs:
    """What the engine jits: pure functions of their arguments and of the model's graph, compute
    dtype, optimizer, loss names and task head (no reference to the run: JAX's caches may keep them).
    head: a fine-tuning task's loss and outputs (`bert_kit.jax.tasks`); None for pretraining (MLM).
    gathered: under fsdp, the replicated sharding the weights are gathered to where the model reads them."""

    def __init__(self, graphdef: nnx.GraphDef, dtype: jnp.dtype, tx: optax.GradientTransformation,
                 names: tuple[str, ...], head: TaskHead | None = None, gathered: NamedSharding | None = None) -> None:
        self.graphdef, self.dtype, self.tx, self.names, self.head = graphdef, dtype, tx, names, head
        self.gathered = gathered
        self.loss = head.loss if head is not None else task_loss
        self.scaling = LossScale.dynamic(dtype)  # fp16: the gradients of loss * scale, then / scale

    def initial_state(self, params: nnx.State, key: jax.Array) -> StepState:
        def zero(dtype: Any = jnp.float32) -> jax.Array:  # one buffer each: the step donates every leaf
            return jnp.zeros((), dtype)

        return StepState(zero(jnp.int32), params, self.tx.init(params), key, {k: zero() for k in self.names},
                         zero(), zero(jnp.int32), zero(jnp.int32), zero(jnp.int32),
                         {k: zero() for k in (*self.names, "grad_norm")}, LossScale.initial(self.dtype))

    def initial_leaves(self, params: nnx.State, key: jax.Array) -> list[jax.Array]:
        """`initial_state`'s leaves: a program kept between runs returns lists (`jax.export` writes no NNX State)."""
        return jax.tree.leaves(self.initial_state(params, key))

    def model_at(self, frozen: nnx.State, params: nnx.State) -> nnx.Module:
        """The model of these weights, in the compute dtype (a float32 copy gets float32 gradients).
        Sharded weights are gathered whole after the cast (bf16: half the bytes to move), so the batch
        stays split as under ddp; their gradients come back reduce-scattered into the shards."""
        params = cast(params, self.dtype)
        if self.gathered is not None:
            params = jax.lax.with_sharding_constraint(params, self.gathered)
        return nnx.merge(self.graphdef, cast(frozen, self.dtype), params)

    def train_step(self, state: StepState, frozen: nnx.State, batch: dict[str, jax.Array],
                   lr: jax.Array) -> tuple[StepState, jax.Array]:
        """One optimizer update over the (A, B, ...) micro-batches of `batch` at learning rate `lr`."""
        return self.update(state, *self.gradients(state, frozen, batch), lr)

    def gradients(self, state: StepState, frozen: nnx.State,
                  batch: dict[str, jax.Array]) -> tuple[nnx.State, dict[str, jax.Array]]:
        """The float32 gradients and the losses of a step's micro-batches (their means)."""
        key = derive(state.key, state.step)

        def micro_step(micro: dict[str, jax.Array], index: jax.Array) -> tuple[dict, nnx.State]:
            def loss_of(params: nnx.State) -> tuple[jax.Array, tuple]:
                rngs = HostKeys(derive(key, index))
                loss, parts = self.loss(self.model_at(frozen, params), micro, rngs)
                return (loss * state.loss_scale.scale if self.scaling else loss), (loss, parts)

            (_, (loss, parts)), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
            return {"loss": loss, **parts}, grads

        accum = batch["input_ids"].shape[0]
        if accum == 1:
            losses, grads = micro_step(jax.tree.map(lambda x: x[0], batch), jnp.zeros((), jnp.int32))
        else:  # gradient accumulation: the mean over the micro-batches, one at a time
            def add(total: tuple, xs: tuple) -> tuple[tuple, None]:
                return jax.tree.map(jnp.add, total, micro_step(*xs)), None

            zeros = (dict.fromkeys(self.names, jnp.zeros((), jnp.float32)), jax.tree.map(jnp.zeros_like, state.params))
            total, _ = jax.lax.scan(add, zeros, (batch, jnp.arange(accum)))
            losses, grads = jax.tree.map(lambda x: x / accum, total)
        if self.scaling:
            grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
        return grads, losses

    def update(self, state: StepState, grads: nnx.State, losses: dict[str, jax.Array],
               lr: jax.Array) -> tuple[StepState, jax.Array]:
        """The step after its gradients at learning rate `lr`: the checks, the optimizer's update, the window's
        sums. Returns the new state and its step count (a buffer of its own: the state is donated to the next)."""
        # the torch trainer's deferred checks, on the device (`AMPTrainer._record_nonfinite`); under
        # fp16 an overflowed gradient is the scale's to handle, as torch's GradScaler does
        grad_norm = optax.global_norm(grads)
        loss_ok = jnp.all(jnp.stack([jnp.isfinite(v) for v in losses.values()]))
        overflow = loss_ok & ~jnp.isfinite(grad_norm)
        bad_grad = jnp.zeros((), bool) if self.scaling else overflow
        in_a_row = jnp.where(bad_grad, state.in_a_row + 1, 0)
        stop = ~loss_ok | (in_a_row >= MAX_SKIPPED_IN_A_ROW)
        first = stop & (state.first_bad == 0)
        first_bad = jnp.where(first, state.step + 1, state.first_bad)
        seen = {**losses, "grad_norm": grad_norm}
        bad = {k: jnp.where(first, seen[k], v) for k, v in state.bad.items()}
        skip = (first_bad != 0) | overflow  # from the first bad step on, nothing moves
        loss_scale = state.loss_scale.update(~overflow) if self.scaling else state.loss_scale

        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, jax.tree.map(lambda u: -lr * u, updates))
        params, opt_state = jax.tree.map(lambda new, old: jnp.where(skip, old, new),
                                         (params, opt_state), (state.params, state.opt_state))
        sums = {k: state.sums[k] + losses[k] for k in self.names}
        skipped = state.skipped + bad_grad.astype(jnp.int32)
        return (StepState(state.step + 1, params, opt_state, state.key, sums, grad_norm, skipped, in_a_row, first_bad,
                          bad, loss_scale), state.step + 1)

    def outputs(self, frozen: nnx.State, params: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        """The task's outputs of a batch, one row per example, float32, no dropout."""
        return self.head.outputs(self.model_at(frozen, params), batch)

    def mlm_sums(self, frozen: nnx.State, params: nnx.State, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Summed cross-entropy, correct predictions and count of a batch's masked tokens (and NSP pairs)."""
        model = self.model_at(frozen, params)
        inputs = batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        out = model(*inputs, batch["masked_positions"])
        mlm_logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
        labels = batch["masked_labels"]
        total, count = _cross_entropy_sum(mlm_logits, labels)
        sums = {"mlm_sum": total, "mlm_count": count,
                "mlm_correct": ((mlm_logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()}
        if nsp_logits is not None and "next_sentence_label" in batch:
            nsp_labels = batch["next_sentence_label"]
            sums["nsp_sum"], sums["nsp_count"] = _cross_entropy_sum(nsp_logits, nsp_labels)
            sums["nsp_correct"] = ((nsp_logits.argmax(-1) == nsp_labels) & (nsp_labels != IGNORE_INDEX)).sum()
        return sums


class JaxEngine(Engine):
    """The job's model as a Flax NNX twin, trained by one jitted, data-parallel step."""

    name = "jax"

    @classmethod
    def join_processes(cls, cfg: Any) -> None:
        join_processes()

    @classmethod
    def start_device(cls, cfg: Any) -> Callable[[], Precision]:
        use_compilation_cache(getattr(cfg, "jax_cache", None))  # before anything compiles
        if hasattr(cfg, "task"):
            # allocated as it goes, not 75% of the GPU up front: a warm RTE run ended 1.4-2.7 s sooner
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        start_backend(cfg.device)
        # torch builds the batches and the first weights on the CPU, in fp32; JAX computes (`__init__`)
        return lambda: resolve_precision("fp32", "cpu", verbose=False)

    def __init__(self, job: Any, cfg: Any, run: Any) -> None:
        # the job's PyTorch model: what to train (an embedding model's encoder, and its scale if learned:
        # `TaskHead.trained`), and where the weights go back to be saved (the engine keeps no other part
        # of the job: a run's loaders end with it)
        task = getattr(job, "task", None)  # a fine-tuning job's task; pretraining trains MLM (+ NSP)
        self.head = task_head(task, getattr(job, "train_items", None)) if task is not None else None
        self.whole, self.cfg = job.model, cfg
        self.model = self.head.trained(job.model) if self.head is not None else job.model
        devices = resolve_devices(cfg.device)
        self.precision = resolve_jax_precision(cfg.precision, devices)
        self.parallel = getattr(cfg, "parallel", "ddp") if len(devices) > 1 else None  # results.json's
        self.dtype = DTYPES[self.precision.name]
        self.mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
        if self.head is not None:
            self.head = self.head.for_devices(self.mesh.size)
        self.local_devices = len(self.mesh.local_devices)
        self.replicated = NamedSharding(self.mesh, P())
        self.host_batches = HostBatches(cfg, self.head, int(job.tokenizer.pad_token_id), self.local_devices)
        if jax.process_index() == 0:
            print(f"precision: {self.precision}", flush=True)
        # DataLoader workers (num_workers > 0) are forked from this process, whose JAX threads make
        # Python warn of deadlocks; the workers run the collators (torch and NumPy) and never JAX
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)

        # the twin of the job's model, with the kernels of this device (`kernels.fast_path`); what torch
        # leaves frozen (an unused pooler) stays out of training
        self.short = (devices[0].platform in SHORT_PLATFORMS and self.head is not None
                      and getattr(job, "total_steps", SHORT_MAX_STEPS + 1) <= SHORT_MAX_STEPS)
        # a fine-tune's likely training lengths: on GPUs their programs compile and their kernels' checks run ahead
        ahead = devices[0].platform != "cpu" or COMPILE_AHEAD_ON_CPU
        items = getattr(job, "train_items", None) if self.head is not None and ahead else None
        self.buckets = likely_buckets(np.array([item_tokens(item) for item in items]), cfg.batch_size * cfg.grad_accum,
                                      job.total_steps, cfg.max_length) if items else []
        traces = kept_traces()
        self.checked_ahead = checked_ahead(self.buckets, traces)
        self.graphdef, frozen, params = self.twin()
        job.fast_path = f"fast path: JAX engine: {self.fast.summary}"  # run_config.yaml's and results.json's
        if jax.process_index() == 0:
            print(job.fast_path, flush=True)
        self.frozen = jax.device_put(frozen, self.replicated)
        self.frozen_leaves = jax.tree.leaves(self.frozen)
        self.names = loss_names(nnx.merge(self.graphdef, frozen, params))
        # AdamW's or LAMB's update without the lr: the step scales it by the schedule's
        self.tx = update_rule(cfg.optimizer, tuple(cfg.betas), cfg.eps, cfg.weight_decay, cfg.clip_grad)
        fsdp = getattr(cfg, "parallel", "ddp") == "fsdp"
        programs = Programs(self.graphdef, self.dtype, self.tx, self.names, self.head,
                            self.replicated if fsdp else None)
        # a short fine-tune's step is not autotuned either: RTE's first runs on H200s ended 0.5 s sooner
        # in two pairs (1.7 s in the mean of 3 and 4 others), its steps as fast
        options = compiler_options(devices[0].platform, autotune=not self.short)
        once = compiler_options(devices[0].platform, autotune=False)  # programs run a few times: not autotuned
        key = jax.random.wrap_key_data(np.array([0, cfg.seed], np.uint32))  # key(seed)
        shapes = jax.eval_shape(programs.initial_state, params, key)
        self.layout = self.state_layout(shapes, fsdp)
        self.steps = 0  # optimizer steps in the window
        self.skipped_before = 0  # steps skipped for a non-finite gradient, as of the last read
        self.in_flight: deque[jax.Array] = deque()
        # the programs, one per batch shape, compiled in threads ahead of their use where the shapes are known
        stacked, batch = NamedSharding(self.mesh, P(None, "data")), NamedSharding(self.mesh, P("data"))
        self.pool = ThreadPoolExecutor(max(2, min(4, (os.cpu_count() or 2) // 2)), thread_name_prefix="compile")
        weakref.finalize(self, self.pool.shutdown, wait=False, cancel_futures=True)  # a run's end drops the rest
        show = lambda text: self.status(text)  # noqa: E731 -- the loop sets `status` later
        rep, weights = self.replicated, self.layout.params
        leaves = jax.tree.leaves(self.layout)  # the step takes and returns the state's leaves (`state`)
        grads, step = jax.tree.leaves(weights), dict(donate_argnums=0, compiler_options=options)
        self._step = AheadOfTime(over_leaves(programs.train_step, (self.layout, self.frozen), (True, False)),
                                 dict(in_shardings=(leaves, rep, stacked, rep), out_shardings=(leaves, rep), **step),
                                 2, self.pool, show, traces)
        self._gradients = AheadOfTime(over_leaves(programs.gradients, (self.layout, self.frozen), (True, False)),
                                      dict(in_shardings=(leaves, rep, stacked), out_shardings=(grads, rep),
                                           compiler_options=options), 2, self.pool, show, traces)
        self._update = AheadOfTime(over_leaves(programs.update, (self.layout, weights), (True, False)),
                                   dict(in_shardings=(leaves, grads, rep, rep), out_shardings=(leaves, rep), **step),
                                   2, self.pool, show, traces)
        self._outputs = AheadOfTime(programs.outputs, dict(in_shardings=(rep, weights, batch), out_shardings=batch,
                                                           compiler_options=once), 2, self.pool, show, traces)
        self._mlm_sums = AheadOfTime(programs.mlm_sums, dict(in_shardings=(rep, weights, batch), out_shardings=rep,
                                                             compiler_options=once), 2, self.pool, show, traces)
        # first the programs, then the state's (traced beside theirs): on an H200 RTE's first step waited
        # 0.5-1.2 s less, the start took 0.3-0.9 s more, and a first run ended 0.2 s sooner (mean of three)
        if ahead:
            self.compile_ahead(job, abstract(shapes, self.layout))
        # one program, not one per leaf, kept between runs as the others: a warm run traces none
        inputs = abstract((params, key), jax.tree.map(lambda _: rep, (params, key)))  # (uncommitted: put whole)
        init = AheadOfTime(programs.initial_leaves, dict(out_shardings=leaves, compiler_options=once), 0, self.pool,
                           show, traces).compile(inputs)
        treedef = jax.tree.structure(shapes)
        self.init = lambda params, key: jax.tree.unflatten(treedef, init(params, key))
        self.state = self.init(params, key)
        if fsdp and jax.process_index() == 0:
            print(describe_fsdp(self.state.params, self.state.opt_state, (self.layout.params, self.layout.opt_state),
                                len(devices)), flush=True)

    @property
    def state(self) -> StepState:
        return jax.tree.unflatten(self.treedef, self.leaves)

    @state.setter
    def state(self, state: StepState) -> None:  # held as its leaves: the step takes and returns them
        self.leaves, self.treedef = jax.tree.flatten(state)

    def state_layout(self, state: StepState, fsdp: bool) -> StepState:
        """The sharding of each leaf of the (abstract) state: replicated, but for the trained weights
        and the optimizer state under fsdp (`bert_kit.jax.sharding`)."""
        layout = replicated_shardings(state, self.mesh)
        if not fsdp:
            return layout
        return layout._replace(params=fsdp_shardings(state.params, self.mesh),
                               opt_state=fsdp_shardings(state.opt_state, self.mesh))

    def twin(self) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
        """(graph, frozen weights, trained float32 weights) of the NNX twin of the job's model as it is now."""
        frozen = {name for name, p in self.model.named_parameters() if not p.requires_grad}
        model = self.head.twin(self.model) if self.head is not None else \
            from_torch(self.model, HEAD_CLASSES[self.model.hf_architecture])
        self.fast = fast_path.apply(model, self.mesh.devices.flat[0].platform, self.dtype, mesh=self.mesh,
                                    add_norm="xla" if self.short else "pallas",  # (`SHORT_MAX_STEPS`)
                                    lengths=self.checked_ahead)  # their kernels' checks start now
        for _, module in nnx.iter_graph(model):
            if isinstance(module, BertEncoder):  # a short fine-tune: compiled sooner (`SHORT_MAX_STEPS`)
                module.scan = self.short
        graphdef, frozen, params = nnx.split(model, lambda path, _: torch_name(path)[0] in frozen, nnx.Param)
        return graphdef, frozen, jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)

    def compile_ahead(self, job: Any, state: StepState) -> None:
        """Start compiling, in threads, the programs a fine-tuning run will need: the train step of
        each length bucket its batches are likely to have, then the evaluation's of each bucket
        its (length-sorted) batches have. Each is compiled for the shapes `host_batches` makes of
        the job's shortest example (padded to each bucket); a step that meets another shape compiles it then.
        state: the train state's shapes and shardings (ShapeDtypeStructs): it is not made yet."""
        task, cfg = getattr(job, "task", None), self.cfg
        if task is None or jax.process_count() > 1 or not getattr(job, "train_items", None):
            return
        spec = lambda batch, sharding: {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)  # noqa: E731
                                        for k, v in batch.items()}
        sample = task.collate([min(job.train_items, key=item_tokens)])  # the shortest: it pads to every bucket
        stacked = NamedSharding(self.mesh, P(None, "data"))
        lr = jax.ShapeDtypeStruct((), jnp.float32, sharding=self.replicated)
        leaves, frozen, losses = jax.tree.leaves(state), abstract(self.frozen_leaves), {k: lr for k in self.names}
        params = jax.tree.leaves(state.params)
        for bucket in self.buckets:  # likeliest first
            batch = spec(self.host_batches([sample] * cfg.grad_accum, "train", bucket), stacked)
            if self.short:  # the gradients, then the update (one for every shape): the longer to compile traces first
                self._gradients.ahead(leaves, frozen, batch)
                self._update.ahead(leaves, params, losses, lr)
            else:
                self._step.ahead(leaves, frozen, batch, lr)
        evaluated = task.scored_items(getattr(job, "eval_items", None) or [])  # (a reranker's: its pairs)
        if evaluated and isinstance(evaluated[0], dict):  # (an embedding task's are texts, batched as it scores)
            sharded = NamedSharding(self.mesh, P("data"))
            buckets = {length for _, length in eval_lengths(evaluated, task.s.eval_batch_size, cfg.max_length)}
            sample = task.collate([min(evaluated, key=item_tokens)])
            for bucket in sorted(buckets, reverse=True):
                batch = {k: v[0] for k, v in self.host_batches([sample], "eval", bucket).items()}
                self._outputs.ahead(abstract(self.frozen), state.params, spec(batch, sharded))

    def to_devices(self, batch: dict[str, np.ndarray], spec: P) -> dict[str, Any]:
        """This process's share of a batch -> global arrays split over the mesh. In one process the
        NumPy arrays as they are: the program's call moves them, in C++ (a MiniLM step's batch and lr:
        0.1 ms of the host's time, where device_put took 2 ms)."""
        return batch if jax.process_count() == 1 else put_process_local(batch, NamedSharding(self.mesh, spec))

    # ---- the engine interface ------------------------------------------------------------------

    def step(self, micro_batches: list[dict], lr: float) -> None:
        batch = self.to_devices(self.host_batches(micro_batches, "train"), P(None, "data"))
        lr = self.to_devices({"lr": np.float32(lr)}, P())["lr"]
        if self.short:
            grads, losses = self._gradients(self.leaves, self.frozen_leaves, batch)
            self.leaves, done = self._update(self.leaves, grads, losses, lr)
        else:
            self.leaves, done = self._step(self.leaves, self.frozen_leaves, batch, lr)
        self.steps += 1
        self.in_flight.append(done)  # not the state's step: its buffers are donated to the next step
        if len(self.in_flight) > IN_FLIGHT:
            self.in_flight.popleft().block_until_ready()

    def read_window(self) -> tuple[dict[str, float], float, int]:
        s = self.state
        sums, grad_norm, skipped, first_bad, bad = jax.device_get((s.sums, s.grad_norm, s.skipped, s.first_bad,
                                                                   s.bad))
        if first_bad:
            raise NonFiniteLossError(int(first_bad), {k: float(bad[k]) for k in (*self.names, "grad_norm")})
        losses = {k: float(sums[k]) / self.steps for k in self.names}  # in the order the torch engine logs them
        new_skips = int(skipped) - self.skipped_before
        self.skipped_before = int(skipped)
        zeros = jax.device_put({k: np.zeros((), np.float32) for k in self.names}, self.replicated)
        self.state, self.steps = s._replace(sums=zeros), 0
        return losses, float(grad_norm), new_skips

    def check_finite(self) -> None:
        first_bad = int(jax.device_get(self.state.first_bad))
        if first_bad:
            bad = jax.device_get(self.state.bad)
            raise NonFiniteLossError(first_bad, {k: float(bad[k]) for k in (*self.names, "grad_norm")})

    def weights_to_torch(self) -> None:
        """The current weights into the job's PyTorch model (which the run's folders are written from);
        every process calls it (sharded weights are gathered)."""
        model = nnx.merge(self.graphdef, *to_host((self.frozen, self.state.params)))
        copy_into_torch(torch_state_dict(model), self.model)

    def checkpoint_state(self) -> dict[str, Any]:
        self.weights_to_torch()
        arrays = self.saved_state()  # now, on every process: the next steps donate the state's buffers
        return {"engine": self.name, "files": lambda folder: write_state(folder, arrays)}

    def model_state(self) -> dict | None:
        self.weights_to_torch()
        return None

    def saved_state(self) -> dict[str, np.ndarray]:
        """What optimizer.safetensors holds: the optax state (by its paths, gathered whole), step,
        dropout key and counters. Every process calls it."""
        s = self.state
        leaves = jax.tree_util.tree_flatten_with_path(s.opt_state)[0]
        arrays = {f"opt_state{jax.tree_util.keystr(path)}": leaf for path, leaf in leaves}
        arrays.update(step=s.step, key=jax.random.key_data(s.key), skipped=s.skipped, in_a_row=s.in_a_row,
                      loss_scale=s.loss_scale.scale, good_steps=s.loss_scale.good_steps)
        return to_host(arrays)

    def load_checkpoint(self, checkpoint: Path, state: dict) -> None:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        saved = state.get("engine", "torch")
        if saved != self.name or not (checkpoint / STATE_FILE).is_file():
            raise ValueError(f"{checkpoint} was written by engine={saved}: resume it with engine={saved}, or start "
                             f"a new run from its weights (model={checkpoint})")
        load_checkpoint(checkpoint, self.whole, restore_rng=False)  # the weights, read by the torch side
        _, frozen, params = self.twin()
        self.frozen = jax.device_put(frozen, self.replicated)
        self.frozen_leaves = jax.tree.leaves(self.frozen)
        try:
            arrays = load_file(str(checkpoint / STATE_FILE))
        except SafetensorError as e:
            raise CorruptFileError(f"{checkpoint / STATE_FILE} is not a readable safetensors file ({e}): it is "
                                   "truncated or corrupt; resume from an earlier checkpoint") from None
        fresh = self.init(params, jax.random.wrap_key_data(arrays["key"]))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(fresh.opt_state)
        names = [f"opt_state{jax.tree_util.keystr(path)}" for path, _ in leaves]
        wrong = [n for (n, (_, leaf)) in zip(names, leaves) if n not in arrays or arrays[n].shape != leaf.shape]
        if wrong:
            raise ValueError(f"{checkpoint / STATE_FILE} does not match this run's model and optimizer "
                             f"({len(wrong)} state arrays missing or of another shape, e.g. {wrong[0]})")
        opt_state = jax.tree_util.tree_unflatten(treedef, [arrays[n] for n in names])
        restored = fresh._replace(step=arrays["step"], opt_state=opt_state, skipped=arrays["skipped"],
                                  in_a_row=arrays["in_a_row"])
        # an fp16 run's scale; a bf16 or fp32 run's 1, which no step read, would leave fp16 unscaled: such a
        # run (and a checkpoint from before fp16) starts from the initial scale, as torch's GradScaler does
        if "loss_scale" in arrays and (state.get("run_config") or {}).get("precision") == "fp16":
            restored = restored._replace(loss_scale=LossScale(arrays["loss_scale"], arrays["good_steps"]))
        self.state = jax.device_put(restored, self.layout)  # host arrays, each sharded as the run's
        self.skipped_before = int(arrays["skipped"])

    def evaluate_mlm(self, loader: Any, limit: int | None, slots: float | None) -> dict[str, float]:
        sums = None
        for i, batch in enumerate(loader):
            if limit is not None and i >= limit:
                break
            arrays = {k: v[0] for k, v in self.host_batches([batch], "eval").items()}
            out = self._mlm_sums(self.frozen, self.state.params, self.to_devices(arrays, P("data")))
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)  # on the device: one read at the end
        sums = {k: float(v) for k, v in jax.device_get(sums or {}).items()}
        return mlm_metrics(sums.get("mlm_sum", 0.0), sums.get("mlm_correct", 0.0), sums.get("mlm_count", 0.0),
                           sums.get("nsp_sum", 0.0), sums.get("nsp_correct", 0.0), sums.get("nsp_count", 0.0))

    def evaluate_task(self, task: Any, items: list[dict]) -> dict[str, Any]:
        """The task's metrics of this model's logits (`Task.score_outputs`: on several hosts each
        scores its share, and all get every row, as torch ranks do)."""
        return task.score_outputs(items, lambda share: self.task_logits(task, share))

    def task_logits(self, task: Any, items: list[dict]) -> list[torch.Tensor]:
        """The task's outputs for every item (a CPU tensor each, in the items' order), in batches of
        similar lengths as `Task.outputs` makes them; every batch is queued before the first is read."""
        pending, params = [], self.state.params
        for chunk, length in eval_lengths(items, task.s.eval_batch_size, self.cfg.max_length):
            batch = self.host_batches([task.collate([items[i] for i in chunk])], "eval", length)
            batch = self.to_devices({k: v[0] for k, v in batch.items()}, P("data"))
            pending.append((chunk, self._outputs(self.frozen, params, batch)))
        outputs: list = [None] * len(items)
        for chunk, logits in pending:
            for row, i in zip(torch.from_numpy(self.host_local(logits)), chunk):
                outputs[i] = row
        return outputs

    def host_local(self, x: jax.Array) -> np.ndarray:
        """This process's rows of a batch-sharded result (all of them, on one host)."""
        if jax.process_count() == 1:
            return np.array(jax.device_get(x))
        return np.array(multihost_utils.global_array_to_host_local_array(x, self.mesh, P("data")))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The steps; after them the compiling threads end (queued programs dropped, one under way
        finishing), so the process can end at once (`cli.exit_now` waits for no thread): a live
        pool cost a run on an H200 1.1-1.3 s of interpreter teardown."""
        try:
            yield
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
