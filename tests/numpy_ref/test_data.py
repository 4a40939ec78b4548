"""Synthetic pretraining batches: the documented shapes and -1 padding, BERT masking, the NSP
copy/random pairs, reproducibility from ``random_seed`` and argument checks.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_data.py -q
"""

import numpy as np
import pytest

from bert_kit.numpy_ref import (CLS_ID, MASK_ID, PAD_ID, SEP_ID, create_mlm_batch, create_nsp_pair_batch,
                                generate_synthetic_bert_batches)


def test_mlm_batch_layout_and_labels():
    batch = create_mlm_batch(64, 12, 30, mask_prob=0.2, random_seed=0)
    input_ids, segment_ids, positions, labels, nsp_labels = batch  # unpacks as five arrays
    assert input_ids.shape == segment_ids.shape == (64, 12)
    assert positions.shape == labels.shape and positions.shape[0] == 64
    np.testing.assert_array_equal(input_ids[:, 0], CLS_ID)
    np.testing.assert_array_equal(input_ids[:, -1], SEP_ID)
    np.testing.assert_array_equal(segment_ids, 0)
    np.testing.assert_array_equal(nsp_labels, 1)
    assert not batch.is_pair
    valid = positions >= 0
    assert valid.any(axis=1).all(), "every sequence has at least one masked token"
    np.testing.assert_array_equal(labels[~valid], -1)
    assert (positions[valid] >= 1).all() and (positions[valid] <= 10).all()  # never [CLS]/[SEP]
    # Positions are increasing and unique within a row; padding comes last.
    for row_pos, row_valid in zip(positions, valid):
        real = row_pos[row_valid]
        assert (np.diff(real) > 0).all() and not row_valid[len(real):].any()
    # Labels are the original tokens: the content counts up by one from any position left untouched.
    for ids, row_pos, row_labels in zip(input_ids, positions, labels):
        real = row_pos[row_pos >= 0]
        anchor = next(p for p in range(1, 11) if p not in real)
        original = 4 + (ids[anchor] - 4 + np.arange(1, 11) - anchor) % 26  # positions 1..10
        np.testing.assert_array_equal(row_labels[row_pos >= 0], original[real - 1])
        np.testing.assert_array_equal(np.delete(ids[1:11], real - 1), np.delete(original, real - 1))


def test_masking_follows_80_10_10():
    batch = create_mlm_batch(2000, 20, 50, mask_prob=0.15, random_seed=1)
    valid = batch.masked_positions >= 0
    rows = np.nonzero(valid)[0]
    at_masked = batch.input_ids[rows, batch.masked_positions[valid]]
    original = batch.mlm_labels[valid]
    frac_mask = np.mean(at_masked == MASK_ID)
    frac_kept = np.mean(at_masked == original)
    assert abs(frac_mask - 0.8) < 0.02
    assert abs(frac_kept - 0.1 - 0.1 / 46) < 0.02  # 10% kept, plus random draws that hit the original
    assert abs(valid.sum() / (2000 * 18) - 0.15) < 0.01
    # Outside the masked positions nothing is changed.
    assert MASK_ID not in np.delete(batch.input_ids.ravel(),
                                    np.ravel_multi_index((rows, batch.masked_positions[valid]), batch.input_ids.shape))


@pytest.mark.parametrize("seq_len", [15, 16])
def test_nsp_pair_batch(seq_len):
    batch = create_nsp_pair_batch(200, seq_len, 30, random_seed=2)
    length = (seq_len - 3) // 2
    ids, seg = batch.input_ids, batch.segment_ids
    assert ids.shape == (200, seq_len) and batch.is_pair
    np.testing.assert_array_equal(ids[:, [0, length + 1, 2 * length + 2]], [[CLS_ID, SEP_ID, SEP_ID]] * 200)
    np.testing.assert_array_equal(seg[:, : length + 2], 0)
    np.testing.assert_array_equal(seg[:, length + 2: 2 * length + 3], 1)
    if seq_len - 3 > 2 * length:
        np.testing.assert_array_equal(ids[:, -1], PAD_ID)
    np.testing.assert_array_equal(batch.masked_positions, -1)
    np.testing.assert_array_equal(batch.mlm_labels, -1)
    same = (ids[:, 1: length + 1] == ids[:, length + 2: 2 * length + 2]).all(axis=1)
    np.testing.assert_array_equal(same[batch.nsp_labels == 1], True)
    assert not same[batch.nsp_labels == 0].any()
    assert 0.35 < batch.nsp_labels.mean() < 0.65


def test_generate_is_reproducible_and_mixes_both_kinds():
    a = generate_synthetic_bert_batches(20, 4, 11, 30, random_seed=7)
    b = generate_synthetic_bert_batches(20, 4, 11, 30, random_seed=7)
    c = generate_synthetic_bert_batches(20, 4, 11, 30, random_seed=8)
    assert len(a) == 20
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(x.input_ids, y.input_ids) for x, y in zip(a, c))
    kinds = [batch.is_pair for batch in a]
    assert 0 < sum(kinds) < 20
    np.testing.assert_array_equal(create_mlm_batch(3, 8, 20, random_seed=5).input_ids,
                                  create_mlm_batch(3, 8, 20, random_seed=5).input_ids)


def test_data_argument_errors():
    with pytest.raises(ValueError, match="vocab_size must exceed the 4 special tokens"):
        create_mlm_batch(2, 8, 4)
    with pytest.raises(ValueError, match="seq_len must be >= 5"):
        create_nsp_pair_batch(2, 4, 20)
    with pytest.raises(ValueError, match=r"mask_prob must be in \[0, 1\]"):
        create_mlm_batch(2, 8, 20, mask_prob=1.5)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        create_mlm_batch(0, 8, 20)
