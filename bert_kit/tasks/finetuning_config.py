"""`FinetuneConfig`: the settings of a fine-tuning run, and the lr it takes when `lr: auto`.

Plain Python (no torch): `bert-kit glue` checks every run's settings with it before it starts a
worker, and a mistyped key fails before torch is imported. The job that runs a config is
`bert_kit.tasks.finetuning`; the settings shared by every run are `RunSettings`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bert_kit.checks import ConfigError, Range, fraction, non_negative, positive
from bert_kit.model_folder import locate_model, model_config
from bert_kit.tasks.data_settings import check_data_settings
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
        if config is not None and self.max_length > config.max_length:
            raise ConfigError(f"max_length={self.max_length} is out of range: the model holds "
                              f"{config.max_length} positions (max_position_embeddings)")
        check_data_settings(self)


def auto_lr(num_parameters: int) -> float:
    """The fine-tuning lr for an encoder of `num_parameters` (see AUTO_LR)."""
    return next(lr for most, lr in AUTO_LR if num_parameters <= most)


def resolve_lr(cfg: FinetuneConfig) -> FinetuneConfig:
    """`cfg` with lr: auto replaced by the lr for its model's size, which is printed with its reason
    (the run's config records the number); a number is kept. The model's config is read, not
    its weights: a preset counts the vocabulary of its tokenizer, as the run builds it."""
    if cfg.lr != "auto" or not cfg.model:
        return cfg  # a number wins; no model is the job's error to report
    from bert_kit.config import config_from_name, load_hf_config, read_config_file, sized_preset

    kind, where = locate_model(cfg.model)
    if kind == "folder":
        config = load_hf_config(where)
    elif kind == "file":
        config = read_config_file(where)
    elif cfg.tokenizer:  # a preset (either architecture's), as the run builds it
        from bert_kit.tokenizer import get_tokenizer

        config = sized_preset(where, get_tokenizer(cfg.tokenizer))
    else:
        config = config_from_name(where)
    n = config.num_parameters()
    lr = auto_lr(n)
    if os.environ.get("RANK", "0") == "0":  # before torchrun's group is joined: rank 0 by its environment
        size = f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"
        print(f"lr auto: {lr:.0e} for a {size}-parameter encoder (set lr=... to choose another)".replace("e-0", "e-"),
              flush=True)
    return dataclasses.replace(cfg, lr=lr)
