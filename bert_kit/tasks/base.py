"""What every task shares: the `Task` base class, building a model with its head, and batching.

A `Task` knows how to read its training and validation files, which head to put on the
encoder, its loss, how to score a model on held-out data, and how to turn model outputs into
answers (labels, word tags, spans, scores). `settings` is a `FinetuneConfig` (or any object with
its fields). Under torchrun every rank evaluates: `Task.outputs` runs each rank's share of the
examples and gathers all outputs on every rank (`shard_and_gather`), so every rank computes the
same metrics in 1/N of the time. Every output passes `Task.outputs`, which refuses NaN or inf.

A fine-tuned folder records how its files were read (`Task.metadata`: columns, header,
delimiter, label_pattern, encoding), so `evaluate` and `predict` read other files the same way.
Texts that give the model no token (blank, or only control characters) are left out of
training and counted (`drop_empty_texts`), and flagged where they are scored (`flag_empty_texts`).
Texts longer than max_length are cut, and each file's count is said on one line
(`Task.report_truncated`, `bert_kit.data.truncation`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn

from bert_kit.checks import CorruptFileError
from bert_kit.data import setting
from bert_kit.data.classification import pad_collate, tokenless
from bert_kit.data.truncation import Truncated, report_truncated
from bert_kit.families import fresh_config, load_model, model_class
from bert_kit.input_checks import unchecked_inputs
from bert_kit.kernels.packing import Packed
from bert_kit.model_folder import locate_model, model_config
from bert_kit.training.distributed import all_gather_object, rank, world_size
from bert_kit.training.trainer import to_device


def build_model(role: str, source: str | Path, tokenizer: Any, **head_args: Any) -> nn.Module:
    """The model of `role` ("ForSequenceClassification", ...; `bert_kit.families`) for the
    architecture of `source`: from a model folder (pretrained weights, new head) or, for a preset
    name or config file, freshly initialised and sized to the tokenizer."""
    import warnings

    from bert_kit.hf import NewWeightsWarning

    kind, where = locate_model(source)
    if kind == "folder":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NewWeightsWarning)  # the new head is what this run trains
            model = load_model(role, where, **head_args)
    else:
        config = fresh_config(where, kind, tokenizer)
        model = model_class(config, role)(config, **head_args)
    if model.config.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"model vocab_size {model.config.vocab_size} is smaller than the tokenizer's "
                         f"{tokenizer.vocab_size}")
    return model


def freeze_pooler(model: nn.Module) -> nn.Module:
    """Heads that never read the pooled [CLS] output leave the pooler frozen (unchanged when
    saved), so the optimizer and DDP see no parameter that never gets a gradient."""
    encoder = model.bert if hasattr(model, "bert") else model
    if getattr(encoder, "pooler", None) is not None:  # RoBERTa, DistilBERT, ModernBERT have none
        encoder.pooler.requires_grad_(False)
    return model


def item_length(item: dict) -> int:
    """Tokens in one example (both sentences for bi-encoder pairs)."""
    return sum(len(v) for k, v in item.items() if k.startswith("input_ids"))


def sorted_batches(items: Sequence[dict], batch_size: int, collate: Callable) -> Iterator[tuple[list[int], dict]]:
    """(indices, batch) over `items` sorted by length, so padding is small at inference."""
    order = sorted(range(len(items)), key=lambda i: -item_length(items[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        yield chunk, collate([items[i] for i in chunk])


def encode(model: nn.Module, batch: dict, unpadded: bool | str, suffix: str = "") -> Any:
    """Call the model on input_ids{suffix}, attention_mask{suffix}, token_type_ids{suffix}; unpadded
    uses the batch's host-computed packing layout ("packed{suffix}") when it has one; "rows": every
    position, each row's padding a sequence of its own (`Packed.of_rows`, made on the device)."""
    if unpadded == "rows":
        layout = Packed.of_rows(batch["attention_mask" + suffix])
    else:
        layout = batch.get("packed" + suffix) if unpadded else None
    return model(batch["input_ids" + suffix], batch["attention_mask" + suffix],
                 batch.get("token_type_ids" + suffix), unpadded=layout if layout is not None else unpadded)


def shard_and_gather(items: Sequence[Any], fn: Callable[[list], Sequence[Any]]) -> list[Any]:
    """`fn` over this rank's share of `items`; its results for all items, in order, on every rank.

    A single process runs `fn(items)`. With several ranks this is collective (every rank calls it
    with the same items): rank r takes items r, r + N, r + 2N, ... and the shares are padded with
    copies of the first item to equal length, so every rank runs as many batches (FSDP2's forward
    gathers weights from all ranks, so a rank with one batch less would leave the others waiting).
    `fn(list)` returns one result per item; results must be picklable.
    """
    world = world_size()
    if world <= 1 or not items:
        return list(fn(list(items)))
    share = list(items[rank()::world])
    n = len(share)
    share += [items[0]] * (-(-len(items) // world) - n)
    out: list[Any] = [None] * len(items)
    for r, results in enumerate(all_gather_object(list(fn(share))[:n])):
        out[r::world] = results
    return out


def _shown(numbers: Sequence[int], unit: str) -> str:
    return f"{unit} " + ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")


def empty_rows(tokenizer: Any, *columns: Sequence[str] | None) -> list[int]:
    """Rows (0-based) where a text of any of the `columns` gives no token: blank, or only what the
    tokenizer's cleaning drops (control and format characters); see `data.classification.tokenless`."""
    rows: set[int] = set()
    for texts in columns:
        if texts is not None:
            rows.update(tokenless(texts, tokenizer))
    return sorted(rows)


def flag_empty_texts(path: str | Path, tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None,
                     unit: str = "line", numbers: Sequence[int] | None = None) -> list[int]:
    """Print a warning naming the inputs of `path` that give no token, which are still scored (as
    empty texts, so outputs stay one per input row); returns their rows (0-based). numbers: the
    1-based `unit` number of each row (default row + 1)."""
    rows = empty_rows(tokenizer, texts, pairs)
    if rows:
        numbers = [numbers[r] if numbers is not None else r + 1 for r in rows]
        blank = all(not texts[r].strip() and (pairs is None or not pairs[r].strip()) for r in rows)
        what = f"blank {unit}(s)" if blank else f"{unit}(s) blank or of control characters only"
        print(f"warning: {path}: {len(rows)} {what} ({_shown(numbers, unit)}) scored as empty texts; their outputs "
              "say nothing about your data (remove them to skip them)", file=sys.stderr)
    return rows


def line_numbers(lines: Sequence[str] | None) -> list[int] | None:
    """The line numbers of "file:line" locations; None if some location is no line (a record of a
    JSON array)."""
    ends = [at.rsplit(":", 1)[-1] for at in lines or []]
    return [int(e) for e in ends] if lines and all(e.isdigit() for e in ends) else None


def drop_empty_texts(path: str | Path, tokenizer: Any, lines: Sequence[str] | None, texts: Sequence[list | None],
                     others: Sequence[list | None] = ()) -> list[int]:
    """Leave out of training (in place, from every list of `texts` and `others`) the rows where a
    text gives no token, and say so on one line naming their lines (lines: "file:line" of each
    row); returns the rows left out (0-based). A row without text teaches nothing but a label prior."""
    rows = empty_rows(tokenizer, *texts)
    if rows and len(rows) == len(texts[0]):
        raise ValueError(f"{path}: every example's text is blank or only control characters: no token to train on")
    if rows:
        numbers = line_numbers(lines)
        shown = _shown([numbers[r] for r in rows], "line") if numbers else _shown([r + 1 for r in rows], "row")
        print(f"{path}: left out {len(rows)} example(s) whose text is blank or only control characters "
              f"({shown}): they give the model no token to learn from", file=sys.stderr)
        for column in [*texts, *others]:
            if column is not None:
                for r in reversed(rows):
                    del column[r]
    return rows


class NonFiniteOutputError(FloatingPointError):
    """A model gave NaN or inf outputs: probabilities, scores or vectors made of them mean nothing."""


def check_finite(batches: Sequence[torch.Tensor], model: Any, precision: Any = None) -> None:
    """Raise NonFiniteOutputError if any row of the output batches (B, ...) holds NaN or inf, saying
    why where it can: weights that hold NaN or inf, or a 16-bit precision that overflowed."""
    if all(bool(torch.isfinite(b).all()) for b in batches):
        return
    bad = sum(int((~torch.isfinite(b)).flatten(1).any(1).sum()) for b in batches)
    what = f"the model's outputs are NaN or inf for {bad} of {sum(len(b) for b in batches)} input(s)"
    named = getattr(model, "named_parameters", None)
    broken = next((name for name, p in named() if not torch.isfinite(p).all()), None) if named else None
    if broken is not None:
        raise NonFiniteOutputError(f"{what}: its weights hold NaN or inf values (first in {broken}); the model "
                                   "folder is broken (a diverged run?): use an earlier checkpoint")
    if precision is not None and getattr(precision, "use_autocast", False):
        raise NonFiniteOutputError(f"{what}: {precision.name} overflowed; run in fp32 ({setting('precision', 'fp32')})")
    raise NonFiniteOutputError(f"{what}: its weights are finite, so a layer overflowed; no output was written")


def _label_names(meta_names: Sequence[str] | None, n: int) -> list[str]:
    return list(meta_names) if meta_names else [str(i) for i in range(n)]


class Task:
    """Shared behaviour; subclasses fill in data, model, loss, evaluation and prediction."""

    name = ""
    default_metric = ""

    def __init__(self, settings: Any):
        self.s = settings
        self.label_names: list[str] | None = None

    @property
    def metric(self) -> str:
        return getattr(self.s, "metric", None) or self.default_metric

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The validation metrics `evaluate` reports (those `metric` may name)."""
        from bert_kit.tasks import metric_names

        return metric_names(self.name, bool(getattr(self, "bi_encoder", False)))

    def collate(self, items: list[dict]) -> dict:
        return pad_collate(items, pad_token_id=self.pad_token_id, pad_to_multiple_of=self.pad_multiple)

    static_shapes = False  # set by a run that replays CUDA graphs: one graph per padded shape
    row_layout = False  # ... in bf16 on a GPU: flash attention over `Packed.of_rows`, no mask

    @property
    def unpadded(self) -> bool | str:
        """Run the encoder on real tokens only, as the settings say. Where shapes must stay static
        (CUDA graphs), "rows" with `row_layout`: every position, the padding apart (`encode`);
        else padded, with a mask."""
        wanted = bool(getattr(self.s, "unpadded", False))
        if self.static_shapes:
            return "rows" if wanted and self.row_layout else False
        return wanted

    @property
    def pad_multiple(self) -> int:
        """Compiled runs and CUDA graphs pad lengths to multiples of 16: few shapes, each compiled
        or captured once."""
        return 16 if self.static_shapes or getattr(self.s, "compile", False) else 1

    def what(self, path: str | Path, kind: str) -> str:
        """How errors name a data file: its kind, and the setting that named it when it is one of the
        run's (`STS file (validation_file)`)."""
        key = next((k for k in ("train_file", "validation_file") if getattr(self.s, k, None)
                    and str(getattr(self.s, k)) == str(path)), None)
        return f"{kind} ({setting(key)})" if key else kind

    def report_truncated(self, path: str | Path, found: Truncated) -> None:
        """Say on one line how many texts of `path` were cut to max_length, and by how much."""
        report_truncated(found, path, self.positions())

    def positions(self) -> int | None:
        """The model's positions (how far max_length may go), when known without loading it."""
        try:
            kind, where = locate_model(self.s.model)
            config = model_config(where if kind != "preset" else str(where))
        except (OSError, ValueError):
            return None
        return None if config is None else config.max_position_embeddings

    def bind(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id

    # the settings that say how this task's files are read (`ner.word_column`: a task's group): recorded in
    # the model folder's metadata by their own name (word_column) and the defaults of evaluate and predict on it
    read_settings: tuple[str, ...] = ("encoding",)

    def setting(self, name: str) -> Any:
        """The setting `name` ("encoding", or "ner.tag_column" in a group), None where there is none."""
        value = self.s
        for part in name.split("."):
            value = getattr(value, part, None)
        return value

    def metadata(self) -> dict[str, Any]:
        reading = {k.rpartition(".")[2]: self.setting(k) for k in self.read_settings if self.setting(k) is not None}
        return {"task": self.name, "max_length": self.s.max_length, "data": reading}

    def load_metadata(self, meta: dict[str, Any]) -> None:
        """Take label names etc. from a saved folder (evaluate / predict)."""
        self.label_names = meta.get("label_names")

    # the model this task runs, as a role of `bert_kit.families` ("ForSequenceClassification", ...)
    role = "Model"

    # ---- training hooks with defaults (FinetuningJob) ------------------------------------------

    def sampler(self, items: Sequence[dict], batch_size: int, seed: int) -> Any:
        """The training order: shuffled by (seed, epoch), each rank its share, resumable."""
        from bert_kit.data.pretraining import DistributedResumableSampler

        return DistributedResumableSampler(len(items), shuffle=True, seed=seed, rank=rank(), world_size=world_size())

    def count(self, batch: dict) -> int:
        """The examples in a host batch."""
        return len(batch["labels"]) if "labels" in batch else len(batch["input_ids"])

    graphable = True  # a step CUDA graphs may record (no host work or random-state replays inside the loss)
    ungraphable = ""  # ... and why not, when it is not

    def save_model(self, model: nn.Module, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """The weights of a kept model folder (config.json, model.safetensors; `state`: a gathered state dict)."""
        from bert_kit.training.checkpoint import save_model

        save_model(model, folder, state)

    def load(self, folder: str | Path) -> nn.Module:
        """A fine-tuned model for evaluation or prediction; its head must be in the folder."""
        try:  # strict: a head that is missing would otherwise be silently random
            return load_model(self.role, folder, strict=self.role != "Model")
        except CorruptFileError:
            raise  # a file that cannot be used (truncated, NaN or integer weights): its own message
        except ValueError as e:
            raise ValueError(f"{folder} is not a {self.name} model (fine-tune it first: bert-kit finetune "
                             f"--task {self.name}): {e}") from None

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        """Validation metrics from the model's outputs for `items` (one row each, in their order):
        what `evaluate` computes from this engine's forward passes, and the JAX engine from its own."""
        raise NotImplementedError

    def scored_items(self, items: Sequence[Any]) -> list:
        """What the model runs on to score `items`, in order (`score` takes one output for each):
        the items themselves, but where an item holds several (a reranker's query and its candidates)."""
        return list(items)

    def score_outputs(self, items: Sequence[dict], outputs_of: Callable[[list], list]) -> dict[str, Any]:
        """Validation metrics of another engine's outputs (the JAX engine's): `outputs_of(share)` gives
        one CPU tensor per scored item of this rank's share (`scored_items`); every rank gets all rows
        (`shard_and_gather`), which must be finite, then `score`."""
        outputs = shard_and_gather(self.scored_items(items), outputs_of)
        check_finite([torch.stack(outputs)] if outputs and outputs[0].ndim == 1 else outputs, None)
        return self.score(outputs, items)

    def outputs(self, model: nn.Module, items: Sequence[dict], precision: Any, fn: Callable) -> list:
        """fn(model, device batch) -> tensor (B, ...) for each example, in the order of `items`.

        Under torchrun each rank runs its share and all rows are gathered (`shard_and_gather`):
        every rank must call this, with the same items."""
        return shard_and_gather(items, lambda share: self._outputs(model, share, precision, fn))

    def _outputs(self, model: nn.Module, items: Sequence[dict], precision: Any, fn: Callable) -> list:
        was_training = model.training
        model.eval()
        results, orders = [], []
        # length-sorted batches pad to about their own length; rows go back to the items' order.
        # Results stay on the device until the end: one transfer, no wait after every batch.
        try:
            with torch.inference_mode(), unchecked_inputs():  # ids came from the task's tokenizer
                for idx, batch in sorted_batches(items, self.s.eval_batch_size, self.collate):
                    if self.unpadded is True:  # (a "rows" layout is made on the device)
                        batch["packed"] = Packed.from_mask(batch["attention_mask"])
                    with precision.autocast():
                        results.append(fn(model, to_device(batch, precision.device)).float())
                    orders.append(idx)
        finally:
            model.train(was_training)
        results = [result.cpu() for result in results]
        check_finite(results, model, precision)  # NaN probabilities or scores would mean nothing
        out: list = [None] * len(items)
        for result, idx in zip(results, orders):  # each batch may have its own length: row by row
            for row, i in zip(result, idx):
                out[i] = row
        return out
