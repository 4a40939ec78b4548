"""`FinetuneConfig`: the settings of a fine-tuning run, and the lr it takes when `lr: auto`.

Plain Python (no torch): `bert-kit glue` checks every run's settings with it before it starts a
worker, and a mistyped key fails before torch is imported. The job that runs a config is
`bert_kit.tasks.finetuning`; the settings shared by every run are `RunSettings`.

What only one task reads is grouped under it: `qa` (`QASettings`), `ner` (`NERSettings`, token
classification), `similarity` (`SimilaritySettings`), `classification` (`ClassificationSettings`:
several labels per text, class weights, long texts; classification_config.py), `embedding` and
`reranker` (`retrieval_config.py`):

    task: qa
    qa: {doc_stride: 64, max_answer_length: 40}       # bert-kit finetune ... qa.doc_stride=64

The flat keys of earlier versions (`doc_stride: 64`, `similarity_mode: bi-encoder`) still work, in
configs, on the command line, in saved run configs and from Python, with a one-line note (`MOVED`;
docs/settings.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from bert_kit.checks import ConfigError, Range, check_settings, fraction, non_negative, positive, suggestion
from bert_kit.model_folder import locate_model, model_config
from bert_kit.tasks import PER_LABEL_METRICS, metric_names
from bert_kit.tasks.classification_config import ClassificationSettings, read_label_names_file
from bert_kit.tasks.data_settings import check_data_settings
from bert_kit.tasks.retrieval_config import EmbeddingSettings, RerankerSettings
from bert_kit.training.config_keys import accepts_moved_keys, note_once
from bert_kit.training.runconfig import build_group
from bert_kit.training.settings import RunSettings

DEFAULT_MAX_LENGTH = {"qa": 384, "embedding": 256, "reranker": 256}  # other tasks: 128
# lr: auto, by the encoder's parameters (embeddings included): (up to this many, lr). Evidence
# (docs/performance.md): the demo's 0.5M-parameter model fine-tunes at 1e-3; all-MiniLM-L6-v2
# (22.7M) is best at 1e-4 on SST-2, CoNLL-2003, STS-B and SQuAD, as is bert-small (29M) from
# scratch; bert-base takes the top of BERT's grid (5e-5, with 3 epochs of small data sets in
# mind) and bert-large its bottom (2e-5: larger steps diverge on small data sets).
AUTO_LR = ((2e6, 1e-3), (60e6, 1e-4), (200e6, 5e-5), (math.inf, 2e-5))
# LoRA's lr: auto is the full fine-tune's times this, at most LORA_MAX_LR: its adapters start at zero.
# The LoRA paper trains RoBERTa-base at 5e-4 where full fine-tuning takes 1e-5 to 3e-5; on 2,000 SST-2
# examples all-MiniLM-L6-v2's adapters reach 0.773 at 2e-3 and 0.517 at 5e-4 (docs/lora.md)
LORA_LR_FACTOR, LORA_MAX_LR = 20, 2e-3


@dataclass(frozen=True)
class PositiveOrAuto(Range):
    """A positive number, or the word auto."""

    def allows(self, value: Any) -> bool:
        return value == "auto" or super().allows(value)

    def describe(self) -> str:
        return super().describe() + " or auto"


@dataclass
class QASettings:
    """Extractive question answering (task: qa): windows over long contexts, the answer search, SQuAD files."""

    doc_stride: int = 128  # context tokens shared by consecutive windows of a long context
    max_query_length: int = 64  # questions are cut to this many tokens
    n_best: int = 20  # start/end candidates per window in the span search
    max_answer_length: int = 30  # longest answer span in tokens
    train_articles: int | None = None  # split train_file by article: the first N train, the rest evaluate
    skip_bad_answers: bool = False  # leave out (and count) answers that do not match their context instead of stopping

    def __post_init__(self) -> None:
        check_settings(self, {"doc_stride": non_negative(integer=True), "max_query_length": positive(integer=True),
                              "n_best": positive(integer=True), "max_answer_length": positive(integer=True),
                              "train_articles": positive(integer=True, optional=True)}, prefix="qa.")


@dataclass
class NERSettings:
    """Token classification (task: token-classification): the columns of its CoNLL files."""

    tag_column: int = -1  # column of the tag (default the last; negative counts from the end)
    word_column: int = 0  # column of the word

    def __post_init__(self) -> None:
        check_settings(self, {"tag_column": Range(integer=True), "word_column": Range(integer=True)}, prefix="ner.")
        if self.tag_column == self.word_column:
            raise ConfigError(f"ner.tag_column and ner.word_column are both {self.tag_column}")


@dataclass
class SimilaritySettings:
    """Sentence similarity (task: similarity): a cross-encoder on the pair, or a bi-encoder of pooled vectors."""

    mode: Literal["cross-encoder", "bi-encoder"] = "cross-encoder"  # regression on the pair, or cosine of vectors
    pooling: Literal["mean", "cls"] = "mean"  # bi-encoder pooling
    loss: Literal["cosine", "cosent"] = "cosine"  # bi-encoder: MSE on cos(u, v), or the CoSENT ranking loss
    score_range: list[float] | None = None  # [low, high] of the gold similarity scores (default [0, 5], STS-B)

    def __post_init__(self) -> None:
        check_settings(self, {}, prefix="similarity.")
        if self.score_range is not None:
            bounds = self.score_range
            if (not isinstance(bounds, (list, tuple)) or len(bounds) != 2
                    or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
                               for b in bounds) or not bounds[0] < bounds[1]):
                raise ConfigError(f"similarity.score_range must be [low, high] with finite low < high, got {bounds}")
            self.score_range = [float(b) for b in bounds]


@dataclass
class LoRASettings:
    """LoRA adapters through peft (`lora: {r: 8}`; bert_kit/lora.py): the encoder frozen, the head trained whole."""

    r: int = 8  # rank of each adapter
    alpha: float = 16.0  # scale: a layer's update is (alpha / r) B A
    dropout: float = 0.05  # dropout on the adapters' input
    target_modules: list[str] = field(default_factory=lambda: ["query", "value"])
    """the layers that get adapters, by HF's names (query, key, value, dense, attention.output.dense,
    intermediate.dense, output.dense; DistilBERT's q_lin, v_lin, ...) or bert-kit's (attention.out, ffn.up)"""

    def __post_init__(self) -> None:
        check_settings(self, {"r": positive(integer=True), "alpha": positive(), "dropout": fraction(high_open=True)},
                       prefix="lora.")
        if isinstance(self.target_modules, str):
            self.target_modules = [self.target_modules]
        if not self.target_modules or not all(isinstance(t, str) and t.strip() for t in self.target_modules):
            raise ConfigError(f"lora.target_modules={self.target_modules!r} must name layers, e.g. [query, value]")


@dataclass
class DistillSettings:
    """Distillation from a fine-tuned teacher (`distill: {teacher: runs/sst2}`; bert_kit/tasks/distillation.py)."""

    teacher: str = ""  # the fine-tuned teacher: a model folder of the same task (a run folder means its best/)
    temperature: float = 2.0  # soft labels softmax(logits / T); the KL term is scaled by T^2
    alpha: float = 0.5  # weight of the teacher's soft labels (embeddings: MSE onto its vectors); 1 - alpha: the labels
    hidden_weight: float = 0.0  # weight of an MSE between mapped hidden states (0: off; needs equal hidden sizes)
    student_layers: list[int] | None = None
    """the student is the teacher with only these encoder layers, e.g. [0, 2, 4] (DistilBERT takes every
    other layer); unset: the student is `model` (a smaller preset, or any model folder)"""

    def __post_init__(self) -> None:
        check_settings(self, {"temperature": positive(), "alpha": fraction(), "hidden_weight": non_negative()},
                       prefix="distill.")
        if not isinstance(self.teacher, str) or not self.teacher.strip():
            raise ConfigError("distill.teacher is empty: name the fine-tuned teacher's model folder")
        layers = self.student_layers
        if layers is not None and (not layers or len(set(layers)) != len(layers)
                                   or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers)):
            raise ConfigError(f"distill.student_layers={layers!r} must be distinct layer indices >= 0, e.g. [0, 2, 4]")


# the groups of task settings: field -> its dataclass
GROUPS = {"qa": QASettings, "ner": NERSettings, "similarity": SimilaritySettings,
          "classification": ClassificationSettings, "embedding": EmbeddingSettings, "reranker": RerankerSettings}
GROUP_TASKS = {"qa": "qa", "ner": "token-classification", "similarity": "similarity",
               "classification": "classification", "embedding": "embedding", "reranker": "reranker"}


def note_unread_settings(cfg: FinetuneConfig) -> None:
    """One line naming the settings of other tasks' groups that `cfg` sets (`unread_settings`), as a
    run starts; not an error: one set of overrides (a glue sweep's) serves runs of several tasks."""
    unread = unread_settings(cfg)
    if unread:
        note_once(f"note: task {cfg.task} does not read {', '.join(unread)} (settings of task "
                  f"{' / '.join(dict.fromkeys(GROUP_TASKS[k.split('.')[0]] for k in unread))})")


def unread_settings(cfg: FinetuneConfig) -> list[str]:
    """The settings set (away from their defaults) in the groups of tasks other than `cfg.task`:
    read by no part of the run. `group.key=value` each."""
    unread = []
    for name, task in GROUP_TASKS.items():
        given, default = getattr(cfg, name), GROUPS[name]()
        if task != cfg.task:
            unread += [f"{name}.{f.name}={getattr(given, f.name)!r}" for f in dataclasses.fields(default)
                       if getattr(given, f.name) != getattr(default, f.name)]
    return unread


@accepts_moved_keys
@dataclass
class FinetuneConfig(RunSettings):
    """Settings of one fine-tuning run (YAML keys; `key=value` on the command line); the fields
    shared by every run (optimisation, hardware, bookkeeping) are those of `RunSettings`, some
    with other defaults here."""

    task: Literal["classification", "token-classification", "qa", "similarity", "embedding", "reranker"] = \
        "classification"  # head and data
    model: str = ""  # model folder (HF BERT, bert-kit run or checkpoint), preset name (random init) or config file
    tokenizer: str | None = None  # tokenizer folder; default: the model folder's
    # data
    train_file: str = ""  # training data (classification TSV/CSV/JSONL/TXT, CoNLL, SQuAD JSON, STS-B or pair file)
    validation_file: str | None = None  # evaluated every epoch; QA with qa.train_articles: the rest of train_file
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
    # the settings of one task each
    qa: QASettings = field(default_factory=QASettings)
    ner: NERSettings = field(default_factory=NERSettings)
    similarity: SimilaritySettings = field(default_factory=SimilaritySettings)
    classification: ClassificationSettings = field(default_factory=ClassificationSettings)
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    reranker: RerankerSettings = field(default_factory=RerankerSettings)
    classifier_dropout: float | None = None  # dropout before the head (default hidden_dropout_prob)
    # parameter-efficient fine-tuning: adapters instead of the whole encoder
    lora: LoRASettings | None = None
    """LoRA adapters (peft; pip install "bert-kit[lora]"): lora: {r: 8, alpha: 16, dropout: 0.05,
    target_modules: [query, value]} (lora: {} takes these defaults); best/ holds the adapter alone
    (adapter_model.safetensors, adapter_config.json naming the base model folder), which every
    command loads merged into its base model (docs/lora.md)"""
    # optimisation (defaults for fine-tuning)
    epochs: float = 3.0  # passes over the training data (max_steps wins when set)
    max_steps: int | None = None  # optimizer steps in total
    lr: float | Literal["auto"] = "auto"
    """peak learning rate; auto: from the model's size, printed at the start (up to 2M parameters
    1e-3, 60M 1e-4 (all-MiniLM-L6-v2, bert-small), 200M 5e-5 (bert-base), larger 2e-5)"""
    warmup_fraction: float = 0.1  # warmup share of the steps (when warmup_steps is unset)
    eps: float = 1e-8
    """AdamW's denominator epsilon: 1e-8, as torch and HF's Trainer (pretraining keeps BERT's 1e-6).
    Gradients of a loss averaged over many outputs are small (binary cross-entropy over 28
    GoEmotions labels: an encoder weight's ~1e-6), and an epsilon of their size shrinks each step"""
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
    distill: DistillSettings | None = None
    """train `model` (the student) on a fine-tuned teacher's outputs: distill: {teacher: runs/sst2,
    temperature: 2, alpha: 0.5, hidden_weight: 0, student_layers: [0, 2, 4]}; classification (KL of
    soft labels) and similarity bi-encoders (MSE onto the teacher's embeddings); docs/distillation.md"""
    # bookkeeping
    output_dir: str = "runs/finetune"  # run folder
    seed: int = 42  # seeds the head init, data order and dropout
    metric: str | None = None
    """validation metric that picks best/ (its highest; a loss's lowest): any the task reports, a
    label's own F1 too (f1_joy); default per task (alias metric_for_best)"""
    # early stopping: the run ends after this many evaluations without an improvement of `metric`
    early_stopping_patience: int | None = None  # evaluations without improvement before the run stops (null: never)
    early_stopping_min_delta: float = 0.0  # an improvement of metric by no more than this counts as none
    eval_every: int = 0  # steps between evaluations (0: at the end of every epoch)
    save_every: int = 0  # steps between checkpoints (0: every save_minutes only)
    end_checkpoint: bool = False
    """a checkpoint (weights and optimizer state) when the run ends, for `--resume` with more epochs:
    off by default, as best/ holds the model (a stop signal's checkpoint is always written)"""
    keep_last: int = 2  # checkpoints kept (0: all)

    # flat keys of earlier versions -> where they belong now (they keep working, with a note)
    MOVED: ClassVar[dict[str, str]] = {
        "doc_stride": "qa.doc_stride", "max_query_length": "qa.max_query_length", "n_best": "qa.n_best",
        "max_answer_length": "qa.max_answer_length", "squad_train_articles": "qa.train_articles",
        "skip_bad_answers": "qa.skip_bad_answers", "tag_column": "ner.tag_column", "word_column": "ner.word_column",
        "similarity_mode": "similarity.mode", "pooling": "similarity.pooling", "similarity_loss": "similarity.loss",
        "score_range": "similarity.score_range"}
    # other names of a setting, taken as it (HF's metric_for_best_model names `metric` too)
    ALIASES: ClassVar[dict[str, str]] = {"metric_for_best": "metric", "metric_for_best_model": "metric"}
    # a resume may change how answers are searched and thresholds chosen (evaluation only), and when to stop
    # early; and eps, whose default went from 1e-6 to 1e-8 (a run begun before resumes, saying so)
    RESUMABLE: ClassVar[frozenset[str]] = RunSettings.RESUMABLE | {
        "qa.n_best", "qa.max_answer_length", "classification.threshold", "early_stopping_patience",
        "early_stopping_min_delta", "eps"}

    def __post_init__(self) -> None:
        for name, group in GROUPS.items():  # a mapping from Python or YAML becomes its group, checked
            setattr(self, name, build_group(group, getattr(self, name), name))
        if self.lora is not None:  # optional groups: absent (None) is off
            self.lora = build_group(LoRASettings, self.lora, "lora")
        if self.distill is not None:
            self.distill = build_group(DistillSettings, self.distill, "distill")
            if self.distill.student_layers is not None and not self.model:
                self.model = self.distill.teacher  # the student is a part of the teacher
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
            "classifier_dropout": fraction(high_open=True, optional=True),
            "early_stopping_patience": positive(integer=True, optional=True, hint="null: never stop early"),
            "early_stopping_min_delta": non_negative(),
        })
        if self.cuda_graphs is True and self.compile is False and (self.grad_accum > 1 or self.optimizer != "adamw"):
            raise ConfigError("cuda_graphs: true needs grad_accum 1 and optimizer adamw (or set cuda_graphs: auto)")
        if self.label_names is not None:
            names = self.label_names
            if not names or len(set(map(str, names))) != len(names):
                raise ConfigError(f"label_names={names!r} must be distinct names, one per label id")
            if self.num_labels is not None and self.num_labels != len(names):
                raise ConfigError(f"num_labels={self.num_labels} contradicts the {len(names)} label_names {names}")
        qa = self.qa
        room = self.max_length - qa.max_query_length - 3  # context tokens of a QA window
        if self.task == "qa" and room < 2:
            raise ConfigError(f"qa.max_query_length={qa.max_query_length} is out of range: a window of max_length "
                              f"{self.max_length} must also hold [CLS], 2 [SEP] and context tokens: expected an "
                              f"integer < {self.max_length - 4}")
        if self.task == "qa" and qa.doc_stride >= room:
            raise ConfigError(f"qa.doc_stride={qa.doc_stride} is out of range: expected an integer < {room} "
                              f"(max_length {self.max_length} - qa.max_query_length {qa.max_query_length} - 3 "
                              "special tokens: the context tokens of a window)")
        self.check_classification()
        if self.metric is not None:
            names = metric_names(self.task, bi_encoder=self.similarity.mode == "bi-encoder",
                                 dims=self.embedding.matryoshka_dims or ())
            labels = self.label_names if self.task == "classification" else None
            check_metric(self.metric, f"task {self.task}", names, labels, per_label=self.task == "classification")
        # the sequences must fit the model's position table, when the model is known here
        try:
            config = model_config(self.model) if self.model else None
        except ConfigError:
            config = None  # an unknown model name: `finetune` names it before reading any data
        if config is not None and self.max_length > config.max_length:
            raise ConfigError(f"max_length={self.max_length} is out of range: the model holds "
                              f"{config.max_length} positions (max_position_embeddings)")
        check_data_settings(self)
        if self.distill is not None and (self.task in ("qa", "token-classification") or self.engine == "jax"):
            raise ConfigError(f"distill trains classification and similarity students with engine=torch, not "
                              f"task={self.task}, engine={self.engine}")
        if self.distill is not None and self.distill.student_layers is not None and self.model != self.distill.teacher:
            raise ConfigError(f"distill.student_layers makes the student from the teacher's layers: leave model unset "
                              f"(it is {self.model!r}), or name a student model without student_layers")
        if self.lora is not None and (self.engine == "jax" or self.parallel == "fsdp"):
            raise ConfigError(f"lora trains with engine=torch and parallel=ddp (not {self.engine}, {self.parallel}): "
                              "its adapters are a few MB, replicated on every rank")

    def check_classification(self) -> None:
        """The classification group against the shared settings: label names from a file, label sets
        against regression."""
        c = self.classification
        if c.label_names_file is not None:
            names = read_label_names_file(c.label_names_file, self.encoding)
            if self.label_names is not None and list(self.label_names) != names:
                raise ConfigError(f"label_names={self.label_names} contradicts classification.label_names_file="
                                  f"{c.label_names_file} ({names[:5]}{', ...' if len(names) > 5 else ''})")
            if self.num_labels is not None and self.num_labels != len(names):
                raise ConfigError(f"num_labels={self.num_labels} contradicts the {len(names)} names of "
                                  f"classification.label_names_file={c.label_names_file}")
            self.label_names = names
        if c.label_columns is not None and self.label_names is not None and len(self.label_names) != len(
                c.label_columns):
            raise ConfigError(f"classification.label_columns names {len(c.label_columns)} columns but label_names "
                              f"{len(self.label_names)} labels: the columns name the labels, leave label_names out")
        if (c.multi_label or c.label_columns) and self.num_labels == 1:
            raise ConfigError("num_labels=1 is regression (one score per text); multi-label classification "
                              "(classification.multi_label or label_columns) needs one output per label")
        if isinstance(c.class_weights, list) and (self.num_labels or self.label_names):
            n = self.num_labels or len(self.label_names)
            if len(c.class_weights) != n:
                raise ConfigError(f"classification.class_weights holds {len(c.class_weights)} weights for {n} "
                                  "classes: give one per class, in id order")
        if c.long_text == "chunks" and c.chunk_stride is not None and c.chunk_stride >= self.max_length - 3:
            raise ConfigError(f"classification.chunk_stride={c.chunk_stride} is out of range: windows of max_length "
                              f"{self.max_length} tokens hold {self.max_length - 3} text tokens besides [CLS] and "
                              f"[SEP]s: expected an integer < {self.max_length - 3}")


def check_metric(metric: str, what: str, names: tuple[str, ...], labels: list[str] | None = None,
                 per_label: bool = False) -> None:
    """`metric` must be one of the validation metrics `names` that `what` ("task qa") reports, or,
    where the task reports them (`per_label`), a label's own score (`f1_joy`: one of `labels` when
    they are known; else checked once the data is read)."""
    if metric in names:
        return
    prefix, _, label = metric.partition("_")
    if per_label and f"{prefix}_" in PER_LABEL_METRICS and label and (labels is None or label in map(str, labels)):
        return
    hint = suggestion(metric, list(names) + [f"f1_{n}" for n in labels or []])
    macro = "; f1, precision and recall are macro averages" if "f1_micro" in names else ""
    per = "; f1_LABEL: the F1 of one label" if per_label else ""
    raise ConfigError(f"metric={metric!r} is not a validation metric of {what}: expected one of "
                      f"{', '.join(names)}{macro}{per}{f'; {hint}' if hint else ''}")


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
    lr = min(auto_lr(n) * LORA_LR_FACTOR, LORA_MAX_LR) if cfg.lora is not None else auto_lr(n)
    if os.environ.get("RANK", "0") == "0":  # before torchrun's group is joined: rank 0 by its environment
        size = f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"
        why = f" with LoRA ({LORA_LR_FACTOR}x, at most {LORA_MAX_LR:.0e}: its adapters start at zero)" \
            if cfg.lora is not None else ""
        print(f"lr auto: {lr:.0e} for a {size}-parameter encoder{why} (set lr=... to choose another)".replace(
            "e-0", "e-"), flush=True)
    return dataclasses.replace(cfg, lr=lr)
