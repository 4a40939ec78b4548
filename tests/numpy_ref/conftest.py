"""Shared set-up of the NumPy engine tests: one BLAS thread (steady timings on a shared 2-core
machine; OpenBLAS threads fight over the cores and slow small matmuls down several times)."""

import pytest

from bert_kit.numpy_ref.runner import blas_threads


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    with blas_threads(1):
        yield
