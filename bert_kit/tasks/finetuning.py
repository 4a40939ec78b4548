"""Fine-tuning: `FinetuneConfig` and the job the one training loop runs for each of the four tasks.

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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from bert_kit.model import Packed
from bert_kit.checks import ConfigError, Range, fraction, non_negative, positive
from bert_kit.dropout import register_mask_op
from bert_kit.model_folder import locate_model, model_config, write_model_metadata, write_sentence_transformers_files
from bert_kit.tasks import make_task
from bert_kit.tasks.base import Task
from bert_kit.tasks.data_settings import check_data_settings
from bert_kit.tasks.pretraining_data import forever
from bert_kit.training.checkpoint import resume_position, save_model
from bert_kit.training.distributed import is_main, rank, world_size
from bert_kit.training.loop import Job, Run, run_job
from bert_kit.training.progress import read_metrics
from bert_kit.training.settings import RunSettings

DEFAULT_MAX_LENGTH = {"qa": 384}  # other tasks: 128
# lr: auto, by the encoder's parameters (embeddings included): (up to this many, lr). Evidence
# (benchmarks/RESULTS.md): the demo's 0.5M-parameter model fine-tunes at 1e-3; all-MiniLM-L6-v2
# (22.7M) is best at 1e-4 on SST-2, CoNLL-2003, STS-B and SQuAD, as is bert-small (29M) from
# scratch; bert-base takes the top of BERT's grid (5e-5, with 3 epochs of small data sets in
# mind) and bert-large its bottom (2e-5: larger steps diverge on small data sets).
AUTO_LR = ((2e6, 1e-3), (60e6, 1e-4), (200e6, 5e-5), (math.inf, 2e-5))


@dataclass(frozen=True)
class PositiveOrAuto(Range):
    """A positive number, or the word auto."""

    def allows(self, value: Any) -> bool:
        return value == "auto" or super().allows(value)

    def describe(self) -> str:
        return super().describe() + " or auto"


@dataclass
class FinetuneConfig(RunSettings):
    """Settings of one fine-tuning run (YAML keys; `key=value` on the command line); the fields
    shared by every run (optimisation, hardware, bookkeeping) are those of `RunSettings`, some
    with other defaults here."""

    task: Literal["classification", "token-classification", "qa", "similarity"] = "classification"  # head and data
    model: str = ""  # model folder (HF BERT, bert-kit run or checkpoint), preset name (random init) or config file
    tokenizer: str | None = None  # tokenizer folder; default: the model folder's
    # data
    train_file: str = ""  # training data (classification TSV/CSV/JSONL/TXT, CoNLL, SQuAD JSON, STS-B or pair file)
    validation_file: str | None = None  # evaluated every epoch; QA with squad_train_articles: the rest of train_file
    max_train_examples: int | None = None  # use only the first N training examples (quick runs)
    max_eval_examples: int | None = None  # evaluate on the first N validation examples only
    max_length: int | None = None  # tokens per sequence; default 128 (QA 384)
    header: bool | None = None  # TSV/CSV: the first line names the columns (default: when a column is given by name)
    delimiter: str | None = None  # field separator; by extension: .csv comma, .jsonl/.json JSON, .txt lines, else tab
    encoding: str = "utf-8"  # text encoding of the data files, a Python codec name (latin-1, cp1252, utf-16, ...)
    where: dict[str, str | list[str]] | None = None  # keep the train_file rows with these values, e.g. {split: train}
    validation_where: dict[str, str | list[str]] | None = None  # the same for validation_file rows, e.g. {split: dev}
    # classification (columns: a name, or a 0-based index for files without a header)
    text_column: int | str = "sentence"  # column (or JSON key) of the text; similarity: of the first sentence
    text_pair_column: int | str | None = None  # column of the second text; similarity: set it to read any pair file
    label_column: int | str = "label"  # column of the label: ints, names, floats (regression), or the similarity score
    label_pattern: str | None = None  # regex with label and text groups for labels in the text: (?P<label>\w+) (?P<text>.*)
    num_labels: int | None = None  # default: from the training labels; 1 = regression (MSE)
    label_names: list[str] | None = None  # names of label ids 0..K-1 (saved as id2label); labels are these names or ids
    # token classification
    tag_column: int = -1  # CoNLL column of the tag (default the last; negative counts from the end)
    word_column: int = 0  # CoNLL column of the word
    # question answering
    doc_stride: int = 128  # context tokens shared by consecutive windows of a long context
    max_query_length: int = 64  # questions are cut to this many tokens
    n_best: int = 20  # start/end candidates per window in the span search
    max_answer_length: int = 30  # longest answer span in tokens
    squad_train_articles: int | None = None  # split train_file by article: the first N train, the rest evaluate
    skip_bad_answers: bool = False  # leave out (and count) answers that do not match their context instead of stopping
    # sentence similarity
    similarity_mode: Literal["cross-encoder", "bi-encoder"] = "cross-encoder"  # regression on the pair, or cosine
    pooling: Literal["mean", "cls"] = "mean"  # bi-encoder pooling
    similarity_loss: Literal["cosine", "cosent"] = "cosine"  # bi-encoder: MSE on cos(u, v), or the CoSENT ranking loss
    score_range: list[float] | None = None  # [low, high] of the gold similarity scores (default [0, 5], STS-B)
    classifier_dropout: float | None = None  # dropout before the head (default hidden_dropout_prob)
    # optimisation (defaults for fine-tuning)
    epochs: float = 3.0  # passes over the training data (max_steps wins when set)
    max_steps: int | None = None  # optimizer steps in total
    lr: float | Literal["auto"] = "auto"
    """peak learning rate; auto: from the model's size, printed at the start (up to 2M parameters
    1e-3, 60M 1e-4 (all-MiniLM-L6-v2, bert-small), 200M 5e-5 (bert-base), larger 2e-5)"""
    warmup_fraction: float = 0.1  # warmup share of the steps (when warmup_steps is unset)
    # hardware
    eval_batch_size: int = 64  # examples per evaluation batch
    unpadded: bool = True
    """run only the real tokens through the encoder: no FLOPs on padding, variable-length flash
    attention on CUDA (training steps replayed as CUDA graphs take padded shapes instead)"""
    compile: bool = False  # torch.compile the encoder; batches padded to multiples of 16 (few shapes)
    cuda_graphs: bool | Literal["auto"] = "auto"
    """replay each batch shape's whole training step (forward, backward, update) as a CUDA graph,
    batches padded to multiples of 16: the host launches one graph, not hundreds of kernels.
    auto: on with one CUDA GPU, bf16/fp32, adamw and grad_accum 1. With compile: inductor's graphs"""
    # bookkeeping
    output_dir: str = "runs/finetune"  # run folder
    seed: int = 42  # seeds the head init, data order and dropout
    metric: str | None = None  # validation metric that picks best/ (higher is better); default per task
    eval_every: int = 0  # steps between evaluations (0: at the end of every epoch)
    save_every: int = 0  # steps between checkpoints (0: every save_minutes only)
    end_checkpoint: bool = False
    """a checkpoint (weights and optimizer state) when the run ends, for `--resume` with more epochs:
    off by default, as best/ holds the model (a stop signal's checkpoint is always written)"""
    keep_last: int = 2  # checkpoints kept (0: all)

    def __post_init__(self) -> None:
        for name in ("model", "tokenizer", "train_file", "validation_file", "output_dir"):
            if isinstance(getattr(self, name), Path):  # Path objects from Python callers; YAML wants str
                setattr(self, name, str(getattr(self, name)))
        if self.max_length is None:
            self.max_length = DEFAULT_MAX_LENGTH.get(self.task, 128)
        if self.compile and self.unpadded:  # the compiled graphs take static padded shapes
            self.unpadded = False
        # what each setting may be; the errors name key, value and range (bert_kit/checks.py)
        self.check({
            "max_steps": positive(integer=True, optional=True, hint="null: from epochs"),
            "lr": PositiveOrAuto(0, low_open=True),
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
        if self.cuda_graphs is True and self.compile is False and (self.grad_accum > 1 or self.optimizer != "adamw"):
            raise ConfigError("cuda_graphs: true needs grad_accum 1 and optimizer adamw (or set cuda_graphs: auto)")
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
        check_data_settings(self)


def make_loader(task: Task, items: list[dict], cfg: FinetuneConfig, device: torch.device) -> Any:
    """A shuffled, resumable loader with dynamic padding: the order is a function of (seed, epoch)."""
    from bert_kit.data.pretraining import DistributedResumableSampler, ResumableDataLoader

    sampler = DistributedResumableSampler(len(items), shuffle=True, seed=cfg.seed, rank=rank(), world_size=world_size())
    return ResumableDataLoader(items, sampler, batch_size=cfg.batch_size, collate_fn=task.collate,
                               num_workers=cfg.num_workers, pin_memory=device.type == "cuda",
                               generator=torch.Generator().manual_seed(cfg.seed))


def save_best(model: torch.nn.Module, tokenizer: Any, task: Task, folder: Path,
              state: dict[str, torch.Tensor] | None = None) -> None:
    """A fine-tuned model folder: the HF model plus tokenizer, label names and the task settings.

    state: the full state dict `collect_state` gathered (an FSDP2 model holds only shards).
    Call on rank 0 only."""
    save_model(model, folder, state)
    tokenizer.save(folder)
    write_model_metadata(folder, task.metadata())
    if task.name == "similarity" and task.s.similarity_mode == "bi-encoder":
        write_sentence_transformers_files(folder, task.s.pooling, task.s.max_length)


class FinetuningJob(Job):
    """One of the four tasks: its head on the encoder, its batches, loss and validation metric."""

    unit, model_folder = "examples", "best"

    def __init__(self, cfg: FinetuneConfig, run: Run) -> None:
        from bert_kit.tokenizer import get_tokenizer

        self.cfg = cfg
        if not cfg.model:
            raise ValueError("model is empty: name a model folder or a preset (model=path/to/bert)")
        if not cfg.train_file:
            raise ValueError("train_file is empty: name the training data file")
        kind, where = locate_model(cfg.model)  # a bad model name fails before the data is read
        if not (run.checkpoint or cfg.tokenizer or kind == "folder"):
            raise ValueError(f"model {cfg.model!r} is not a folder, so it has no tokenizer: set tokenizer=FOLDER")

        # tokenizer, data, model (the task's head on the pretrained encoder)
        self.tokenizer = get_tokenizer(run.checkpoint or cfg.tokenizer or where)
        self.task = task = make_task(cfg.task, cfg)
        self.name = f"finetune {task.name}"
        task.bind(self.tokenizer)
        self.train_items = task.read_train(cfg.train_file)[: cfg.max_train_examples]
        eval_path = cfg.validation_file or (cfg.train_file if cfg.task == "qa" and cfg.squad_train_articles else None)
        self.eval_items = task.read_eval(eval_path, cfg.max_eval_examples) if eval_path else None
        if not self.train_items:
            raise ValueError(f"{cfg.train_file}: no training examples")
        model = task.build(cfg.model)
        if cfg.max_length > model.config.max_position_embeddings:
            raise ValueError(f"max_length {cfg.max_length} exceeds the model's max_position_embeddings "
                             f"{model.config.max_position_embeddings}")
        # the device now: CUDA started in a thread while the data was read and the model built
        self.precision, device = run.precision, run.precision.device
        sharded = cfg.parallel == "fsdp" and world_size() > 1
        if not sharded:
            model.to(device)  # FSDP2 moves each rank's shards to the device itself, layer by layer
        if cfg.compile and cfg.engine == "torch":  # padded to multiples of 16: a few static shapes, each compiled once
            mode = "reduce-overhead" if cfg.cuda_graphs is True and device.type == "cuda" else None
            # one graph per padded length, batch size and train/eval: more than dynamo's default 8,
            # past which it would silently fall back to eager
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            register_mask_op()  # dropout's cheaper mask, traced into the graph
            (model.bert if hasattr(model, "bert") else model).compile(dynamic=False, mode=mode)
        self.model = model
        # the whole step as a CUDA graph per padded shape, where it can be recorded
        possible = (device.type == "cuda" and world_size() == 1 and cfg.grad_accum == 1 and not cfg.compile
                    and cfg.optimizer == "adamw" and not run.precision.use_grad_scaler)
        if cfg.cuda_graphs is True and not cfg.compile and not possible:
            raise ValueError("cuda_graphs: true needs one CUDA GPU (no torchrun) and bf16 or fp32 precision")
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
        self.global_micro_batch = cfg.batch_size * world_size()  # examples per loader batch over all ranks
        self.batches = None
        if is_main():
            # QA trains and scores windows ("features"); a long context gives several per question
            unit = "features" if task.name == "qa" else "examples"
            where = f", resuming from {run.checkpoint} at step {run.state['step']}" if run.checkpoint else ""
            ranks = f", {world_size()} ranks ({'FSDP2' if sharded else 'DDP'})" if world_size() > 1 else ""
            print(f"task {task.name}: {type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
                  f"parameters, {len(self.train_items)} train / {len(self.eval_items or [])} eval {unit}, "
                  f"{self.total_steps} steps ({self.steps_per_epoch} per epoch, global batch "
                  f"{self.global_micro_batch * cfg.grad_accum}){ranks}{where}", flush=True)

    def step_batches(self, step: int) -> list[dict]:
        if self.batches is None:
            self.batches = forever(self.loader)
        batches = [next(self.batches) for _ in range(self.cfg.grad_accum)]
        if self.cfg.unpadded and not self.cuda_graphs and self.cfg.engine == "torch":  # the layout from the host's mask
            for b in batches:
                b["packed"] = Packed.from_mask(b["attention_mask"])
        return batches

    def loss(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.task.loss(model, batch)

    def count(self, batch: dict) -> int:
        return len(batch["labels"]) if "labels" in batch else len(batch["input_ids"])

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
                "best_model": str(out / "best") if (out / "best").is_dir() else None}


def auto_lr(num_parameters: int) -> float:
    """The fine-tuning lr for an encoder of `num_parameters` (see AUTO_LR)."""
    return next(lr for most, lr in AUTO_LR if num_parameters <= most)


def resolve_lr(cfg: FinetuneConfig) -> FinetuneConfig:
    """`cfg` with lr: auto replaced by the lr for its model's size, which is printed with its reason
    (the run's config records the number); a number is kept. The model's config is read, not
    its weights: a preset counts the vocabulary of its tokenizer, as the run builds it."""
    if cfg.lr != "auto" or not cfg.model:
        return cfg  # a number wins; no model is the job's error to report
    from bert_kit.config import BertConfig, load_hf_config

    kind, where = locate_model(cfg.model)
    if kind == "folder":
        config = load_hf_config(where)
    elif kind == "file":
        config = BertConfig.from_file(where)
    else:
        from bert_kit.tokenizer import get_tokenizer

        vocab = get_tokenizer(cfg.tokenizer).vocab_size if cfg.tokenizer else BertConfig().vocab_size
        config = BertConfig.from_name(where, vocab_size=vocab)
    n = config.num_parameters()
    lr = auto_lr(n)
    if os.environ.get("RANK", "0") == "0":  # before torchrun's group is joined: rank 0 by its environment
        size = f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"
        print(f"lr auto: {lr:.0e} for a {size}-parameter encoder (set lr=... to choose another)".replace("e-0", "e-"),
              flush=True)
    return dataclasses.replace(cfg, lr=lr)


def finetune(cfg: FinetuneConfig, resume: str | None = None, started: float | None = None) -> dict[str, Any]:
    """Run (or resume) a fine-tuning run; return the results dict (also written to results.json).

    resume: a checkpoint folder, a run folder, or "latest" (newest checkpoint of output_dir).
    started: time.time() a time budget counts from (default: this call; `bert-kit`: its launch).
    Under torchrun every rank calls this (see `run_job`). lr: auto becomes a number first.
    """
    return run_job(FinetuningJob, resolve_lr(cfg), resume, started)
