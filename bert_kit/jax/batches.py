"""The JAX engine's batches: the job's host batches (dicts of CPU tensors) as NumPy arrays of static
shapes, so that a run compiles a program per shape and meets few shapes.

Fine-tuning batches are padded to a length bucket (powers of two from 32 tokens,
`compilation.length_bucket`) and to a full batch of examples (padding examples carry no label;
evaluation batches to eval_batch_size); pretraining batches come padded to max_length, with their
prediction slots. The engine splits what this returns over its devices (`JaxEngine.to_devices`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bert_kit.jax.compilation import length_bucket
from bert_kit.jax.tasks import TaskHead
from bert_kit.jax.train import IGNORE_INDEX

# what the engine passes on to the device; the rest (packing layouts, document ids) is the torch side's
INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels", "masked_positions", "masked_labels",
          "next_sentence_label", "start_positions", "end_positions", "keys", "group_labels", "group_mask")
LAID_OUT = ("slots",)  # read by a head's `layout` (a reranker's pairs' places), not sent to the device
PER_EXAMPLE = ("masked_positions", "masked_labels", "keys", "group_mask")  # 2-D, not one value per token
TOKENS = ("input_ids", "attention_mask", "token_type_ids")  # (rows, T): padded to the length bucket
PADDING = {"input_ids": None, "attention_mask": 0, "token_type_ids": 0, "labels": IGNORE_INDEX,
           "masked_positions": 0, "masked_labels": IGNORE_INDEX, "next_sentence_label": IGNORE_INDEX,
           "start_positions": IGNORE_INDEX, "end_positions": IGNORE_INDEX, "keys": -1,
           "group_labels": np.nan, "group_mask": False}
# keys: a contrastive batch's text ids, (B, k) on the device, a padding row's -1 marking it as no
# example; group_labels and group_mask: a reranker's (Q, n) lists, none in a padding query


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class HostBatches:
    """`host_batches(batches, use, length)`: a step's (or an evaluation's) batches as one NumPy batch.
    head: the fine-tuning task's (`TaskHead.layout`, `host_inputs`, `sides`); None for pretraining.
    local_devices: this process's; a batch's rows are a multiple of them."""

    def __init__(self, cfg: Any, head: TaskHead | None, pad_id: int, local_devices: int) -> None:
        self.cfg, self.head, self.pad_id, self.local_devices = cfg, head, pad_id, local_devices
        self.rows: dict[tuple, int] = {}  # the most rows a batch had, per use and length: shorter ones are padded

    def __call__(self, batches: list[dict], use: str, length: int | None = None) -> dict[str, np.ndarray]:
        """The job's batches (dicts of CPU tensors) as one NumPy batch (A, B, T...) of static shapes:
        tokens padded to a length bucket (`length_bucket`; or to `length`), examples to the run's
        batch size (`use` "train", else the evaluation's) and to a multiple of the local devices.
        Padding examples repeat example 0's inputs (a real sequence: no all-masked attention row)
        and carry no label; the rows of a bi-encoder's two sentences (an embedding batch's k texts)
        are padded side by side, and an embedding batch's text ids `keys` become (A, B, k), -1 on
        padding rows; a reranker's lists are laid out as a grid by its head (`TaskHead.layout`).
        A training batch gets the head's host inputs too (`TaskHead.host_inputs`)."""
        arrays = [{k: np.asarray(b[k]) for k in INPUTS + LAID_OUT if k in b} for b in batches]
        if self.head is not None:
            arrays = [self.head.layout(a) for a in arrays]
        for a in arrays:
            if "keys" in a:  # (k, B) -> (B, k): split over the devices by example, as every input
                a["keys"] = a["keys"].T
        longest = max(a["input_ids"].shape[1] for a in arrays)
        if length is None:
            length = length_bucket(longest, self.cfg.max_length)
        if jax.process_count() > 1:  # every host's batch of one step must have the same shape
            length = max(longest, self.cfg.max_length)
        if "masked_positions" in arrays[0]:  # MLM: padded to max_length already, predicted at the slots
            length = longest
            for a in arrays:
                a.pop("labels", None)
        sides = self.head.sides if self.head is not None else 1
        if "keys" in arrays[0]:  # a contrastive batch: k texts an example (evaluation: 1)
            sides = arrays[0]["keys"].shape[1]
        if "group_mask" in arrays[0]:  # a reranker's batch: n candidates a query
            sides = arrays[0]["group_mask"].shape[1]
        examples = max(len(a["input_ids"]) // sides for a in arrays)
        base = self.cfg.batch_size if use == "train" else getattr(self.cfg, "eval_batch_size", self.cfg.batch_size)
        rows = self.rows[use, length] = round_up(max(examples, base, self.rows.get((use, length), 0)),
                                                 self.local_devices)
        out = {}
        for key in arrays[0]:
            padded = []
            for a in arrays:
                x = a[key]
                pad = self.pad_id if key == "input_ids" else PADDING[key]
                if x.dtype.kind == "f":  # regression targets, label sets (B, C): NaN marks a row without one
                    x, pad = x.astype(np.float32), np.nan
                elif x.ndim == 2 and key not in PER_EXAMPLE:  # one value per token
                    x = np.pad(x, ((0, 0), (0, length - x.shape[1])), constant_values=pad)
                if key in TOKENS:
                    # (sides, examples, T): each side's rows padded with copies of its first
                    x = x.reshape(sides, -1, length)
                    x = np.concatenate([x, np.repeat(x[:, :1], rows - x.shape[1], axis=1)], 1).reshape(-1, length)
                elif len(x) < rows:
                    x = np.concatenate([x, np.full((rows - len(x), *x.shape[1:]), pad, x.dtype)])
                padded.append(x.astype(np.int32) if x.dtype.kind in "iu" else x)
            out[key] = np.stack(padded)
        if use == "train" and self.head is not None:
            out.update(self.head.host_inputs(out))
        return out
