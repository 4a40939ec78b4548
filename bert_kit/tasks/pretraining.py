"""MLM (+ NSP) pretraining: the job the one training loop runs for `bert-kit pretrain`.

    bert-kit pretrain --config configs/pretrain_tiny.yaml max_steps=200 --output results.json
    bert-kit pretrain --config configs/pretrain_tiny.yaml --resume latest

A run folder (`output_dir`) ends up holding run_config.yaml, metrics.jsonl, loss_curve.png,
results.json, checkpoints/step-XXXXXXX/ (the last `keep_last`) and final/ (an HF model folder
with the tokenizer). What the loop promises (training/loop.py): checkpoints every `save_every`
steps and at the end; SIGINT/SIGTERM finish the current step, save, and exit (code 130/143); a
NaN/inf loss stops the run before it is saved; resuming restores weights, optimizer, schedule,
loss scaler, RNG states and the data position, so on CPU a resumed run reproduces the
uninterrupted one exactly. `time_budget` (e.g. 6m) ends the run when the time is spent.

Data (bert_kit/tasks/pretraining_data.py): with `nsp: true`, documents are split into sentences and
paired as BERT did (`NSPDataset`); with `nsp: false` the corpus is tokenised once into an on-disk
`TokenCache` and packed into full-length blocks (`packing: true`, RoBERTa style) or truncated
per document. With `streaming: true` (MLM only) corpora bigger than memory are read lazily
through a seeded shuffle buffer, sharded by rank and DataLoader worker and tokenised on the fly;
a resumed stream skips the examples each rank consumed, and with the same seed sees exactly the
examples an uninterrupted run would have. Two-phase schedules (`phases`) switch sequence length
and batch size part-way, as BERT's 128 -> 512 recipe; the learning-rate schedule spans all phases.

Several processes: `torchrun --nproc_per_node N -m bert_kit pretrain --config ...` runs the same
command on N ranks (docs/distributed.md). Each rank reads its own shard of every epoch, the
model is replicated (DDP, the default) or sharded (`parallel: fsdp`, FSDP2), and one optimizer
step covers batch_size x grad_accum x N sequences (the global batch). Rank 0 alone logs, plots
and writes files; checkpoints keep the single-process format, so any number of ranks resumes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from bert_kit.families import fresh_config, load_model, model_class
from bert_kit.kernels import fast_path
from bert_kit.model import set_dropout
from bert_kit.model_folder import locate_model
from bert_kit.tasks import engine_class
from bert_kit.tasks.pretraining_config import PretrainConfig, plan_phases
# CORPUS_MODES, make_datasets and make_loader are re-exported: callers import the data setup from here
from bert_kit.tasks.pretraining_data import (CORPUS_MODES, forever, load_corpus, loader_state,  # noqa: F401
                                             make_datasets, make_loader, phase_loaders, prediction_slots,
                                             prepare_tokenizer)
from bert_kit.training.checkpoint import save_model
from bert_kit.training.distributed import all_reduce_mean, is_main, world_size
from bert_kit.training.job import Job, Run
from bert_kit.training.loop import UNBOUNDED_STEPS, run_job
from bert_kit.training.losses import compute_mlm_loss, compute_pretraining_loss


def build_model(cfg: PretrainConfig, tokenizer: Any, max_length: int) -> torch.nn.Module:
    """The MLM model of the architecture `cfg.model` names (with NSP: `BERTForPreTraining`; a
    ModernBERT: `ModernBertForMaskedLM`), sized to the tokenizer's vocabulary."""
    role = "ForPreTraining" if cfg.nsp else "ForMaskedLM"
    spec = cfg.model
    weights = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
    # a preset name is a fresh model; a folder or a hub name's local copy continues from its weights
    kind, where = locate_model(spec, presets_first=True) if isinstance(spec, str) else ("mapping", spec)
    if kind == "folder" and any((Path(where) / f).is_file() for f in weights):
        model = load_model(role, where)  # continued pretraining from these weights
    else:  # a preset, a mapping of fields, a config file, or a folder holding only config.json
        config = fresh_config(where, "file" if kind == "folder" else kind, tokenizer)
        model = model_class(config, role)(config)
    config = model.config
    if not cfg.nsp:
        # MLM-only training never reaches the pooler; frozen, DDP does not wait for its gradients
        if getattr(model.bert, "pooler", None) is not None:
            model.bert.pooler.requires_grad_(False)
    if config.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"model vocab_size {config.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    if max_length > config.max_length:
        raise ValueError(f"max_length {max_length} exceeds the model's {config.max_length} positions "
                         f"(max_position_embeddings {config.max_position_embeddings})")
    return model


def use_cuda_graphs(cfg: PretrainConfig, device: torch.device) -> bool:
    """Whether the compiled steps replay as CUDA graphs: `cuda_graphs` true or auto, on CUDA GPUs with
    grad_accum 1, one process or DDP's (the trainer then all-reduces the gradients: no DDP hooks);
    true where that cannot hold is an error."""
    sharded = cfg.parallel == "fsdp" and world_size() > 1
    possible = cfg.compile and device.type == "cuda" and not sharded and not cfg.accumulates_gradients
    if cfg.cuda_graphs is True and not possible:
        raise ValueError(f"cuda_graphs: true works on CUDA GPUs without parallel=fsdp, here {device.type} with "
                         f"{world_size()} process(es); set cuda_graphs: auto or false")
    return possible and cfg.cuda_graphs in (True, "auto")


def compile_model(model: torch.nn.Module, cfg: PretrainConfig, device: torch.device, cuda_graphs: bool) -> None:
    """torch.compile `model` in place with static shapes, CUDA graphs and kernel tuning as configured
    (after `fast_path.apply`, which puts on the kernels that run compiled)."""
    options = {"triton.cudagraphs": cuda_graphs, "coordinate_descent_tuning": cfg.compile_tuning}
    model.compile(dynamic=False, options=options if device.type == "cuda" else None)


class PretrainingJob(Job):
    """MLM (+ NSP) on a corpus: batches per phase, the MLM loss, held-out MLM loss, final/."""

    name, unit, metric = "pretrain", "tokens", None

    def __init__(self, cfg: PretrainConfig, run: Run) -> None:
        self.cfg, self.device, self.precision = cfg, run.precision.device, run.precision
        self.total_steps = cfg.max_steps or UNBOUNDED_STEPS
        self.phases = plan_phases(cfg, self.total_steps)
        cuda_graphs = self.compiled_graphs = use_cuda_graphs(cfg, self.device)  # fails before the corpus is read
        self.tokenizer = prepare_tokenizer(cfg, run.out, run.checkpoint)
        self.corpus = load_corpus(cfg, self.tokenizer, run.out)
        model = build_model(cfg, self.tokenizer, max(p.max_length for p in self.phases))
        sharded = cfg.parallel == "fsdp" and world_size() > 1
        if not sharded:
            model.to(self.device)  # FSDP2 moves each rank's shards to the device itself, layer by layer
        if cfg.dropout is not None:
            set_dropout(model, cfg.dropout)  # the saved config keeps the model's rates, for fine-tuning
        # compiled whole (heads and loss) on static shapes: masked positions in fixed prediction slots,
        # which the training loader fills (evaluation fills them here)
        self.slots = prediction_slots(cfg)
        whole_model = self.slots is not None
        if cfg.engine == "torch":  # the kernels this device allows, then the compiler (the JAX engine has its own)
            fast = fast_path.apply(model, self.device, training=True, dtype=self.precision.dtype, compile=cfg.compile,
                                   compile_heads=whole_model, low_precision_residual=cfg.low_precision_residual)
        else:
            fast = fast_path.FastPath(note=fast_path.JAX_ENGINE)
        self.fast_path = str(fast)
        if cfg.compile and cfg.engine == "torch":
            compile_model(model if whole_model else model.bert, cfg, self.device, cuda_graphs)  # in place: same keys
        self.mlm_loss_fn = torch.compile(compute_mlm_loss, dynamic=False) if whole_model else compute_mlm_loss
        self.model = model
        self.eval_every, self.save_every = cfg.eval_every, cfg.save_every
        self.phase = self.loader = self.eval_loader = self.batches = None
        self.kept_eval: tuple[Any, int, list[dict]] | None = None  # (eval loader, batches asked, batches): `held_out`
        self.resumed_data: dict | None = None
        if is_main():
            where = f", resuming from {run.checkpoint} at step {run.state['step']}" if run.checkpoint else ""
            how = (f"JAX engine, parallel={cfg.parallel}" if cfg.engine == "jax" else 'FSDP2' if sharded
                   else 'gradients all-reduced in the CUDA graphs' if cuda_graphs else 'DDP')
            ranks = f", {world_size()} ranks ({how})" if world_size() > 1 else ""
            print(f"model: {type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
                  f"parameters, vocab {model.config.vocab_size}{ranks}{where}", flush=True)
            print(self.fast_path, flush=True)

    def enter_phase(self, step: int) -> None:
        """The loaders of the phase holding `step`; after a resume, at the saved position."""
        cfg = self.cfg
        self.phase = next(p for p in self.phases if p.start <= step < p.end)
        self.loader, self.eval_loader, about = phase_loaders(cfg, self.corpus, self.tokenizer, self.phase,
                                                             self.device, self.resumed_data)
        self.resumed_data = None
        self.batches = forever(self.loader)
        p = self.phase
        if p.end < UNBOUNDED_STEPS and hasattr(self.loader, "stop_after"):  # a streamed corpus has no epoch length
            self.loader.stop_after((p.end - step) * p.grad_accum)
        self.log(f"phase {p.index}: steps {p.start}-{p.end if p.end < UNBOUNDED_STEPS else 'end of time budget'}, "
                 f"max_length {p.max_length}, global batch {self.global_batch} sequences (batch {p.batch_size} x "
                 f"grad_accum {p.grad_accum} x {world_size()} rank(s)), {about}")

    @property
    def global_batch(self) -> int:
        p = self.phase or self.phases[-1]
        return p.batch_size * p.grad_accum * world_size()

    def step_batches(self, step: int) -> list[dict]:
        if self.phase is None or step >= self.phase.end:
            self.enter_phase(step)
        return [next(self.batches) for _ in range(self.phase.grad_accum)]  # slots filled by the loader

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return compute_pretraining_loss(model, batch, self.mlm_loss_fn)

    def count(self, batch: dict) -> int:
        return int(batch["attention_mask"].sum())  # a CPU tensor: no device sync

    def evaluate(self, final: bool) -> dict[str, float] | None:
        if self.eval_loader is None and self.phase is None:  # resumed at the end: the last phase's data
            _, self.eval_loader, _ = phase_loaders(self.cfg, self.corpus, self.tokenizer, self.phases[-1], self.device)
        if self.eval_loader is None:
            return None
        # the last evaluation reads every held-out batch, unless a time budget must hold it
        limit = None if final and self.cfg.time_budget is None else self.cfg.eval_batches
        metrics = self.engine.evaluate_mlm(self.held_out(limit), limit, self.slots)
        return {k: all_reduce_mean(float(v)) for k, v in metrics.items()}

    def held_out(self, limit: int | None) -> Iterable[dict]:
        """The held-out batches: the same ones, masks included, at every evaluation. The first `limit`
        are kept after the first read (the loader would start its workers and mask them again)."""
        loader = self.eval_loader
        if limit is None:
            loader.set_epoch(0)
            return loader
        if self.kept_eval is None or self.kept_eval[0] is not loader or self.kept_eval[1] < limit:
            loader.set_epoch(0)
            self.kept_eval = (loader, limit, list(itertools.islice(loader, limit)))  # fewer if the set is smaller
        return self.kept_eval[2][:limit]

    def final_eval_steps(self) -> float:
        # with a time budget the last evaluation reads eval_batches batches of the training size
        return self.cfg.eval_batches / 3 if self.eval_loader is not None else 0.0

    def save_model(self, folder: Path, state: dict | None) -> None:
        save_model(self.model, folder, state)
        self.tokenizer.save(folder)

    def data_state(self) -> dict:
        return loader_state(self.loader, self.phase) if self.loader is not None else {}

    def load_data_state(self, state: dict) -> None:
        self.resumed_data = state or None

    def log_fields(self) -> dict[str, Any]:
        return {"phase": self.phase.index, "max_length": self.phase.max_length, "epoch": self.loader.epoch,
                "global_batch": self.global_batch}

    def results(self, final: dict[str, float] | None, summary: dict[str, Any]) -> dict[str, Any]:
        final = final or {}
        return {"train_mlm_loss": summary.get("train_mlm_loss"), "train_nsp_loss": summary.get("train_nsp_loss"),
                "initial_train_mlm_loss": summary.get("initial_train_mlm_loss"),
                "test_mlm_loss": final.get("mlm_loss"), "test_perplexity": final.get("perplexity"),
                "test_mlm_accuracy": final.get("mlm_accuracy"), "test_nsp_loss": final.get("nsp_loss"),
                "test_nsp_accuracy": final.get("nsp_accuracy"), "global_batch": self.global_batch,
                "fast_path": self.fast_path.removeprefix("fast path: ")}


def pretrain(cfg: PretrainConfig, resume: str | None = None, started: float | None = None) -> dict[str, Any]:
    """Run (or resume) pretraining; return the results dict (also written to results.json).

    resume: a checkpoint folder, a run folder, or "latest" (newest checkpoint of output_dir).
    started: time.time() a time budget counts from (default: this call; `bert-kit`: its launch).
    Under torchrun every rank calls this (see `run_job`).
    """
    return run_job(PretrainingJob, cfg, resume, started, engine_class(cfg.engine))
