"""Synthetic pretraining batches for the NumPy BERT: small, seeded and learnable.

The synthetic "language": a sentence counts upwards through the content tokens from a random start,
``w_t = 4 + (start + t) mod (vocab_size - 4)`` (ids 0-3 are [PAD], [CLS], [SEP], [MASK]). So

* MLM is learnable: a masked token is its left neighbour + 1 (or right neighbour - 1), which one
  attention head over positions plus the tied decoder can express;
* NSP is learnable: in ``[CLS] A [SEP] B [SEP]`` B is either a copy of A (label 1) or uniformly
  random tokens (label 0); copies are counting sentences, random ones are not.

Masking follows BERT: each content token is chosen with probability ``mask_prob`` (at least one per
sequence); a chosen token becomes [MASK] 80% of the time, a random token 10%, and stays 10%.

Every function takes ``random_seed`` (an int, a ``np.random.Generator`` or None) and draws only
from ``np.random.default_rng(random_seed)``, so equal seeds give equal batches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .layers import CLS_ID, MASK_ID, PAD_ID, SEP_ID

NUM_SPECIAL = 4  # ids below this are special tokens


class BertBatch(NamedTuple):
    """One batch; unpacks as the five arrays of the original API."""

    input_ids: np.ndarray         # (B, T) int64
    segment_ids: np.ndarray       # (B, T) int64: 0 for [CLS] A [SEP], 1 for B [SEP]
    masked_positions: np.ndarray  # (B, M) int64, -1 = padding
    mlm_labels: np.ndarray        # (B, M) int64, original token at each masked position, -1 = padding
    nsp_labels: np.ndarray        # (B,) int64: 1 = B is A's copy (or single segment), 0 = random B

    @property
    def is_pair(self) -> bool:
        """True for an NSP sentence-pair batch, False for a single-segment MLM batch."""
        return bool((self.segment_ids == 1).any())


def _check_sizes(batch_size: int, seq_len: int, vocab_size: int, min_len: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seq_len < min_len:
        raise ValueError(f"seq_len must be >= {min_len}, got {seq_len}")
    if vocab_size <= NUM_SPECIAL:
        raise ValueError(f"vocab_size must exceed the {NUM_SPECIAL} special tokens, got {vocab_size}")


def _counting_sentences(rng: np.random.Generator, batch_size: int, length: int, vocab_size: int) -> np.ndarray:
    """(B, length) content ids: consecutive ids from a random start, wrapping around the vocab."""
    num_content = vocab_size - NUM_SPECIAL
    start = rng.integers(0, num_content, size=(batch_size, 1))
    return NUM_SPECIAL + (start + np.arange(length)) % num_content


def create_mlm_batch(batch_size: int, seq_len: int, vocab_size: int, mask_prob: float = 0.15,
                     random_seed=None) -> BertBatch:
    """Single-segment ``[CLS] sentence [SEP]`` batch with BERT masking.

    Returns input_ids (B, T), segment_ids (B, T) zeros, masked_positions (B, M) and mlm_labels (B, M)
    padded with -1 (M = most masks in one row), nsp_labels (B,) all 1.
    """
    _check_sizes(batch_size, seq_len, vocab_size, min_len=3)
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must be in [0, 1], got {mask_prob}")
    rng = np.random.default_rng(random_seed)
    length = seq_len - 2
    content = _counting_sentences(rng, batch_size, length, vocab_size)
    cls = np.full((batch_size, 1), CLS_ID)
    sep = np.full((batch_size, 1), SEP_ID)
    original = np.concatenate([cls, content, sep], axis=1).astype(np.int64)  # (B, T)

    chosen = rng.random((batch_size, length)) < mask_prob                   # (B, L) over content only
    empty = ~chosen.any(axis=1)                                             # guarantee one mask per row
    chosen[empty, rng.integers(0, length, size=int(empty.sum()))] = True
    # Stable argsort of "not chosen" lists each row's chosen positions first, in increasing order.
    counts = chosen.sum(axis=1)
    num_masked = int(counts.max())
    positions = np.argsort(~chosen, axis=1, kind="stable")[:, :num_masked] + 1  # +1 skips [CLS]
    valid = np.arange(num_masked) < counts[:, None]                         # (B, M)
    rows = np.arange(batch_size)[:, None]
    labels = np.where(valid, original[rows, positions], -1)

    # 80% [MASK], 10% random token, 10% unchanged. Padding slots point at unchosen positions and
    # write back their own token, so they change nothing.
    draw = rng.random((batch_size, num_masked))
    random_tokens = rng.integers(NUM_SPECIAL, vocab_size, size=(batch_size, num_masked))
    replacement = np.where(draw < 0.8, MASK_ID, np.where(draw < 0.9, random_tokens, original[rows, positions]))
    input_ids = original.copy()
    input_ids[rows, positions] = np.where(valid, replacement, original[rows, positions])
    return BertBatch(input_ids, np.zeros_like(input_ids), np.where(valid, positions, -1).astype(np.int64),
                     labels.astype(np.int64), np.ones(batch_size, dtype=np.int64))


def create_nsp_pair_batch(batch_size: int, seq_len: int, vocab_size: int, random_seed=None) -> BertBatch:
    """``[CLS] A [SEP] B [SEP]`` batch: B copies A (nsp label 1) or is random tokens (label 0).

    Both sentences have (seq_len - 3) // 2 tokens; when seq_len - 3 is odd the last token is [PAD]
    (segment 0). masked_positions and mlm_labels are (B, 1) of -1: nothing is masked.
    """
    _check_sizes(batch_size, seq_len, vocab_size, min_len=5)
    rng = np.random.default_rng(random_seed)
    length = (seq_len - 3) // 2
    sent_a = _counting_sentences(rng, batch_size, length, vocab_size)
    random_b = rng.integers(NUM_SPECIAL, vocab_size, size=(batch_size, length))
    nsp_labels = rng.integers(0, 2, size=batch_size)
    sent_b = np.where(nsp_labels[:, None] == 1, sent_a, random_b)
    cls = np.full((batch_size, 1), CLS_ID)
    sep = np.full((batch_size, 1), SEP_ID)
    pad = np.full((batch_size, seq_len - 3 - 2 * length), PAD_ID)
    input_ids = np.concatenate([cls, sent_a, sep, sent_b, sep, pad], axis=1).astype(np.int64)
    segment_ids = np.zeros_like(input_ids)
    segment_ids[:, length + 2: 2 * length + 3] = 1  # B and its closing [SEP]
    no_masks = np.full((batch_size, 1), -1, dtype=np.int64)
    return BertBatch(input_ids, segment_ids, no_masks, no_masks.copy(), nsp_labels.astype(np.int64))


def generate_synthetic_bert_batches(num_batches: int, batch_size: int, seq_len: int, vocab_size: int,
                                    mask_prob: float = 0.15, random_seed=None) -> list[BertBatch]:
    """``num_batches`` batches, each an MLM batch or an NSP pair batch with probability 1/2."""
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    rng = np.random.default_rng(random_seed)  # one stream: batch i depends only on the seed and i
    batches = []
    for _ in range(num_batches):
        if rng.random() < 0.5:
            batches.append(create_mlm_batch(batch_size, seq_len, vocab_size, mask_prob, random_seed=rng))
        else:
            batches.append(create_nsp_pair_batch(batch_size, seq_len, vocab_size, random_seed=rng))
    return batches
