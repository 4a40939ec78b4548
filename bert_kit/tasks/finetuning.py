"""Fine-tuning: the job the one training loop runs for each of the six tasks (its settings,
`FinetuneConfig`, are `bert_kit.tasks.finetuning_config`).

    bert-kit finetune --task classification --config configs/finetune_sst2.yaml
    bert-kit finetune --task qa --config configs/finetune_squad.yaml epochs=1 batch_size=16
    bert-kit finetune --config configs/finetune_sst2.yaml --resume latest

The model starts from a folder (an HF BERT such as all-MiniLM-L6-v2, a bert-kit pretraining run
or checkpoint), a preset name (random init) or a config file; the task (`bert_kit.tasks`) puts
its head on it and supplies data, loss and metric. The run folder (`output_dir`) ends up holding
run_config.yaml, metrics.jsonl, loss_curve.png, results.json, checkpoints/step-XXXXXXX/ (the
last `keep_last`) and best/: the model with the best validation metric so far, loadable by
`from_pretrained` and `transformers`, with the tokenizer and the label names (config.json id2label).
Checkpoints, stop signals, non-finite losses and resuming are the loop's (training/loop.py).

Fast by default on a GPU: the step never waits for the device (losses are read at log steps,
token ids were checked when the data was tokenised), and with `unpadded: true` the encoder runs
on the real tokens only, with the packing layout computed on the host and variable-length flash
attention (dropout included) on CUDA.

Several processes: `torchrun --nproc_per_node N -m bert_kit finetune --config ...` works as for
pretraining (docs/distributed.md): each rank trains on its shard of every epoch, DDP (default) or
FSDP2 (`parallel: fsdp`), so an optimizer step covers batch_size x grad_accum x N examples and an
epoch has N times fewer steps. Every rank evaluates its share of the validation set and all
predictions are gathered (`shard_and_gather`), so no rank idles at a barrier while another
evaluates; every rank then holds the same metrics and the same best so far. Rank 0 alone logs
and writes best/, checkpoints and results.json; checkpoints count the data position in examples,
so a run resumes on any number of ranks.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import torch

from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed
from bert_kit.metrics import higher_is_better
from bert_kit.model_folder import locate_model, write_model_metadata, write_sentence_transformers_files
from bert_kit.tasks import engine_class, make_task
from bert_kit.tasks.base import Task
from bert_kit.tasks.distillation import Distiller, describe, prune_layers
from bert_kit.tasks.finetuning_config import AUTO_LR, FinetuneConfig, auto_lr, check_metric, note_unread_settings, resolve_lr
from bert_kit.tasks.pretraining_data import forever
from bert_kit.training.checkpoint import resume_position
from bert_kit.training.distributed import is_main, world_size
from bert_kit.training.job import Job, Run
from bert_kit.training.loop import run_job
from bert_kit.training.progress import LongRunNotice, read_metrics

__all__ = ["AUTO_LR", "FinetuneConfig", "FinetuningJob", "auto_lr", "finetune", "resolve_lr"]


def make_loader(task: Task, items: list[dict], cfg: FinetuneConfig, device: torch.device) -> Any:
    """A shuffled, resumable loader with dynamic padding: the order is a function of (seed, epoch)
    (the task's `sampler`)."""
    from bert_kit.data.pretraining import ResumableDataLoader

    sampler = task.sampler(items, cfg.batch_size, cfg.seed)
    return ResumableDataLoader(items, sampler, batch_size=cfg.batch_size, collate_fn=task.collate,
                               num_workers=cfg.num_workers, pin_memory=device.type == "cuda",
                               generator=torch.Generator().manual_seed(cfg.seed), start_next_epoch_early=True)


def save_best(model: torch.nn.Module, tokenizer: Any, task: Task, folder: Path,
              state: dict[str, torch.Tensor] | None = None, metadata: dict[str, Any] | None = None) -> None:
    """A fine-tuned model folder: the HF model plus tokenizer, label names and the task settings.

    state: the full state dict `collect_state` gathered (an FSDP2 model holds only shards).
    metadata: the task's, as it was when the weights were chosen (default: as it is now).
    Call on rank 0 only."""
    task.save_model(model, folder, state)
    tokenizer.save(folder)
    write_model_metadata(folder, task.metadata() if metadata is None else metadata)
    if task.name == "similarity" and task.s.similarity.mode == "bi-encoder":
        write_sentence_transformers_files(folder, task.s.similarity.pooling, task.s.max_length)


class FinetuningJob(Job):
    """One of the six tasks: its head on the encoder, its batches, loss and validation metric."""

    unit, model_folder = "examples", "best"

    def __init__(self, cfg: FinetuneConfig, run: Run) -> None:
        from bert_kit.tokenizer import get_tokenizer

        self.cfg = cfg
        if not cfg.model:
            raise ValueError("model is empty: name a model folder or a preset (model=path/to/bert)")
        if not cfg.train_file:
            raise ValueError("train_file is empty: name the training data file")
        kind, where = locate_model(cfg.model)  # a bad model name fails before the data is read
        if kind != "folder" and cfg.distill is not None and not cfg.tokenizer:  # a student preset reads the teacher's
            _, where_teacher = locate_model(cfg.distill.teacher)
            cfg = self.cfg = dataclasses.replace(cfg, tokenizer=str(where_teacher))
        if not (run.checkpoint or cfg.tokenizer or kind == "folder"):
            raise ValueError(f"model {cfg.model!r} is not a folder, so it has no tokenizer: set tokenizer=FOLDER")

        # tokenizer, data, model (the task's head on the pretrained encoder)
        self.tokenizer = get_tokenizer(run.checkpoint or cfg.tokenizer or where)
        self.task = task = make_task(cfg.task, cfg)
        self.name = f"finetune {task.name}"
        task.bind(self.tokenizer)
        self.train_items = task.read_train(cfg.train_file, cfg.max_train_examples)
        eval_path = cfg.validation_file or (cfg.train_file if cfg.task == "qa" and cfg.qa.train_articles else None)
        self.eval_items = task.read_eval(eval_path, cfg.max_eval_examples) if eval_path else None
        if not self.train_items:
            raise ValueError(f"{cfg.train_file}: no training examples")
        if cfg.metric is not None:  # a classifier's labels say whether it predicts classes, label sets or scores
            scores = task.name == "classification" and task.regression
            sets = getattr(task, "multi_label", False)
            reads = " on scores (one output)" if scores else " with several labels per text" if sets else ""
            check_metric(cfg.metric, f"task {task.name}{reads}", task.metric_names)
        if getattr(task, "tune", False) and self.eval_items is None:
            raise ValueError("classification.threshold=tune chooses each label's threshold on the validation set: "
                             "set validation_file (or a threshold such as 0.5)")
        model = task.build(cfg.model)
        if cfg.distill is not None and cfg.distill.student_layers is not None:  # the student: the teacher, pruned
            model = prune_layers(model, cfg.distill.student_layers)
        if cfg.lora is not None:  # peft's adapters on the frozen encoder; the head trained whole
            model = self.add_lora(model, kind, where)
        if cfg.max_length > model.config.max_length:
            raise ValueError(f"max_length {cfg.max_length} exceeds the model's {model.config.max_length} positions "
                             f"(max_position_embeddings {model.config.max_position_embeddings})")
        # the device now: CUDA started in a thread while the data was read and the model built
        self.precision, device = run.precision, run.precision.device
        sharded = cfg.parallel == "fsdp" and world_size() > 1
        if not sharded:
            model.to(device)  # FSDP2 moves each rank's shards to the device itself, layer by layer
        if cfg.engine == "torch":  # the kernels this device allows, then the compiler (the JAX engine has its own)
            fast = fast_path.apply(model, device, training=True, dtype=run.precision.dtype, compile=cfg.compile,
                                   compile_heads=False)
        else:
            fast = fast_path.FastPath(note=fast_path.JAX_ENGINE)
        self.fast_path = str(fast)
        if cfg.compile and cfg.engine == "torch":  # padded to multiples of 16: a few static shapes, each compiled once
            mode = "reduce-overhead" if cfg.cuda_graphs is True and device.type == "cuda" else None
            (model.bert if hasattr(model, "bert") else model).compile(dynamic=False, mode=mode)
        self.model = model
        self.distiller = Distiller(cfg.distill, task, model, run.precision) if cfg.distill is not None else None
        if self.distiller is not None and is_main():
            print(describe(cfg.distill, self.distiller.folder, model, self.distiller.teacher), flush=True)
        # the whole step as a CUDA graph per padded shape, where it can be recorded
        possible = (device.type == "cuda" and world_size() == 1 and cfg.grad_accum == 1 and not cfg.compile
                    and cfg.optimizer == "adamw" and not run.precision.use_grad_scaler and task.graphable)
        if cfg.cuda_graphs is True and not cfg.compile and not possible:
            raise ValueError("cuda_graphs: true needs one CUDA GPU (no torchrun) and bf16 or fp32 precision"
                             + ("" if task.graphable else f", and task {task.name} {task.ungraphable}"))
        self.cuda_graphs = task.static_shapes = possible and cfg.cuda_graphs in (True, "auto")
        # flash attention over every position, each row's padding apart: no runtime-compiled masked
        # kernel (cuDNN's: 1.5-2.6 s on a machine's first run) and no per-shape plan
        task.row_layout = (self.cuda_graphs and run.precision.dtype == torch.bfloat16 and model.config.head_dim <= 256
                           and torch.cuda.get_device_capability(device) >= (8, 0))

        # steps, cadence, and what best/ is chosen by
        self.loader = make_loader(task, self.train_items, cfg, device)  # this rank's shard: shrinks with N ranks
        self.steps_per_epoch = max(1, len(self.loader) // cfg.grad_accum)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * self.steps_per_epoch))
        self.eval_every = cfg.eval_every or self.steps_per_epoch
        self.save_every = cfg.save_every
        self.metric = task.metric if self.eval_items is not None else None
        self.higher_is_better = self.metric is None or higher_is_better(self.metric)
        self.patience, self.min_delta = cfg.early_stopping_patience, cfg.early_stopping_min_delta
        if self.patience is not None and self.metric is None:
            raise ValueError("early_stopping_patience counts evaluations of the validation metric: set "
                             "validation_file")
        evaluations = -(-self.total_steps // self.eval_every)  # every eval_every steps, and at the end
        if self.patience is not None and evaluations <= self.patience and is_main():
            print(f"warning: early_stopping_patience={self.patience} needs {self.patience + 1} evaluations or more "
                  f"to stop a run early, and this one has {evaluations} ({self.total_steps} steps, an evaluation every "
                  f"{self.eval_every}): set eval_every lower", file=sys.stderr, flush=True)
        self.global_micro_batch = cfg.batch_size * world_size()  # examples per loader batch over all ranks
        self.batches = None
        # a long run on a CPU says so after its first half minute, and how to check the setup sooner
        quick = "for a quick check first: max_steps=200, or max_train_examples=2000 epochs=1"
        on_cpu = device.type == "cpu" and is_main()
        self.long_run = LongRunNotice(self.total_steps, "this CPU", quick) if on_cpu else None
        if is_main():
            # QA trains and scores windows ("features"); a long context gives several per question
            unit = "features" if task.name == "qa" else "examples"
            where = f", resuming from {run.checkpoint} at step {run.state['step']}" if run.checkpoint else ""
            how = f"JAX engine, parallel={cfg.parallel}" if cfg.engine == "jax" else 'FSDP2' if sharded else 'DDP'
            ranks = f", {world_size()} ranks ({how})" if world_size() > 1 else ""
            print(f"task {task.name}: {type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                  f"parameters, {len(self.train_items)} train / {len(self.eval_items or [])} eval {unit}, "
                  f"{self.total_steps} steps ({self.steps_per_epoch} per epoch, global batch "
                  f"{self.global_micro_batch * cfg.grad_accum}){ranks}{where}", flush=True)
            print(self.fast_path, flush=True)

    def add_lora(self, model: torch.nn.Module, kind: str, where: Any) -> torch.nn.Module:
        """`model` with LoRA adapters (bert_kit/lora.py), said in one line."""
        from bert_kit.lora import add_lora, trainable_parameters

        if kind != "folder":
            raise ValueError(f"lora adapts a pretrained model: model={self.cfg.model!r} is a {kind}, not a model folder")
        lora = self.cfg.lora
        model = add_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules, str(Path(where).resolve()))
        trained, total = trainable_parameters(model)
        if is_main():
            print(f"lora: rank {lora.r} on {len(model.lora_adapter.modules)} layers ({', '.join(lora.target_modules)}), "
                  f"head trained whole: {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)", flush=True)
        self.trainable = trained
        return model

    def step_batches(self, step: int) -> list[dict]:
        notice = self.long_run and self.long_run(step)
        if notice:
            self.log(notice)
        if self.batches is None:
            self.loader.stop_after((self.total_steps - step) * self.cfg.grad_accum)
            self.batches = forever(self.loader)
        batches = [next(self.batches) for _ in range(self.cfg.grad_accum)]
        if self.cfg.unpadded and not self.cuda_graphs and self.cfg.engine == "torch":  # the layout from the host's mask
            for b in batches:
                b["packed"] = Packed.from_mask(b["attention_mask"])
        return batches

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return (self.distiller or self.task).loss(model, batch)

    def count(self, batch: dict) -> int:
        return self.task.count(batch)

    def evaluate(self, final: bool) -> dict[str, float] | None:
        if self.eval_items is None:
            return None
        # every rank scores its share and gets all predictions, so all hold the same metrics
        metrics = self.engine.evaluate_task(self.task, self.eval_items)
        metrics = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        if self.task.metric not in metrics:
            raise KeyError(f"metric {self.task.metric!r} is not among the validation metrics {sorted(metrics)}")
        return metrics

    def final_eval_steps(self) -> float:
        return len(self.eval_items) / self.cfg.batch_size / 3 if self.eval_items else 0.0

    def save_model(self, folder: Path, state: dict | None) -> None:
        save_best(self.model, self.tokenizer, self.task, folder, state)

    def model_writer(self, state: dict | None) -> Any:
        metadata = self.task.metadata()  # thresholds tuned by this evaluation, not by a later one
        return lambda folder: save_best(self.model, self.tokenizer, self.task, folder, state, metadata)

    def data_state(self) -> dict:
        return {"loader": self.loader.state_dict(), "world_size": world_size(),
                "global_micro_batch": self.global_micro_batch}

    def load_data_state(self, data: dict) -> None:
        if not data:
            return
        if "loader" not in data:  # an older checkpoint that stored the loader state alone
            data = {"loader": data}
        # counted in examples: a run saved by N ranks continues on any number of ranks
        position = resume_position(data, self.global_micro_batch)
        # a checkpoint taken right after an epoch's last batch continues with the next epoch
        done = position["batch_index"] >= len(self.loader)
        self.loader.load_state_dict({"epoch": position["epoch"] + 1, "batch_index": 0} if done else position)

    def log_fields(self) -> dict[str, Any]:
        return {"epoch": round(self.loader.epoch + self.loader.batch_index / max(1, len(self.loader)), 4)}

    def results(self, final: dict[str, float] | None, summary: dict[str, Any]) -> dict[str, Any]:
        out, unit = Path(summary["output_dir"]), "features" if self.task.name == "qa" else "examples"
        history = [{"step": r["step"], "epoch": round(r["step"] / self.steps_per_epoch, 3),
                    **{k: v for k, v in r.items() if k not in ("type", "step", "wall_time", "final")}}
                   for r in read_metrics(out) if r.get("type") == "eval"] if is_main() else []
        return {"task": self.task.name, "model": self.cfg.model, "metric": self.task.metric, "history": history,
                "epochs": round(summary["steps"] / self.steps_per_epoch, 3),
                f"num_train_{unit}": len(self.train_items), f"num_eval_{unit}": len(self.eval_items or []),
                "fast_path": self.fast_path.removeprefix("fast path: "),
                **({"lora_trainable_parameters": self.trainable} if self.cfg.lora is not None else {}),
                **({"teacher_metrics": self.teacher_metrics()} if self.distiller is not None else {})}

    def teacher_metrics(self) -> dict[str, float] | None:
        """The distillation teacher's validation metrics (once), beside the student's."""
        if self.eval_items is None:
            return None
        if not hasattr(self, "_teacher_metrics"):
            self._teacher_metrics = self.distiller.teacher_metrics(self.eval_items, self.precision)
        return self._teacher_metrics


def finetune(cfg: FinetuneConfig, resume: str | None = None, started: float | None = None,
             trackers: list[Any] | None = None) -> dict[str, Any]:
    """Run (or resume) a fine-tuning run; return the results dict (also written to results.json).

    resume: a checkpoint folder, a run folder, or "latest" (newest checkpoint of output_dir).
    started: time.time() a time budget counts from (default: this call; `bert-kit`: its launch).
    trackers: more trackers than `report_to` (a search trial's, bert_kit/tasks/search.py).
    Under torchrun every rank calls this (see `run_job`). lr: auto becomes a number first.
    """
    note_unread_settings(cfg)
    return run_job(FinetuningJob, resolve_lr(cfg), resume, started, engine_class(cfg.engine), trackers)
