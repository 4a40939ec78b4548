"""MLM (+ NSP) pretraining: the `PretrainConfig` run settings and the loop, top to bottom.

    bert-kit pretrain --config configs/pretrain_tiny.yaml max_steps=200 --output results.json
    bert-kit pretrain --config configs/pretrain_tiny.yaml --resume latest

A run folder (`output_dir`) ends up holding run_config.yaml, metrics.jsonl, loss_curve.png,
results.json, checkpoints/step-XXXXXXX/ (the last `keep_last`) and final/ (an HF model folder
with the tokenizer). The loop never loses work: checkpoints every `save_every` steps and at the
end; SIGINT/SIGTERM finish the current step, save, and exit (code 130/143); a NaN/inf loss stops
the run before the bad update, leaving the last good checkpoint as it was. Resuming restores
weights, optimizer, schedule, loss scaler, RNG states and the data position, so on CPU a resumed
run reproduces the uninterrupted one exactly.

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

import json
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bert_kit.training.trainer import AMPTrainer, NonFiniteLossError
from bert_kit.training.checkpoint import (StopSignal, collect_state, latest_checkpoint, load_checkpoint, restore_rng_state, save_checkpoint, save_model, start_run)
from bert_kit.config import BertConfig
from bert_kit.training.distributed import (DEFAULT_TIMEOUT_S, all_reduce_mean, any_rank, barrier, collective_errors, full_value, init_distributed, is_main, rank, world_size,
                                  wrap_model)
from bert_kit.model import set_low_precision_residual
from bert_kit.model_folder import locate_model
from bert_kit.training.optim import create_optimizer, create_scheduler
# CORPUS_MODES, make_datasets and make_loader are re-exported: callers import the data setup from here
from bert_kit.tasks.pretraining_data import (CORPUS_MODES, forever, load_corpus, loader_state, make_datasets,  # noqa: F401
                                    make_loader, phase_loaders, prepare_tokenizer)
from bert_kit.training.progress import ProgressLogger, plot_losses, read_metrics, truncate_metrics
from bert_kit.training.runconfig import config_to_dict, save_config
from bert_kit.training.losses import compute_mlm_loader_loss, compute_mlm_loss

PHASE_KEYS = ("fraction", "max_length", "batch_size", "grad_accum")
TOKENIZER_TRAIN_KEYS = ("vocab_size", "min_frequency", "lowercase", "limit_alphabet")


@dataclass
class PretrainConfig:
    """Settings of one pretraining run (YAML keys; `key=value` on the command line)."""

    # model and tokenizer
    model: Any = "bert-mini"
    """preset name, model folder (continues from its weights), config file, or a mapping of
    BertConfig fields with an optional `preset`, e.g. {preset: bert-mini, hidden_dropout_prob: 0}"""
    tokenizer: str | None = None  # tokenizer folder (tokenizer.json or vocab.txt); default: the model folder's
    train_tokenizer: dict | None = None  # e.g. {vocab_size: 8000}: train a WordPiece vocab on train_files first
    # data
    train_files: list[str] = field(default_factory=list)  # files, folders or globs of training text
    eval_files: list[str] = field(default_factory=list)  # held-out text; empty: use eval_fraction
    eval_fraction: float = 0.01  # share of the training corpus held out when eval_files is empty
    corpus_format: Literal["text", "lines", "jsonl", "wikitext"] = "text"  # text: blank line ends a document
    text_field: str = "text"  # JSONL field holding the text
    nsp: bool = True  # next-sentence prediction (sentence pairs); false: MLM only
    packing: bool = True  # MLM only: pack documents into full max_length blocks
    streaming: bool = False
    """read train_files lazily, for corpora bigger than memory: shuffled through a seeded buffer,
    sharded by rank and DataLoader worker, tokenised on the fly; no token cache. MLM only
    (nsp: false); evaluates on eval_files, which it needs"""
    shuffle_buffer: int = 10000  # streaming: documents held for shuffling (more: better mixed, more memory)
    mask_probability: float = 0.15  # share of tokens chosen for MLM (80% [MASK], 10% random, 10% kept)
    whole_word_masking: bool = False  # mask all WordPieces of a chosen word together
    short_seq_prob: float = 0.1  # NSP: share of pairs with a shorter random target length
    max_length: int = 128  # tokens per sequence, [CLS] and [SEP] included
    cache_dir: str | None = None  # token cache folder (default OUTPUT_DIR/token_cache)
    num_workers: int = 0  # DataLoader worker processes
    # optimisation
    batch_size: int = 32  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 1000  # optimizer steps in total (all phases)
    phases: list[dict] = field(default_factory=list)
    """steps split by sequence length, e.g. [{max_length: 128, fraction: 0.9},
    {max_length: 512, fraction: 0.1, batch_size: 8, grad_accum: 4}]; unset keys use the fields above"""
    optimizer: Literal["adamw", "lamb"] = "adamw"  # AdamW (fused on CUDA) or LAMB
    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.01  # decoupled weight decay (not on biases and LayerNorm)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam/LAMB moment decay rates
    eps: float = 1e-6  # Adam/LAMB denominator epsilon
    warmup_steps: int | None = None  # linear warmup steps; default warmup_fraction * max_steps
    warmup_fraction: float = 0.01  # warmup share of max_steps when warmup_steps is unset
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    min_lr_ratio: float = 0.0  # final lr as a share of the peak
    clip_grad: float = 1.0  # max global gradient norm (0: no clipping)
    # hardware
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on capable GPUs, fp32 on CPU
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    compile: bool = False
    """torch.compile the model with static shapes: batches padded to max_length, masked positions
    gathered into fixed prediction slots (20% of the tokens), the MLM loss compiled too (with
    parallel=fsdp on several ranks: the encoder only)"""
    cuda_graphs: bool = False  # with compile on one GPU: replay the compiled steps as CUDA graphs (grad_accum 1)
    compile_tuning: bool = False  # with compile: Triton kernels tuned by benchmarking (+2-3%, minutes to compile)
    low_precision_residual: bool = True  # 16-bit LayerNorm outputs under autocast (faster; see model.py)
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """with several processes (torchrun): ddp replicates the model on every rank; fsdp shards
    weights, gradients and optimizer state over the ranks (FSDP2), for models too big for one GPU"""
    dist_timeout_s: float = DEFAULT_TIMEOUT_S  # seconds a rank waits for the others before failing
    # bookkeeping
    output_dir: str = "runs/pretrain"  # run folder
    seed: int = 0  # seeds model init, data order, masks and dropout
    log_every: int = 10  # steps between metrics.jsonl train records
    eval_every: int = 500  # steps between evaluations (0: only at the end)
    eval_batches: int = 50  # batches per periodic evaluation (the final one uses all)
    save_every: int = 1000  # steps between checkpoints (one is always written at the end)
    keep_last: int = 3  # checkpoints kept (0: all)
    tensorboard: bool = False  # also log to OUTPUT_DIR/tensorboard (needs the tensorboard package)

    def __post_init__(self) -> None:
        if (self.cuda_graphs or self.compile_tuning) and not self.compile:
            raise ValueError("cuda_graphs and compile_tuning need compile: true")
        if self.cuda_graphs and any(p.get("grad_accum", self.grad_accum) > 1 for p in self.phases or [{}]):
            raise ValueError("cuda_graphs needs grad_accum 1 in every phase: a CUDA graph's gradients are "
                             "overwritten by its next replay, before they could be accumulated")
        for name in ("batch_size", "grad_accum", "max_steps", "max_length", "log_every", "shuffle_buffer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "eval_batches", "save_every", "keep_last", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.dist_timeout_s <= 0:
            raise ValueError(f"dist_timeout_s must be positive, got {self.dist_timeout_s}")
        if not 0 < self.mask_probability < 1:
            raise ValueError(f"mask_probability must be in (0, 1), got {self.mask_probability}")
        if not 0 <= self.eval_fraction < 1 or not 0 <= self.warmup_fraction < 1:
            raise ValueError("eval_fraction and warmup_fraction must be in [0, 1)")
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers, got {self.betas}")
        for i, phase in enumerate(self.phases):
            unknown = sorted(set(phase) - set(PHASE_KEYS))
            if unknown:
                raise ValueError(f"phases[{i}]: unknown key(s) {unknown}; valid keys: {', '.join(PHASE_KEYS)}")
            if not 0 < float(phase.get("fraction", -1)) <= 1:
                raise ValueError(f"phases[{i}]: needs a fraction in (0, 1], got {phase.get('fraction')!r}")
        if self.phases and abs(sum(float(p["fraction"]) for p in self.phases) - 1) > 1e-6:
            raise ValueError(f"phases: fractions must add up to 1, got {[p['fraction'] for p in self.phases]}")
        if self.streaming and self.nsp:
            raise ValueError("streaming: true trains MLM only (NSP pairs sentences across the whole corpus): "
                             "set nsp: false")
        if self.streaming and not self.eval_files:
            raise ValueError("streaming: true needs eval_files (a stream has no tail to hold out with "
                             "eval_fraction): name held-out text files")
        if self.train_tokenizer is not None:
            unknown = sorted(set(self.train_tokenizer) - set(TOKENIZER_TRAIN_KEYS))
            if unknown:
                raise ValueError(f"train_tokenizer: unknown key(s) {unknown}; "
                                 f"valid keys: {', '.join(TOKENIZER_TRAIN_KEYS)}")


@dataclass
class Phase:
    """Steps [start, end) run with one sequence length and batch size."""

    index: int
    start: int
    end: int
    max_length: int
    batch_size: int
    grad_accum: int


def plan_phases(cfg: PretrainConfig) -> list[Phase]:
    """Turn `phases` fractions into step ranges; the last phase takes the rounding remainder."""
    specs = cfg.phases or [{"fraction": 1.0}]
    phases, start = [], 0
    for i, spec in enumerate(specs):
        last = i == len(specs) - 1
        end = cfg.max_steps if last else min(cfg.max_steps, start + round(spec["fraction"] * cfg.max_steps))
        phases.append(Phase(i, start, end, int(spec.get("max_length", cfg.max_length)),
                            int(spec.get("batch_size", cfg.batch_size)), int(spec.get("grad_accum", cfg.grad_accum))))
        start = end
    return phases


# ---- setup helpers ----------------------------------------------------------------------------

def build_model(cfg: PretrainConfig, tokenizer: Any, max_length: int) -> torch.nn.Module:
    """BERTForPreTraining (with NSP) or BERTForMaskedLM, sized to the tokenizer's vocabulary."""
    from bert_kit.heads import BERTForMaskedLM, BERTForPreTraining

    cls = BERTForPreTraining if cfg.nsp else BERTForMaskedLM
    spec = cfg.model
    weights = ("model.safetensors", "pytorch_model.bin")
    # a preset name is a fresh model; a folder or a hub name's local copy continues from its weights
    kind, where = locate_model(spec, presets_first=True) if isinstance(spec, str) else ("mapping", spec)
    if kind == "folder" and any((Path(where) / f).is_file() for f in weights):
        model = cls.from_pretrained(where)  # continued pretraining from these weights
        config = model.config
    else:
        if isinstance(spec, dict):
            d = dict(spec)
            preset = d.pop("preset", None)
            d.setdefault("vocab_size", tokenizer.vocab_size)
            config = BertConfig.from_name(preset, **d) if preset else BertConfig.from_dict(d, source="model")
        elif kind in ("folder", "file"):
            config = BertConfig.from_file(where)
        elif kind == "preset":
            config = BertConfig.from_name(spec, vocab_size=tokenizer.vocab_size)
        else:
            raise ValueError(f"model must be a preset name, a folder, a config file or a mapping, got {spec!r}")
        model = cls(config)
    if not cfg.nsp:
        # MLM-only training never reaches the pooler; frozen, DDP does not wait for its gradients
        model.bert.pooler.requires_grad_(False)
    if config.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"model vocab_size {config.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size}")
    if max_length > config.max_position_embeddings:
        raise ValueError(f"max_length {max_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    return model


def compile_model(model: torch.nn.Module, cfg: PretrainConfig, device: torch.device) -> None:
    """torch.compile `model` in place with static shapes, CUDA graphs and kernel tuning as configured."""
    if cfg.cuda_graphs and (device.type != "cuda" or world_size() > 1):
        raise ValueError("cuda_graphs works on one CUDA GPU (one process); turn it off for CPU or torchrun runs")
    options = {"triton.cudagraphs": cfg.cuda_graphs, "coordinate_descent_tuning": cfg.compile_tuning}
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)  # eval shapes
    model.compile(dynamic=False, options=options if device.type == "cuda" else None)


def evaluate(model: torch.nn.Module, loader: Any, precision: Any, max_batches: int | None,
             prediction_slots: float | None = None) -> dict[str, float]:
    """MLM loss, perplexity, MLM accuracy (+ NSP loss/accuracy) averaged over ranks."""
    loader.set_epoch(0)  # the same batches and masks at every evaluation
    metrics = compute_mlm_loader_loss(model, loader, precision.device, max_batches, precision.autocast_dtype,
                                      prediction_slots)
    return {k: all_reduce_mean(float(v)) for k, v in metrics.items()}


def recent_train_losses(recent: dict[str, deque], out: Path, step: int, nsp: bool) -> tuple[float | None, float | None]:
    """Mean MLM and NSP train loss over the last steps; read from metrics.jsonl when no step ran
    in this process (a run resumed at its end)."""
    if recent["mlm_loss"]:  # floats, or 0-d tensors with deferred checks
        mlm, nsp_losses = [float(x) for x in recent["mlm_loss"]], [float(x) for x in recent["nsp_loss"]]
    elif is_main() and (out / "metrics.jsonl").is_file():
        since = step - (recent["mlm_loss"].maxlen or 1)
        logged = [r for r in read_metrics(out) if r["type"] == "train" and r["step"] > since]
        mlm, nsp_losses = [r["mlm_loss"] for r in logged], [r.get("nsp_loss", 0.0) for r in logged]
    else:
        mlm, nsp_losses = [], []
    if not mlm:
        return None, None
    return float(np.mean(mlm)), (float(np.mean(nsp_losses)) if nsp else None)


# ---- the training loop ------------------------------------------------------------------------

def pretrain(cfg: PretrainConfig, resume: str | None = None) -> dict[str, Any]:
    """Run (or resume) pretraining; return the results dict (also written to results.json).

    resume: a checkpoint folder, a run folder, or "latest" (newest checkpoint of output_dir).
    Under torchrun every rank calls this; if another rank dies or stalls for longer than
    `dist_timeout_s`, the others stop with a one-line `DistributedError`.
    """
    init_distributed(cfg.dist_timeout_s)
    with collective_errors(cfg.dist_timeout_s):
        return _pretrain(cfg, resume)


def _pretrain(cfg: PretrainConfig, resume: str | None) -> dict[str, Any]:
    t0 = time.time()
    main = is_main()
    out, precision, checkpoint = start_run(cfg.output_dir, cfg.precision, cfg.device, resume, cfg.seed)
    device, ckpt_dir = precision.device, out / "checkpoints"

    # 1. tokenizer, corpus (tokenised once for all phases, or only located when streamed) and model
    phases = plan_phases(cfg)
    tokenizer = prepare_tokenizer(cfg, out, checkpoint)
    corpus = load_corpus(cfg, tokenizer, out)
    model = build_model(cfg, tokenizer, max(p.max_length for p in phases))
    sharded = cfg.parallel == "fsdp" and world_size() > 1
    if sharded and precision.use_grad_scaler:
        raise ValueError("parallel=fsdp trains in bf16 or fp32 (fp16 would need loss scaling of sharded "
                         "gradients): set precision=bf16 or precision=fp32")
    if not sharded:
        model.to(device)  # FSDP2 moves each rank's shards to the device itself, layer by layer
    set_low_precision_residual(model, cfg.low_precision_residual)
    whole_model = cfg.compile and not sharded  # compiled with heads and loss on fixed prediction slots
    if cfg.compile:
        compile_model(model if whole_model else model.bert, cfg, device)  # in place: state-dict keys unchanged
    # FSDP2 gathers bf16 weights when training in bf16 on GPUs; gradients are reduced in fp32
    param_dtype = torch.bfloat16 if device.type == "cuda" and precision.dtype == torch.bfloat16 else None
    wrapped = wrap_model(model, device, cfg.parallel, param_dtype)
    if world_size() > 1:
        torch.manual_seed(cfg.seed + 1_000_003 * rank())  # same init on every rank (above), own dropout
    # after wrapping: FSDP2 has replaced the parameters by their shards
    optimizer = create_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, tuple(cfg.betas), cfg.eps, device)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_fraction * cfg.max_steps)
    scheduler = create_scheduler(optimizer, warmup, cfg.max_steps, cfg.schedule, cfg.min_lr_ratio)
    # deferred checks: the host reads losses back only at log steps and checkpoints, not every step
    trainer = AMPTrainer(wrapped, optimizer, scheduler, precision, clip_grad=cfg.clip_grad,
                         mlm_slots=0.2 if whole_model else None, deferred_checks=True)
    if whole_model:
        trainer.mlm_loss_fn = torch.compile(compute_mlm_loss, dynamic=False)
    step, resume_state = 0, None
    if checkpoint is not None:
        resume_state = load_checkpoint(checkpoint, model, optimizer=optimizer, scheduler=scheduler,
                                       scaler=trainer.scaler, restore_rng=False)
        step = trainer.step = int(resume_state["step"])
    run_config = config_to_dict(cfg)
    if main:
        save_config(cfg, out / "run_config.yaml")
        if checkpoint is not None:
            truncate_metrics(out, step)  # records after the checkpoint belong to the lost steps
        n_params = sum(p.numel() for p in model.parameters())
        where = f", resuming from {checkpoint} at step {step}" if checkpoint else ""
        ranks = f", {world_size()} ranks ({'FSDP2' if sharded else 'DDP'})" if world_size() > 1 else ""
        print(f"model: {type(model).__name__} {n_params / 1e6:.2f}M parameters, "
              f"vocab {model.config.vocab_size}{ranks}{where}", flush=True)

    # 2. the loop: one iteration = one optimizer step of grad_accum micro-batches
    logger = ProgressLogger(out, cfg.max_steps, step, enabled=main, tensorboard=cfg.tensorboard, desc="pretrain")
    phase = loader = eval_loader = batches = None
    window = {"loss": 0.0, "mlm_loss": 0.0, "nsp_loss": 0.0, "n": 0, "tokens": 0, "time": 0.0}
    keep = max(1, min(200, cfg.max_steps // 10))  # the final train loss averages the last 10% of steps
    recent = {"mlm_loss": deque(maxlen=keep), "nsp_loss": deque(maxlen=keep)}
    first_mlm_loss = shown_loss = shown_tok_s = None
    train_tokens, train_time, stopped = 0, 0.0, None
    try:
        with StopSignal() as stop:
            if resume_state is not None:
                restore_rng_state(resume_state)  # last thing before training continues
            while step < cfg.max_steps:
                # (a) the data of this phase; after a resume, continue at the saved position
                if phase is None or step >= phase.end:
                    phase = next(p for p in phases if p.start <= step < p.end)
                    data = (resume_state or {}).get("data")
                    loader, eval_loader, about = phase_loaders(cfg, corpus, tokenizer, phase, device, data)
                    resume_state = None
                    batches = forever(loader)
                    trainer.grad_accum = phase.grad_accum
                    global_batch = phase.batch_size * phase.grad_accum * world_size()
                    logger.message(f"phase {phase.index}: steps {phase.start}-{phase.end}, "
                                   f"max_length {phase.max_length}, global batch {global_batch} sequences "
                                   f"(batch {phase.batch_size} x grad_accum {phase.grad_accum} x {world_size()} "
                                   f"rank(s)), {about}")

                # (b) forward/backward over the micro-batches; the trainer steps the optimizer
                t_step, lr = time.time(), trainer.lr
                step_loss = dict.fromkeys(("loss", "mlm_loss", "nsp_loss"), 0.0)
                for _ in range(phase.grad_accum):
                    batch = next(batches)
                    window["tokens"] += int(batch["attention_mask"].sum())  # CPU tensor: no device sync
                    trainer.mlm_step(batch)  # raises NonFiniteLossError before a bad update
                    for k in step_loss:
                        step_loss[k] += trainer.last.get(k, 0.0) / phase.grad_accum
                step += 1
                window["time"] += time.time() - t_step
                for k in step_loss:
                    window[k] += step_loss[k]
                window["n"] += 1
                if first_mlm_loss is None:
                    first_mlm_loss = step_loss["mlm_loss"]
                recent["mlm_loss"].append(step_loss["mlm_loss"])
                if cfg.nsp:
                    recent["nsp_loss"].append(step_loss["nsp_loss"])

                # (c) logging: bar every step, a metrics.jsonl record every log_every steps
                logging = step % cfg.log_every == 0 or step == cfg.max_steps or step == 1
                if logging and trainer.deferred:  # wait for the queued steps: their time is this window's
                    t_sync = time.time()
                    trainer.check_finite()
                    window["time"] += time.time() - t_sync
                tok_s = window["tokens"] * world_size() / max(window["time"], 1e-9)
                if logging or not trainer.deferred:  # deferred: values known at log steps only
                    shown_loss, shown_tok_s = float(step_loss["loss"]), f"{tok_s:,.0f}"
                logger.update(step, loss=shown_loss, lr=lr, tok_s=shown_tok_s)
                if logging:
                    # every rank reaches this step: losses are averaged over all of them
                    n = window["n"]
                    losses = {k: all_reduce_mean(float(window[k]) / n) for k in ("loss", "mlm_loss", "nsp_loss")}
                    record = {"loss": losses["loss"], "mlm_loss": losses["mlm_loss"], "lr": lr,
                              "grad_norm": float(full_value(trainer.last["grad_norm"])), "tokens_per_s": tok_s,
                              "phase": phase.index, "max_length": phase.max_length, "epoch": loader.epoch,
                              "global_batch": global_batch}
                    if cfg.nsp:
                        record["nsp_loss"] = losses["nsp_loss"]
                    logger.log("train", step, **record)
                    train_tokens += window["tokens"] * world_size()
                    train_time += window["time"]
                    window = dict.fromkeys(window, 0)

                # (d) periodic evaluation
                if eval_loader is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
                    metrics = evaluate(trainer.raw_model, eval_loader, precision, cfg.eval_batches, trainer.mlm_slots)
                    logger.log("eval", step, **metrics)
                    logger.message(f"step {step}: eval mlm_loss {metrics['mlm_loss']:.4f}, "
                                   f"perplexity {metrics['perplexity']:.1f}")

                # (e) checkpoint every save_every steps, at the end, and when asked to stop
                stopping = any_rank(stop.signum is not None)
                if stopping or step == cfg.max_steps or (cfg.save_every and step % cfg.save_every == 0):
                    trainer.check_finite()  # never save weights after a skipped (non-finite) step
                    collected = collect_state(model, optimizer)  # every rank: gathers FSDP2 shards, RNG states
                    data_state = loader_state(loader, phase)  # every rank: a stream gathers each rank's position
                    if main:
                        path = save_checkpoint(ckpt_dir, step, model, tokenizer=tokenizer, optimizer=optimizer,
                                               scheduler=scheduler, scaler=trainer.scaler, run_config=run_config,
                                               data_state=data_state, keep_last=cfg.keep_last, collected=collected)
                        logger.message(f"step {step}: saved {path}")
                    barrier()
                if stopping:
                    stopped = signal.Signals(stop.signum or signal.SIGTERM).name
                    break
        train_tokens += window["tokens"] * world_size()
        train_time += window["time"]

        # 3. final evaluation and the HF model folder (not after a stop signal: the run goes on later)
        train_mlm, train_nsp = recent_train_losses(recent, out, step, cfg.nsp)
        if recent["mlm_loss"]:  # trained in this process, as every other rank did: average over ranks
            train_mlm = all_reduce_mean(train_mlm)
            train_nsp = all_reduce_mean(train_nsp) if train_nsp is not None else None
        results: dict[str, Any] = {
            "train_mlm_loss": train_mlm, "train_nsp_loss": train_nsp,
            "test_mlm_loss": None, "test_nsp_loss": None, "test_nsp_accuracy": None,
            "test_perplexity": None, "test_mlm_accuracy": None,
            "initial_train_mlm_loss": float(first_mlm_loss) if first_mlm_loss is not None else None,
            "steps": step, "world_size": world_size(),
            "global_batch": phases[-1].batch_size * phases[-1].grad_accum * world_size(),
            "tokens_per_second": train_tokens / train_time if train_time else None,
            "train_tokens": train_tokens, "wall_time_s": None, "stopped": stopped, "output_dir": str(out),
        }
        if stopped is None and eval_loader is None and step > 0:
            # resumed at the very end (a crash after the last checkpoint): still evaluate
            _, eval_loader, _ = phase_loaders(cfg, corpus, tokenizer, phases[-1], device)
        if stopped is None and eval_loader is not None:
            metrics = evaluate(trainer.raw_model, eval_loader, precision, None, trainer.mlm_slots)
            logger.log("eval", step, **metrics, final=True)
            results.update(test_mlm_loss=metrics["mlm_loss"], test_perplexity=metrics["perplexity"],
                           test_mlm_accuracy=metrics["mlm_accuracy"], test_nsp_loss=metrics.get("nsp_loss"),
                           test_nsp_accuracy=metrics.get("nsp_accuracy"))
        if stopped is None:
            final, collected = out / "final", collect_state(model)  # every rank: gathers FSDP2 shards
            if main:
                save_model(model, final, collected.get("model"))
                tokenizer.save(final)
                results["final_model"] = str(final)
    except NonFiniteLossError as e:
        last = latest_checkpoint(ckpt_dir)
        logger.log("error", e.step, message=str(e))
        e.args = (f"{e}: stopping without saving this step. Last good checkpoint: {last or 'none'}. "
                  "Try a lower lr, clip_grad > 0, or another precision.",)
        raise
    finally:
        logger.close()

    if main:
        try:
            plot_losses(out)
        except ValueError:
            pass  # nothing logged yet (stopped before the first step)
        results["wall_time_s"] = time.time() - t0
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    barrier()
    return results
