"""Dynamic masking for masked-language-model pretraining.

`mask_tokens` applies the BERT corruption to a batch of token ids:

* each eligible token (not special, not padding) is chosen with probability `mask_probability`
  (0.15); with `whole_word=True` each *word* is chosen with that probability and all of its
  WordPieces follow it, so the expected fraction of chosen tokens is still 0.15;
* a chosen token becomes [MASK] 80% of the time, a random non-special token 10% of the time
  and stays unchanged 10% of the time (decided per token, as in Google's reference code);
* labels hold the original id at chosen positions and -100 (the ignore index) elsewhere;
* with `max_per_row`, no row holds more chosen tokens than that (Google's max_predictions_per_seq):
  a row over it keeps the tokens (whole words, with `whole_word`) of its lowest draws, so a model
  that predicts at fixed per-row slots (`row_prediction_slots`, the JAX engine) has room for
  every target. Rows under it, and runs without it, are masked exactly as before.

Masking is *dynamic*: `DataCollatorForMLM` masks each batch as it is built, so every epoch sees
a fresh mask (RoBERTa). With a seed, the mask of a batch depends only on (seed, epoch, global
batch index), so runs are reproducible and a resumed run masks exactly as the original would,
whatever the number of DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

IGNORE_INDEX = -100

__all__ = [
    "IGNORE_INDEX",
    "mask_tokens",
    "continuation_from_word_ids",
    "continuation_table",
    "DataCollatorForMLM",
    "MLMCollator",
    "cap_per_row",
    "row_prediction_slots",
]


def _special_mask(input_ids: torch.Tensor, special: torch.Tensor | Iterable[int]) -> torch.Tensor:
    """Bool (B, T) mask of special positions, from a mask or from a collection of special ids."""
    if isinstance(special, torch.Tensor):
        if special.shape != input_ids.shape:
            raise ValueError(
                f"special_tokens_mask has shape {tuple(special.shape)}, "
                f"input_ids has shape {tuple(input_ids.shape)}"
            )
        return special.to(torch.bool)
    ids = torch.tensor(sorted(set(int(i) for i in special)), dtype=input_ids.dtype,
                       device=input_ids.device)
    return torch.isin(input_ids, ids)


def continuation_from_word_ids(word_ids: torch.Tensor) -> torch.Tensor:
    """Bool (B, T): True where a token continues the word of the token before it.

    `word_ids` (B, T) holds the word index of every token and -1 for tokens that belong to no
    word ([CLS], [SEP], padding), i.e. the tokenizer's `word_ids` with None replaced by -1.
    """
    cont = torch.zeros_like(word_ids, dtype=torch.bool)
    cont[:, 1:] = (word_ids[:, 1:] == word_ids[:, :-1]) & (word_ids[:, 1:] >= 0)
    return cont


def continuation_table(tokenizer: Any) -> torch.Tensor:
    """Bool (V,): True for WordPiece continuation tokens (those spelled '##...')."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    return torch.tensor([t is not None and t.startswith("##") for t in tokens], dtype=torch.bool)


def _word_groups(is_continuation: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    """Group index (B, T) of every token: a word start and its '##' continuations share one.

    Special tokens always start their own group, and so does a continuation token at the start
    of a row or right after a special token (a word cut by truncation or packing).
    """
    starts = ~is_continuation.to(torch.bool) | special
    starts[:, 0] = True
    starts[:, 1:] |= special[:, :-1]
    return torch.cumsum(starts.long(), dim=1) - 1  # (B, T), values in [0, T)


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor | Iterable[int],
    vocab_size: int,
    mask_token_id: int,
    mask_probability: float = 0.15,
    generator: torch.Generator | None = None,
    word_ids: torch.Tensor | None = None,
    whole_word: bool = False,
    *,
    is_continuation: torch.Tensor | None = None,
    random_exclude_ids: Iterable[int] | None = None,
    max_per_row: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply BERT's 80/10/10 masking to a batch.

    Args:
        input_ids: LongTensor (B, T).
        special_tokens_mask: bool (B, T), True at special tokens and padding; or a collection of
            special token ids (which must include the padding id).
        vocab_size: V; random replacements are drawn uniformly from the non-special ids in [0, V).
        mask_token_id: id of [MASK].
        mask_probability: chance that an eligible token (or word, with `whole_word`) is chosen.
        generator: torch.Generator for reproducible masks (None: torch's global RNG).
        word_ids: LongTensor (B, T), word index per token, -1 for no word; used by `whole_word`.
        whole_word: choose whole words; groups come from `word_ids` or `is_continuation`.
        is_continuation: bool (B, T), True for '##' tokens (see `continuation_table`).
        random_exclude_ids: ids never drawn as random replacements; defaults to the special ids
            when those are given as ids, else to `{mask_token_id}`.
        max_per_row: at most this many chosen tokens per row (`cap_per_row`); None: no cap.

    Returns:
        (masked_input_ids, labels): both LongTensor (B, T); labels are the original ids at chosen
        positions and -100 elsewhere. `input_ids` is not modified.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if not 0.0 <= mask_probability <= 1.0:
        raise ValueError(f"mask_probability must be in [0, 1], got {mask_probability}")
    if not isinstance(special_tokens_mask, torch.Tensor):
        special_tokens_mask = [int(i) for i in special_tokens_mask]  # may be a one-shot iterable
        if random_exclude_ids is None:
            random_exclude_ids = special_tokens_mask
    elif random_exclude_ids is None:
        random_exclude_ids = (mask_token_id,)
    special = _special_mask(input_ids, special_tokens_mask)
    device = input_ids.device

    # The generator lives on the CPU; draw there and move, so CPU and GPU give the same mask.
    def rand(shape: Sequence[int]) -> torch.Tensor:
        return torch.rand(tuple(shape), generator=generator).to(device)

    if whole_word:
        if word_ids is not None:
            is_continuation = continuation_from_word_ids(word_ids)
        if is_continuation is None:
            raise ValueError("whole_word=True needs word_ids or is_continuation (B, T)")
        if is_continuation.shape != input_ids.shape:
            raise ValueError(
                f"is_continuation has shape {tuple(is_continuation.shape)}, "
                f"input_ids has shape {tuple(input_ids.shape)}"
            )
        groups = _word_groups(is_continuation.to(device), special)
        # One uniform draw per group, read back at every token of the group: all-or-none.
        draws = rand(input_ids.shape).gather(1, groups)
    else:
        draws = rand(input_ids.shape)
    chosen = (draws < mask_probability) & ~special
    if max_per_row is not None:
        chosen = cap_per_row(chosen, draws, max_per_row)

    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = rand(input_ids.shape)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)  # the remaining 10% stay unchanged

    masked = input_ids.clone()
    masked[to_mask] = mask_token_id
    excluded = torch.tensor(sorted(set(int(i) for i in random_exclude_ids)), dtype=torch.long)
    pool = torch.arange(vocab_size, dtype=torch.long)
    pool = pool[~torch.isin(pool, excluded)]  # (V',) ids a random replacement may take
    picks = torch.randint(len(pool), tuple(input_ids.shape), generator=generator)
    random_ids = pool[picks].to(device=device, dtype=input_ids.dtype)
    masked[to_random] = random_ids[to_random]
    return masked, labels


def cap_per_row(chosen: torch.Tensor, draws: torch.Tensor, k: int) -> torch.Tensor:
    """`chosen` (B, T) bool with at most `k` True per row: those of the lowest `draws` (B, T).

    A token is kept when the chosen tokens drawn at or below its draw number k or fewer; the
    pieces of a whole word share one draw, so a word is kept or dropped whole. Rows holding k or
    fewer are unchanged. Uses no random numbers: the masks' stream is the same with or without it.
    """
    keyed = torch.where(chosen, draws, torch.full_like(draws, 2.0))  # draws are in [0, 1): the rest sort last
    at_or_below = torch.searchsorted(keyed.sort(dim=1).values, keyed.contiguous(), right=True)  # (B, T)
    return chosen & (at_or_below <= k)


def row_prediction_slots(batch: dict, slots: int) -> dict:
    """`batch` plus masked_positions and masked_labels (B, slots): each row's labelled positions
    first, in order, then -100 targets (at position 0) in the spare slots. Fixed shapes: a model
    compiled once predicts at every row's slots (the JAX engine's MLM head). Needs labels (B, T)
    with at most `slots` labelled per row (`max_per_row` of the masking)."""
    labels = batch["labels"]
    masked = labels != IGNORE_INDEX
    most = int(masked.sum(1).max()) if labels.numel() else 0
    if most > slots:
        raise ValueError(f"a row has {most} masked tokens, more than its {slots} prediction slots")
    if slots > labels.shape[1]:  # a short batch: every position is a slot, the rest padding
        labels = torch.nn.functional.pad(labels, (0, slots - labels.shape[1]), value=IGNORE_INDEX)
        masked = labels != IGNORE_INDEX
    order = torch.sort((~masked).to(torch.uint8), dim=1, stable=True).indices[:, :slots]  # labelled first
    targets = labels.gather(1, order)
    positions = torch.where(targets != IGNORE_INDEX, order, torch.zeros_like(order))
    return {**batch, "masked_positions": positions, "masked_labels": targets}


def _mix_seed(*parts: int) -> int:
    """Combine integers into one 63-bit seed (splitmix-style), so nearby inputs decorrelate."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


class DataCollatorForMLM:
    """Pad a list of examples into a batch and mask it.

    An example is a list/array/tensor of token ids (with [CLS]/[SEP] already in place) or a dict
    with "input_ids" and optionally "token_type_ids", "next_sentence_label" (or "nsp_label") and
    "sequence_ids" (document index per token, from packing). The batch is a dict of tensors:

    * input_ids (B, T) long, masked; labels (B, T) long, -100 except at masked positions;
    * attention_mask (B, T) long, 1 on real tokens; token_type_ids (B, T) long;
    * next_sentence_label (B,) long, when the examples carry it (0 = IsNext, 1 = random);
    * sequence_ids (B, T) long, -1 on padding, when the examples carry it.

    T is the longest example, rounded up to `pad_to_multiple_of` when given (8 suits tensor cores).
    With `seed` set, the mask of a batch is a function of (seed, epoch, global batch index): call
    `set_epoch(epoch)` each epoch (or `set_epoch(epoch, start_step=k)` when resuming at batch k).
    `postprocess(batch)`, when given, finishes each batch where it is built (in the DataLoader
    workers), e.g. `with_prediction_slots`, so the training process does not do it between steps.
    With `segment_pairs`, an example without token_type_ids gets type 1 from a random point on
    (uniform over its length; at the end: none), as the second text of a pair task does: packed
    MLM would otherwise never train the segment-1 embedding that a cross-encoder gives sentence B.
    With `max_predictions`, no row gets more masked tokens than that (`mask_tokens`' max_per_row).
    """

    def __init__(
        self,
        tokenizer: Any,
        mask_probability: float = 0.15,
        whole_word: bool = False,
        pad_to_multiple_of: int | None = None,
        seed: int | None = None,
        mlm: bool = True,
        postprocess: Callable[[dict], dict] | None = None,
        segment_pairs: bool = False,
        max_predictions: int | None = None,
    ) -> None:
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.vocab_size = int(tokenizer.vocab_size)
        self.special_ids = torch.tensor(sorted(tokenizer.special_token_ids), dtype=torch.long)
        self.mask_probability = mask_probability
        self.whole_word = whole_word
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        self.mlm = mlm
        self.postprocess = postprocess
        self.segment_pairs = segment_pairs
        self.max_predictions = max_predictions
        self.continuation = continuation_table(tokenizer) if whole_word else None
        self.epoch = 0
        self.start_step = 0
        self._calls = 0  # batches built by this copy (one copy per DataLoader worker)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Start `epoch` at global batch index `start_step` (non-zero when resuming)."""
        self.epoch, self.start_step, self._calls = int(epoch), int(start_step), 0

    def _generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        # Worker w of k builds batches w, w + k, w + 2k, ... (the DataLoader deals them round-robin),
        # so the global batch index is recoverable and masks do not depend on num_workers.
        info = torch.utils.data.get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start_step + worker + self._calls * n_workers
        return torch.Generator().manual_seed(_mix_seed(self.seed, self.epoch, step))

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(examples) == 0:
            raise ValueError("cannot collate an empty list of examples")
        rows = [ex if isinstance(ex, dict) else {"input_ids": ex} for ex in examples]
        ids = [torch.as_tensor(r["input_ids"], dtype=torch.long).reshape(-1) for r in rows]
        T = max(len(x) for x in ids)
        if self.pad_to_multiple_of:
            T = -(-T // self.pad_to_multiple_of) * self.pad_to_multiple_of
        B = len(ids)
        input_ids = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((B, T), dtype=torch.long)
        token_type_ids = torch.zeros((B, T), dtype=torch.long)
        has_seq = "sequence_ids" in rows[0]
        sequence_ids = torch.full((B, T), -1, dtype=torch.long) if has_seq else None
        for i, (row, x) in enumerate(zip(rows, ids)):
            n = len(x)
            input_ids[i, :n] = x
            attention_mask[i, :n] = 1
            if "token_type_ids" in row:
                token_type_ids[i, :n] = torch.as_tensor(row["token_type_ids"], dtype=torch.long)
            if sequence_ids is not None:
                sequence_ids[i, :n] = torch.as_tensor(row["sequence_ids"], dtype=torch.long)

        generator = self._generator()
        if self.segment_pairs:
            # drawn from the batch's own stream, before the masks: both follow (seed, epoch, step)
            lengths = attention_mask.sum(1)
            cuts = (torch.rand(B, generator=generator) * (lengths + 1)).long()
            second = torch.arange(T)[None, :] >= cuts[:, None]
            given = torch.tensor(["token_type_ids" in r for r in rows])[:, None]
            token_type_ids = torch.where(second & (attention_mask == 1) & ~given, 1, token_type_ids)
        batch = {"input_ids": input_ids, "token_type_ids": token_type_ids,
                 "attention_mask": attention_mask}
        if self.mlm:
            special = torch.isin(input_ids, self.special_ids) | (attention_mask == 0)
            cont = self.continuation[input_ids] if self.continuation is not None else None
            batch["input_ids"], batch["labels"] = mask_tokens(
                input_ids, special, self.vocab_size, self.mask_token_id, self.mask_probability,
                generator=generator, whole_word=self.whole_word, is_continuation=cont,
                random_exclude_ids=self.special_ids.tolist(), max_per_row=self.max_predictions,
            )
            self._calls += 1
        nsp_key = next((k for k in ("next_sentence_label", "nsp_label") if k in rows[0]), None)
        if nsp_key is not None:
            batch["next_sentence_label"] = torch.tensor([int(r[nsp_key]) for r in rows],
                                                        dtype=torch.long)
        if sequence_ids is not None:
            batch["sequence_ids"] = sequence_ids
        return self.postprocess(batch) if self.postprocess is not None else batch


# Short alias used in examples and docs.
MLMCollator = DataCollatorForMLM
