"""`PretrainConfig`: the settings of a pretraining run, and its phases.

A run may switch sequence length and batch size part-way (`phases`), as BERT's 128 -> 512
recipe; `plan_phases` turns their fractions into step ranges. The shared settings (optimisation,
hardware, bookkeeping, time budget) come from `RunSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bert_kit.checks import ConfigError, Range, check_input_path, fraction, non_negative, positive
from bert_kit.data import check_encoding
from bert_kit.model_folder import model_config
from bert_kit.tasks.data_settings import check_tokenizer_setting
from bert_kit.training.runconfig import coerce
from bert_kit.training.settings import RunSettings

PHASE_KEYS = ("fraction", "max_length", "batch_size", "grad_accum")
TOKENIZER_TRAIN_KEYS = ("vocab_size", "min_frequency", "lowercase", "limit_alphabet")
TOKENIZER_TRAIN_TYPES = {"vocab_size": int, "min_frequency": int, "lowercase": bool, "limit_alphabet": int}
TOKENIZER_TRAIN_RULES = {"vocab_size": Range(6, integer=True, hint="the 5 special tokens and more"),
                         "min_frequency": non_negative(integer=True), "limit_alphabet": positive(integer=True)}


@dataclass
class PretrainConfig(RunSettings):
    """Settings of one pretraining run (YAML keys; `key=value` on the command line); the fields
    shared by every run (optimisation, hardware, bookkeeping) are those of `RunSettings`."""

    # model and tokenizer
    model: str | dict = "bert-mini"
    """preset name (BERT's, or ModernBERT's: modernbert-base, ...), model folder (continues from its
    weights), config file, or a mapping of config fields with an optional `preset`, e.g.
    {preset: bert-mini, hidden_dropout_prob: 0} or {preset: modernbert-base, num_hidden_layers: 12}"""
    dropout: float | None = None
    """dropout while pretraining (embeddings, sub-layers, attention); null: the model config's rates.
    The saved config keeps those, which fine-tuning uses: dropout 0 pretrains without (as Cramming does)"""
    tokenizer: str | None = None  # tokenizer folder (tokenizer.json or vocab.txt); default: the model folder's
    train_tokenizer: dict | None = None  # e.g. {vocab_size: 8000}: train a WordPiece vocab on train_files first
    # data
    train_files: list[str] = field(default_factory=list)  # files, folders or globs of training text
    eval_files: list[str] = field(default_factory=list)  # held-out text; empty: use eval_fraction
    eval_fraction: float = 0.01  # share of the training corpus held out when eval_files is empty
    corpus_format: Literal["text", "lines", "jsonl", "wikitext"] = "text"  # text: blank line ends a document
    text_field: str = "text"  # JSONL field holding the text
    encoding: str = "utf-8"  # text encoding of the corpus files, a Python codec name (latin-1, cp1252, utf-16, ...)
    nsp: bool = True  # next-sentence prediction (sentence pairs); false: MLM only
    packing: bool = True  # MLM only: pack documents into full max_length blocks
    streaming: bool = False
    """read train_files lazily, for corpora bigger than memory: shuffled through a seeded buffer,
    sharded by rank and DataLoader worker, tokenised on the fly; no token cache. MLM only
    (nsp: false); evaluates on eval_files, which it needs"""
    shuffle_buffer: int = 10000  # streaming: documents held for shuffling (more: better mixed, more memory)
    mask_probability: float = 0.15  # share of tokens chosen for MLM (80% [MASK], 10% random, 10% kept)
    whole_word_masking: bool = False  # mask all WordPieces of a chosen word together
    segment_pairs: bool = False
    """MLM only: each sequence has token type 1 from a random point on, so the segment-1 embedding
    that pair tasks (STS-B, QA) give their second text is trained; without it only type 0 is"""
    short_seq_prob: float = 0.1  # NSP: share of pairs with a shorter random target length
    max_length: int = 128  # tokens per sequence, [CLS] and [SEP] included
    cache_dir: str | None = None  # token cache folder (default OUTPUT_DIR/token_cache)
    # optimisation
    max_steps: int | None = 1000  # optimizer steps in total (all phases); null: as many as the time_budget allows
    phases: list[dict] = field(default_factory=list)
    """steps split by sequence length, e.g. [{max_length: 128, fraction: 0.9},
    {max_length: 512, fraction: 0.1, batch_size: 8, grad_accum: 4}]; unset keys use the fields above"""
    # hardware
    compile: bool = False
    """torch.compile the model with static shapes: batches padded to max_length, masked positions
    gathered into fixed prediction slots (mask_probability + 5% of the tokens), the MLM loss compiled too (with
    parallel=fsdp on several ranks: the encoder only); on CUDA GPUs with Triton kernels for the dropout masks
    and, with low_precision_residual, for the FFN's GELU and gradients, the QKV's gradients and attention at
    max_length <= 128 (see model.py), and the MLM decoder's vocabulary padded to a multiple of 64"""
    cuda_graphs: bool | Literal["auto"] = False
    """with compile on CUDA GPUs (grad_accum 1; under torchrun without parallel=fsdp, and the gradients
    all-reduced by the trainer instead of DDP): replay the compiled steps as CUDA graphs. auto:
    wherever that holds, so one config runs on a GPU, a CPU and under torchrun"""
    compile_tuning: bool = False  # with compile: Triton kernels tuned by benchmarking (+2-3%, minutes to compile)
    low_precision_residual: bool = True  # 16-bit LayerNorm outputs under autocast (faster; see model.py)
    # bookkeeping
    output_dir: str = "runs/pretrain"  # run folder
    eval_batches: int = 50  # batches per periodic evaluation (the final one uses all)

    @property
    def accumulates_gradients(self) -> bool:
        """grad_accum above 1 in some phase (CUDA graphs cannot accumulate)."""
        return any(int(p.get("grad_accum", self.grad_accum)) > 1 for p in self.phases or [{}])

    def __post_init__(self) -> None:
        if isinstance(self.output_dir, Path):  # Path objects from Python callers; YAML wants str
            self.output_dir = str(self.output_dir)
        # what each setting may be; the errors name key, value and range (bert_kit/checks.py)
        pairs = "[CLS] A [SEP] B [SEP]" if self.nsp else "[CLS] text [SEP]"
        self.check({
            "warmup_steps": Range(0, self.max_steps, integer=True, optional=True, hint="at most max_steps"),
            "max_length": Range(5 if self.nsp else 3, integer=True, hint=f"room for {pairs}"),
            "eval_fraction": fraction(high_open=True),
            "shuffle_buffer": positive(integer=True),
            "mask_probability": fraction(low_open=True, high_open=True),
            "short_seq_prob": fraction(),
            "eval_batches": positive(integer=True),
            "dropout": fraction(high_open=True, optional=True),
        })
        if isinstance(self.model, str) and not self.model.strip():
            raise ConfigError("model is empty: name a preset (e.g. bert-mini), a model folder or a config file")
        if self.max_steps is None and self.time_budget is None:
            raise ConfigError("max_steps=null needs a time_budget (e.g. time_budget=6m) to end the run")
        if self.max_steps is None and len(self.phases) > 1:
            raise ConfigError("phases split max_steps: set max_steps (a time_budget alone cannot place them)")
        for i, phase in enumerate(self.phases):
            if not isinstance(phase, dict):
                raise ConfigError(f"phases[{i}]={phase!r} must be a mapping, e.g. {{max_length: 512, fraction: 0.1}}")
            unknown = sorted(set(phase) - set(PHASE_KEYS))
            if unknown:
                raise ConfigError(f"phases[{i}]: unknown key(s) {unknown}; valid keys: {', '.join(PHASE_KEYS)}")
            fraction(low_open=True).check(f"phases[{i}].fraction", phase.get("fraction"))
            for key in ("max_length", "batch_size", "grad_accum"):
                if key in phase:
                    low = 5 if self.nsp and key == "max_length" else 3 if key == "max_length" else 1
                    Range(low, integer=True).check(f"phases[{i}].{key}", phase[key])
        if self.phases and abs(sum(float(p["fraction"]) for p in self.phases) - 1) > 1e-6:
            raise ConfigError(f"phases: fractions must add up to 1, got {[p['fraction'] for p in self.phases]}")
        if (self.cuda_graphs is True or self.compile_tuning) and not self.compile:
            raise ConfigError("cuda_graphs and compile_tuning need compile: true")
        if self.cuda_graphs is True and self.accumulates_gradients:
            raise ConfigError("cuda_graphs needs grad_accum 1 in every phase: a CUDA graph's gradients are "
                              "overwritten by its next replay, before they could be accumulated")
        if self.segment_pairs and self.nsp:
            raise ConfigError("segment_pairs: true is for MLM only (nsp: false); NSP pairs already have two segments")
        if self.streaming and self.nsp:
            raise ConfigError("streaming: true trains MLM only (NSP pairs sentences across the whole corpus): "
                              "set nsp: false")
        if self.streaming and not self.eval_files:
            raise ConfigError("streaming: true needs eval_files (a stream has no tail to hold out with "
                              "eval_fraction): name held-out text files")
        if self.train_tokenizer is not None:
            unknown = sorted(set(self.train_tokenizer) - set(TOKENIZER_TRAIN_KEYS))
            if unknown:
                raise ConfigError(f"train_tokenizer: unknown key(s) {unknown}; "
                                  f"valid keys: {', '.join(TOKENIZER_TRAIN_KEYS)}")
            self.train_tokenizer = {key: coerce(value, TOKENIZER_TRAIN_TYPES[key], f"train_tokenizer.{key}")
                                    for key, value in self.train_tokenizer.items()}  # lowercase: no -> False
            for key, rule in TOKENIZER_TRAIN_RULES.items():
                if key in self.train_tokenizer:
                    rule.check(f"train_tokenizer.{key}", self.train_tokenizer[key])
        self.encoding = check_encoding(self.encoding)
        # the longest sequence must fit the model's position table, when the model is known here
        # (a folder not written yet is checked when the model is built)
        config = model_config(self.model)
        longest = max([self.max_length] + [p.get("max_length", self.max_length) for p in self.phases])
        if config is not None and longest > config.max_length:
            raise ConfigError(f"max_length={longest} is out of range: the model holds "
                              f"{config.max_length} positions (max_position_embeddings)")
        if config is not None and self.nsp and not getattr(config, "pooler", False):
            raise ConfigError(f"nsp: true trains next-sentence prediction on the pooler, which a {config.model_type} "
                              "encoder does not have: set nsp: false (MLM only)")
        if config is not None and self.segment_pairs and not getattr(config, "type_vocab_size", 0):
            raise ConfigError(f"segment_pairs: true trains the segment-1 embedding, which a {config.model_type} "
                              "encoder does not have: set segment_pairs: false")
        # last, so that a wrong value is named before a missing file: the files the run reads
        for key in ("train_files", "eval_files"):
            for i, name in enumerate(getattr(self, key)):
                check_input_path(f"{key}[{i}]", name, folder_ok=True)
        check_tokenizer_setting(self.tokenizer)


@dataclass
class Phase:
    """Steps [start, end) run with one sequence length and batch size."""

    index: int
    start: int
    end: int
    max_length: int
    batch_size: int
    grad_accum: int


def plan_phases(cfg: PretrainConfig, total_steps: int | None = None) -> list[Phase]:
    """Turn `phases` fractions into step ranges; the last phase takes the rounding remainder."""
    specs = cfg.phases or [{"fraction": 1.0}]
    total = total_steps or cfg.max_steps
    phases, start = [], 0
    for i, spec in enumerate(specs):
        last = i == len(specs) - 1
        end = total if last else min(total, start + round(spec["fraction"] * total))
        phases.append(Phase(i, start, end, int(spec.get("max_length", cfg.max_length)),
                            int(spec.get("batch_size", cfg.batch_size)), int(spec.get("grad_accum", cfg.grad_accum))))
        start = end
    return phases
