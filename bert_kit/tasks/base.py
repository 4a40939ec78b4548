"""What every task shares: the `Task` base class, building a model with its head, and batching.

A `Task` knows how to read its training and validation files, which head to put on the
encoder, its loss, how to score a model on held-out data, and how to turn model outputs into
answers (labels, word tags, spans, scores). `settings` is a `FinetuneConfig` (or any object with
its fields). Under torchrun every rank evaluates: `Task.outputs` runs each rank's share of the
examples and gathers all outputs on every rank (`shard_and_gather`), so every rank computes the
same metrics in 1/N of the time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn

from bert_kit.data.classification import pad_collate
from bert_kit.model import BERTModel, Packed, unchecked_inputs
from bert_kit.model_folder import locate_model
from bert_kit.training.distributed import all_gather_object, rank, world_size
from bert_kit.training.trainer import to_device


def build_model(cls: type, source: str | Path, vocab_size: int, **head_args: Any) -> nn.Module:
    """`cls` from a model folder (pretrained weights, new head) or, for a preset name or config
    file, freshly initialised with the tokenizer's vocabulary size."""
    from bert_kit.config import BertConfig

    kind, where = locate_model(source)
    if kind == "folder":
        model = cls.from_pretrained(where, **head_args)
    elif kind == "file":
        model = cls(BertConfig.from_file(where), **head_args)
    else:
        model = cls(BertConfig.from_name(where, vocab_size=vocab_size), **head_args)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"model vocab_size {model.config.vocab_size} is smaller than the tokenizer's {vocab_size}")
    return model


def freeze_pooler(model: nn.Module) -> nn.Module:
    """Heads that never read the pooled [CLS] output leave the pooler frozen (unchanged when
    saved), so the optimizer and DDP see no parameter that never gets a gradient."""
    encoder = model.bert if hasattr(model, "bert") else model
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


def encode(model: nn.Module, batch: dict, unpadded: bool, suffix: str = "") -> Any:
    """Call the model on input_ids{suffix}, attention_mask{suffix}, token_type_ids{suffix}; unpadded
    uses the batch's host-computed packing layout ("packed{suffix}") when it has one."""
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

    def collate(self, items: list[dict]) -> dict:
        return pad_collate(items, pad_token_id=self.pad_token_id, pad_to_multiple_of=self.pad_multiple)

    static_shapes = False  # set by a run that replays CUDA graphs: one graph per padded shape

    @property
    def unpadded(self) -> bool:
        """Run the encoder on real tokens only: as the settings say, unless shapes must stay static."""
        return bool(getattr(self.s, "unpadded", False)) and not self.static_shapes

    @property
    def pad_multiple(self) -> int:
        """Compiled runs and CUDA graphs pad lengths to multiples of 16: few shapes, each compiled
        or captured once."""
        return 16 if self.static_shapes or getattr(self.s, "compile", False) else 1

    def bind(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id

    def metadata(self) -> dict[str, Any]:
        return {"task": self.name, "max_length": self.s.max_length}

    def load_metadata(self, meta: dict[str, Any]) -> None:
        """Take label names etc. from a saved folder (evaluate / predict)."""
        self.label_names = meta.get("label_names")

    def model_class(self) -> type:
        raise NotImplementedError

    def load(self, folder: str | Path) -> nn.Module:
        """A fine-tuned model for evaluation or prediction; its head must be in the folder."""
        cls = self.model_class()
        try:  # strict: a head that is missing would otherwise be silently random
            return cls.from_pretrained(folder, strict=cls is not BERTModel)
        except ValueError as e:
            raise ValueError(f"{folder} is not a {self.name} model (fine-tune it first: bert-kit finetune "
                             f"--task {self.name}): {e}") from None

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
                    if self.unpadded:
                        batch["packed"] = Packed.from_mask(batch["attention_mask"])
                    with precision.autocast():
                        results.append(fn(model, to_device(batch, precision.device)).float())
                    orders.append(idx)
        finally:
            model.train(was_training)
        out: list = [None] * len(items)
        for result, idx in zip(results, orders):  # each batch may have its own length: row by row
            for row, i in zip(result.cpu(), idx):
                out[i] = row
        return out
