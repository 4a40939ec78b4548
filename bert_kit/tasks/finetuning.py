"""Fine-tuning: the `FinetuneConfig` run settings and one loop shared by the four tasks.

    bert-kit finetune --task classification --config configs/finetune_sst2.yaml
    bert-kit finetune --task qa --config configs/finetune_squad.yaml epochs=1 batch_size=16
    bert-kit finetune --config configs/finetune_sst2.yaml --resume latest

The model starts from a folder (an HF BERT such as all-MiniLM-L6-v2, a bert-kit pretraining run
or checkpoint), a preset name (random init) or a config file; `bert_kit.tasks` puts the task's
head on it and supplies data, loss and metric. The run folder (`output_dir`) ends up holding
run_config.yaml, metrics.jsonl, loss_curve.png, results.json, checkpoints/step-XXXXXXX/ (the
last `keep_last`) and best/: the model with the best validation metric so far, loadable by
`from_pretrained` and `transformers`, with the tokenizer and the label names (config.json id2label).

Robustness is that of pretraining (same modules): atomic checkpoints; SIGINT/SIGTERM finish the
step, save and exit (130/143); a NaN/inf loss stops before the bad update; resuming restores
weights, optimizer, schedule, RNG, the data position and the best metric so far.

Several processes: `torchrun --nproc_per_node N -m bert_kit finetune --config ...` works as for
pretraining (docs/distributed.md): each rank trains on its shard of every epoch, DDP (default) or
FSDP2 (`parallel: fsdp`), so an optimizer step covers batch_size x grad_accum x N examples and an
epoch has N times fewer steps. Every rank evaluates its share of the validation set and all
predictions are gathered (`tasks.shard_and_gather`), so no rank idles at a barrier while another
evaluates; every rank then holds the same metrics and the same best so far. Rank 0 alone logs
and writes best/, checkpoints and results.json; checkpoints count the data position in examples,
so a run resumes on any number of ranks.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bert_kit.training.trainer import AMPTrainer, NonFiniteLossError
from bert_kit.training.checkpoint import (StopSignal, collect_state, latest_checkpoint, load_checkpoint, restore_rng_state, resume_position, save_checkpoint, save_model,
                                 start_run)
from bert_kit.training.distributed import (DEFAULT_TIMEOUT_S, all_reduce_mean, any_rank, barrier, collective_errors, full_value, init_distributed, is_main, rank, world_size,
                                  wrap_model)
from bert_kit.training.optim import create_optimizer, create_scheduler
from bert_kit.tasks.pretraining_data import forever
from bert_kit.training.progress import ProgressLogger, plot_losses, truncate_metrics
from bert_kit.training.runconfig import check_run_settings, config_to_dict, save_config
from bert_kit.checks import ConfigError, Range, fraction, non_negative, positive
from bert_kit.model_folder import locate_model, model_config, write_model_metadata, write_sentence_transformers_files
from bert_kit.tasks import make_task
from bert_kit.tasks.base import Task

DEFAULT_MAX_LENGTH = {"qa": 384}  # other tasks: 128


@dataclass
class FinetuneConfig:
    """Settings of one fine-tuning run (YAML keys; `key=value` on the command line)."""

    task: Literal["classification", "token-classification", "qa", "similarity"] = "classification"  # head and data
    model: str = ""  # model folder (HF BERT, bert-kit run or checkpoint), preset name (random init) or config file
    tokenizer: str | None = None  # tokenizer folder; default: the model folder's
    # data
    train_file: str = ""  # training data (classification TSV/CSV/JSONL, CoNLL, SQuAD JSON, STS-B)
    validation_file: str | None = None  # evaluated every epoch; QA with squad_train_articles: the rest of train_file
    max_train_examples: int | None = None  # use only the first N training examples (quick runs)
    max_eval_examples: int | None = None  # evaluate on the first N validation examples only
    max_length: int | None = None  # tokens per sequence; default 128 (QA 384)
    # classification
    text_column: str = "sentence"  # column (or JSON key) of the text
    text_pair_column: str | None = None  # column of the second text, for sentence pairs
    label_column: str = "label"  # column of the label: ints, names, or floats (regression)
    num_labels: int | None = None  # default: from the training labels; 1 = regression (MSE)
    label_names: list[str] | None = None  # names of label ids 0..K-1 (saved as id2label)
    # token classification
    tag_column: int = -1  # CoNLL column of the tag (default the last)
    # question answering
    doc_stride: int = 128  # context tokens shared by consecutive windows of a long context
    max_query_length: int = 64  # questions are cut to this many tokens
    n_best: int = 20  # start/end candidates per window in the span search
    max_answer_length: int = 30  # longest answer span in tokens
    squad_train_articles: int | None = None  # split train_file by article: the first N train, the rest evaluate
    # sentence similarity
    similarity_mode: Literal["cross-encoder", "bi-encoder"] = "cross-encoder"  # regression on the pair, or cosine
    pooling: Literal["mean", "cls"] = "mean"  # bi-encoder pooling
    similarity_loss: Literal["cosine", "cosent"] = "cosine"  # bi-encoder: MSE on cos(u, v), or the CoSENT ranking loss
    # optimisation
    epochs: float = 3.0  # passes over the training data (max_steps wins when set)
    max_steps: int | None = None  # optimizer steps in total
    batch_size: int = 32  # examples per micro-batch per process
    eval_batch_size: int = 64  # examples per evaluation batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 2e-5  # peak learning rate
    weight_decay: float = 0.01  # decoupled weight decay (not on biases and LayerNorm)
    betas: list[float] | None = None  # Adam moment decay rates (default [0.9, 0.999])
    eps: float = 1e-6  # Adam epsilon
    optimizer: Literal["adamw", "lamb"] = "adamw"  # AdamW (fused on CUDA) or LAMB
    warmup_fraction: float = 0.1  # warmup share of the steps (when warmup_steps is unset)
    warmup_steps: int | None = None  # linear warmup steps
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    clip_grad: float = 1.0  # max global gradient norm (0: no clipping)
    classifier_dropout: float | None = None  # dropout before the head (default hidden_dropout_prob)
    # hardware
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 on capable GPUs, fp32 on CPU
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    unpadded: bool = False  # run only real tokens through the encoder (packed fast path)
    compile: bool = False  # torch.compile the encoder; batches padded to multiples of 16 (few shapes), not unpadded
    cuda_graphs: bool = False  # with compile on CUDA: replay each shape as a CUDA graph (short sequences)
    num_workers: int = 0  # DataLoader worker processes
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """with several processes (torchrun): ddp replicates the model on every rank; fsdp shards
    weights, gradients and optimizer state over the ranks (FSDP2), for models too big for one GPU"""
    dist_timeout_s: float = DEFAULT_TIMEOUT_S  # seconds a rank waits for the others before failing
    # bookkeeping
    output_dir: str = "runs/finetune"  # run folder
    seed: int = 42  # seeds the head init, data order and dropout
    metric: str | None = None  # validation metric that picks best/ (higher is better); default per task
    log_every: int = 10  # steps between metrics.jsonl train records
    eval_every: int = 0  # steps between evaluations (0: at the end of every epoch)
    save_every: int = 0  # steps between checkpoints (0: with every evaluation)
    keep_last: int = 2  # checkpoints kept (0: all)
    tensorboard: bool = False  # also log to OUTPUT_DIR/tensorboard

    def __post_init__(self) -> None:
        for name in ("model", "tokenizer", "train_file", "validation_file", "output_dir"):
            if isinstance(getattr(self, name), Path):  # Path objects from Python callers; YAML wants str
                setattr(self, name, str(getattr(self, name)))
        if self.max_length is None:
            self.max_length = DEFAULT_MAX_LENGTH.get(self.task, 128)
        if self.compile and self.unpadded:  # the compiled graphs take static padded shapes
            self.unpadded = False
        if self.betas is None:
            self.betas = [0.9, 0.999]
        # what each setting may be; the errors name key, value and range (bert_kit/checks.py)
        check_run_settings(self, {
            "max_steps": positive(integer=True, optional=True, hint="null: from epochs"),
            "epochs": positive(),
            "eval_batch_size": positive(integer=True),
            "max_length": Range(3, integer=True, hint="room for [CLS] text [SEP]"),
            "max_train_examples": positive(integer=True, optional=True),
            "max_eval_examples": positive(integer=True, optional=True),
            "num_labels": positive(integer=True, optional=True, hint="1 = regression"),
            "tag_column": Range(integer=True),
            "doc_stride": non_negative(integer=True),
            "max_query_length": positive(integer=True),
            "n_best": positive(integer=True),
            "max_answer_length": positive(integer=True),
            "squad_train_articles": positive(integer=True, optional=True),
            "classifier_dropout": fraction(high_open=True, optional=True),
        })
        if self.label_names is not None:
            names = self.label_names
            if not names or len(set(map(str, names))) != len(names):
                raise ConfigError(f"label_names={names!r} must be distinct names, one per label id")
            if self.num_labels is not None and self.num_labels != len(names):
                raise ConfigError(f"num_labels={self.num_labels} contradicts the {len(names)} label_names {names}")
        room = self.max_length - self.max_query_length - 3  # context tokens of a QA window
        if self.task == "qa" and room < 2:
            raise ConfigError(f"max_query_length={self.max_query_length} is out of range: a window of max_length "
                              f"{self.max_length} must also hold [CLS], 2 [SEP] and context tokens: expected an "
                              f"integer < {self.max_length - 4}")
        if self.task == "qa" and self.doc_stride >= room:
            raise ConfigError(f"doc_stride={self.doc_stride} is out of range: expected an integer < {room} "
                              f"(max_length {self.max_length} - max_query_length {self.max_query_length} - 3 "
                              "special tokens: the context tokens of a window)")
        # the sequences must fit the model's position table, when the model is known here
        try:
            config = model_config(self.model) if self.model else None
        except ConfigError:
            config = None  # an unknown model name: `finetune` names it before reading any data
        if config is not None and self.max_length > config.max_position_embeddings:
            raise ConfigError(f"max_length={self.max_length} is out of range: the model holds "
                              f"{config.max_position_embeddings} positions (max_position_embeddings)")


def make_loader(task: Task, items: list[dict], cfg: FinetuneConfig, device: torch.device) -> Any:
    """A shuffled, resumable loader with dynamic padding: the order is a function of (seed, epoch)."""
    from bert_kit.data.pretraining import DistributedResumableSampler, ResumableDataLoader

    sampler = DistributedResumableSampler(len(items), shuffle=True, seed=cfg.seed, rank=rank(), world_size=world_size())
    return ResumableDataLoader(items, sampler, batch_size=cfg.batch_size, collate_fn=task.collate,
                               num_workers=cfg.num_workers, pin_memory=device.type == "cuda",
                               generator=torch.Generator().manual_seed(cfg.seed))


def save_best(model: torch.nn.Module, tokenizer: Any, task: Task, folder: Path,
              state: dict[str, torch.Tensor] | None = None) -> None:
    """best/: the HF model folder plus tokenizer, label names and the task settings.

    state: the full state dict `collect_state` gathered (an FSDP2 model holds only shards).
    Call on rank 0 only."""
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    for leftover in (tmp, old):  # from a run killed while saving
        if leftover.exists():
            shutil.rmtree(leftover)
    save_model(model, tmp, state)
    tokenizer.save(tmp)
    write_model_metadata(tmp, task.metadata())
    if task.name == "similarity" and task.s.similarity_mode == "bi-encoder":
        write_sentence_transformers_files(tmp, task.s.pooling, task.s.max_length)
    if folder.exists():  # swap in the new one; a crash in between leaves best.tmp complete
        folder.replace(old)
        tmp.replace(folder)
        shutil.rmtree(old)
    else:
        tmp.replace(folder)


def finetune(cfg: FinetuneConfig, resume: str | None = None) -> dict[str, Any]:
    """Run (or resume) a fine-tuning run; return the results dict (also written to results.json).

    resume: a checkpoint folder, a run folder, or "latest" (newest checkpoint of output_dir).
    Under torchrun every rank calls this; if another rank dies or stalls for longer than
    `dist_timeout_s`, the others stop with a one-line `DistributedError`.
    """
    init_distributed(cfg.dist_timeout_s)
    with collective_errors(cfg.dist_timeout_s):
        return _finetune(cfg, resume)


def _finetune(cfg: FinetuneConfig, resume: str | None) -> dict[str, Any]:
    from bert_kit.tokenizer import get_tokenizer

    t0 = time.time()
    main = is_main()
    # seeds every RNG: the same head init on every rank
    out, precision, checkpoint = start_run(cfg.output_dir, cfg.precision, cfg.device, resume, cfg.seed)
    device, ckpt_dir = precision.device, out / "checkpoints"
    if not cfg.model:
        raise ValueError("model is empty: name a model folder or a preset (model=path/to/bert)")
    if not cfg.train_file:
        raise ValueError("train_file is empty: name the training data file")
    kind, where = locate_model(cfg.model)  # a bad model name fails before the data is read
    if not (checkpoint or cfg.tokenizer or kind == "folder"):
        raise ValueError(f"model {cfg.model!r} is not a folder, so it has no tokenizer: set tokenizer=FOLDER")

    # 1. tokenizer, data, model (the head on the pretrained encoder), optimizer
    tokenizer = get_tokenizer(checkpoint or cfg.tokenizer or where)
    task = make_task(cfg.task, cfg)
    task.bind(tokenizer)
    train_items = task.read_train(cfg.train_file)[: cfg.max_train_examples]
    eval_path = cfg.validation_file or (cfg.train_file if cfg.task == "qa" and cfg.squad_train_articles else None)
    eval_items = task.read_eval(eval_path, cfg.max_eval_examples) if eval_path else None
    if not train_items:
        raise ValueError(f"{cfg.train_file}: no training examples")
    model = task.build(cfg.model)
    sharded = cfg.parallel == "fsdp" and world_size() > 1
    if sharded and precision.use_grad_scaler:
        raise ValueError("parallel=fsdp trains in bf16 or fp32 (fp16 would need loss scaling of sharded "
                         "gradients): set precision=bf16 or precision=fp32")
    if not sharded:
        model.to(device)  # FSDP2 moves each rank's shards to the device itself, layer by layer
    if cfg.compile:  # padded to multiples of 16: a few static shapes, each compiled once
        mode = "reduce-overhead" if cfg.cuda_graphs and device.type == "cuda" else None
        # one graph per padded length, batch size and train/eval: more than dynamo's default 8,
        # past which it would silently fall back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        (model.bert if hasattr(model, "bert") else model).compile(dynamic=False, mode=mode)
    param_dtype = torch.bfloat16 if device.type == "cuda" and precision.dtype == torch.bfloat16 else None
    wrapped = wrap_model(model, device, cfg.parallel, param_dtype)
    if world_size() > 1:
        torch.manual_seed(cfg.seed + 1_000_003 * rank())  # same init on every rank (above), own dropout
    # after wrapping: FSDP2 has replaced the parameters by their shards
    optimizer = create_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, tuple(cfg.betas), cfg.eps, device)
    loader = make_loader(task, train_items, cfg, device)  # this rank's shard: len(loader) shrinks with N
    steps_per_epoch = max(1, len(loader) // cfg.grad_accum)
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_fraction * total)
    scheduler = create_scheduler(optimizer, warmup, total, cfg.schedule)
    trainer = AMPTrainer(wrapped, optimizer, scheduler, precision, cfg.grad_accum, cfg.clip_grad)
    eval_every = cfg.eval_every or steps_per_epoch
    save_every = cfg.save_every or eval_every
    global_micro_batch = cfg.batch_size * world_size()  # examples per loader batch over all ranks

    step, best, history = 0, {"value": -math.inf, "step": None, "metrics": None}, []
    resume_state = None
    if checkpoint is not None:
        resume_state = load_checkpoint(checkpoint, model, optimizer=optimizer, scheduler=scheduler,
                                       scaler=trainer.scaler, restore_rng=False)
        step = trainer.step = int(resume_state["step"])
        best, history = resume_state.get("best") or best, list(resume_state.get("history") or [])
        data = resume_state["data"]
        if "loader" not in data:  # an older checkpoint that stored the loader state alone
            data = {"loader": data}
        # counted in examples: a run saved by N ranks continues on any number of ranks
        position = resume_position(data, global_micro_batch)
        # a checkpoint taken right after an epoch's last batch continues with the next epoch
        done = position["batch_index"] >= len(loader)
        loader.load_state_dict({"epoch": position["epoch"] + 1, "batch_index": 0} if done else position)
    # QA trains and scores windows ("features"); a long context gives several per question
    unit = "features" if task.name == "qa" else "examples"
    n_eval = len(eval_items or [])
    if main:
        save_config(cfg, out / "run_config.yaml")
        if checkpoint is not None:
            truncate_metrics(out, step)  # records after the checkpoint belong to the lost steps
        where = f", resuming from {checkpoint} at step {step}" if checkpoint else ""
        ranks = f", {world_size()} ranks ({'FSDP2' if sharded else 'DDP'})" if world_size() > 1 else ""
        print(f"task {task.name}: {type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              f"parameters, {len(train_items)} train / {n_eval} eval {unit}, {total} steps "
              f"({steps_per_epoch} per epoch, global batch {global_micro_batch * cfg.grad_accum}){ranks}{where}",
              flush=True)

    def write_best() -> None:
        """best/ from the current weights; every rank calls it (FSDP2 gathers the shards)."""
        collected = collect_state(model)
        if main:
            save_best(model, tokenizer, task, out / "best", collected.get("model"))

    # 2. the loop: one iteration = one optimizer step of grad_accum micro-batches
    logger = ProgressLogger(out, total, step, enabled=main, tensorboard=cfg.tensorboard, desc=f"finetune {task.name}")
    window = {"loss": 0.0, "n": 0, "examples": 0, "time": 0.0}
    first_loss, last_losses, stopped, train_examples, train_time = None, [], None, 0, 0.0
    run_config = config_to_dict(cfg)
    try:
        with StopSignal() as stop:
            if resume_state is not None:
                restore_rng_state(resume_state)  # last thing before training continues
            batches = forever(loader)
            while step < total:
                t_step, lr = time.time(), trainer.lr
                for _ in range(cfg.grad_accum):
                    batch = next(batches)
                    window["examples"] += len(batch["labels"]) if "labels" in batch else len(batch["input_ids"])
                    window["loss"] += trainer.train_step(batch, lambda b: task.loss(trainer.model, b))
                    window["n"] += 1
                step += 1
                window["time"] += time.time() - t_step
                loss = trainer.last["loss"]
                first_loss = loss if first_loss is None else first_loss
                last_losses = (last_losses + [loss])[-50:]
                logger.update(step, loss=loss, lr=lr)
                if step % cfg.log_every == 0 or step == total or step == 1:
                    # every rank reaches this step: the loss is averaged over all of them
                    logger.log("train", step, loss=all_reduce_mean(window["loss"] / window["n"]), lr=lr,
                               grad_norm=float(full_value(trainer.last["grad_norm"])), epoch=step / steps_per_epoch,
                               examples_per_s=window["examples"] * world_size() / max(window["time"], 1e-9))
                    train_examples += window["examples"] * world_size()
                    train_time += window["time"]
                    window = dict.fromkeys(window, 0)

                # evaluate every epoch (or eval_every steps); keep best/ by the validation metric.
                # Every rank scores its share and gets all predictions, so all hold the same metrics.
                if eval_items is not None and (step % eval_every == 0 or step == total):
                    metrics = task.evaluate(trainer.raw_model, eval_items, precision)
                    metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
                    if task.metric not in metrics:
                        raise KeyError(f"metric {task.metric!r} is not among the validation metrics {sorted(metrics)}")
                    history.append({"step": step, "epoch": round(step / steps_per_epoch, 3), **metrics})
                    logger.log("eval", step, **metrics)
                    improved = metrics[task.metric] > best["value"]
                    if improved:
                        best = {"value": metrics[task.metric], "step": step, "metrics": metrics}
                        write_best()
                    logger.message(f"step {step}: {task.metric} {metrics[task.metric]:.4f}"
                                   f"{' (best, saved best/)' if improved else ''}")

                stopping = any_rank(stop.signum is not None)
                if stopping or step == total or step % save_every == 0:
                    collected = collect_state(model, optimizer)  # every rank: gathers FSDP2 shards, RNG states
                    if main:
                        data_state = {"loader": loader.state_dict(), "world_size": world_size(),
                                      "global_micro_batch": global_micro_batch}
                        path = save_checkpoint(ckpt_dir, step, model, tokenizer=tokenizer, optimizer=optimizer,
                                               scheduler=scheduler, scaler=trainer.scaler, run_config=run_config,
                                               data_state=data_state, keep_last=cfg.keep_last,
                                               extra={"best": best, "history": history}, collected=collected)
                        logger.message(f"step {step}: saved {path}")
                    barrier()
                if stopping:
                    stopped = signal.Signals(stop.signum or signal.SIGTERM).name
                    break
        train_examples += window["examples"] * world_size()
        train_time += window["time"]
        # 3. without validation data the last model is the one kept
        if eval_items is None and stopped is None:
            write_best()
    except NonFiniteLossError as e:
        last = latest_checkpoint(ckpt_dir)
        logger.log("error", e.step, message=str(e))
        e.args = (f"{e}: stopping without saving this step. Last good checkpoint: {last or 'none'}. "
                  "Try a lower lr, clip_grad > 0, or another precision.",)
        raise
    finally:
        logger.close()

    # train losses averaged over ranks (each rank trained as many steps)
    train_loss = all_reduce_mean(float(np.mean(last_losses))) if last_losses else None
    first_loss = all_reduce_mean(first_loss) if first_loss is not None else None
    results = {
        "task": task.name, "model": cfg.model, "metric": task.metric,
        "best_value": best["value"] if best["step"] else None,
        "best_step": best["step"], "best_metrics": best["metrics"], "final_metrics": history[-1] if history else None,
        "history": history, "initial_train_loss": first_loss, "train_loss": train_loss, "steps": step,
        "epochs": round(step / steps_per_epoch, 3), f"train_{unit}": len(train_items), f"eval_{unit}": n_eval,
        "examples_per_second": train_examples / train_time if train_time else None,
        "precision": str(precision), "world_size": world_size(), "stopped": stopped, "output_dir": str(out),
        "best_model": str(out / "best") if (out / "best").is_dir() else None, "wall_time_s": None,
    }
    if main:
        try:
            plot_losses(out)
        except ValueError:
            pass  # stopped before the first logged step
        except ImportError as e:  # the run is saved; only the picture is missing
            print(f"no loss plot ({e}); `bert-kit plot {out}` draws it later", file=sys.stderr)
        results["wall_time_s"] = time.time() - t0
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    barrier()
    return results
