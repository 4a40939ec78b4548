"""The commands share a busy machine's cores: short OpenMP spins, a training pool sized to the free cores,
BERT_KIT_THREADS to fix the pools.

How much this matters is measured by benchmarks/cpu_sharing.py (a timing, so not a test here)."""

import os
import subprocess
import sys

import pytest

from bert_kit.cli import main
from bert_kit.threads import CoreShare, configured_threads, share_cores, spinning

PROBE = ("import os; from bert_kit.threads import share_cores; share_cores(); import torch; "
         "print(torch.get_num_threads(), os.environ['GOMP_SPINCOUNT'], os.environ.get('RAYON_NUM_THREADS'))")


def probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_NUM_THREADS", "BERT_KIT_THREADS",
                                                              "RAYON_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_command_process_spins_its_waiting_threads_briefly_and_takes_every_core_by_default():
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "BERT_KIT_THREADS")}
    torch_default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=clean,
                                   capture_output=True, text=True, check=True).stdout.strip()
    assert probe() == [torch_default, "10000", "None"]


def test_bert_kit_threads_caps_torch_and_the_tokenizer_and_a_users_spin_count_is_kept():
    assert probe(BERT_KIT_THREADS="1", GOMP_SPINCOUNT="300000") == ["1", "300000", "1"]


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "inf"])
def test_a_bad_thread_count_is_a_one_line_error_naming_the_variable(value, monkeypatch, capsys):
    monkeypatch.setenv("BERT_KIT_THREADS", value)
    with pytest.raises(Exception, match="BERT_KIT_THREADS"):
        configured_threads()
    assert main(["models"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "BERT_KIT_THREADS" in err and "positive number of threads" in err


def test_share_cores_in_process_sets_the_spin_count_only_where_unset(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("BERT_KIT_THREADS", raising=False)
    share_cores()
    assert os.environ["GOMP_SPINCOUNT"] == "10000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    share_cores()
    assert os.environ["GOMP_SPINCOUNT"] == "5"


def test_onnx_runtime_spins_unless_every_pool_is_told_to_sleep(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert spinning()
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert not spinning()


def test_core_share_gives_torch_the_cores_other_work_leaves(monkeypatch):
    import torch

    share = CoreShare(interval=0.0)
    share.cores, share.most, share.enabled, share.last = [0, 1, 2, 3], 4, True, (0.0, 0.0, 0.0)
    # (clock, seconds the 4 cores were busy, seconds this process computed), 2 s apart
    readings = iter([(2.0, 8.0, 2.0),     # others busy 3 cores' worth -> 1 thread
                     (4.0, 12.0, 6.0),    # only this process -> every core
                     (6.0, 18.0, 8.0),    # others 2 cores -> 2 threads
                     (8.0, 26.0, 8.0)])   # others 4 cores (more than there are) -> still 1
    monkeypatch.setattr(share, "read", lambda: next(readings))
    pool = [0]  # the pool's sizes, last is current (0: none set yet)
    monkeypatch.setattr(torch, "set_num_threads", pool.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: pool[-1])
    for _ in range(4):
        share.adjust()
    assert pool[1:] == [1, 4, 2, 1]


def test_core_share_is_off_with_a_fixed_thread_count(monkeypatch):
    monkeypatch.setenv("BERT_KIT_THREADS", "2")
    assert not CoreShare().enabled


def test_core_share_never_grows_the_pool_past_what_it_had_alone(monkeypatch):
    import torch

    share = CoreShare(interval=0.0)
    share.cores, share.most, share.enabled, share.last = list(range(8)), 4, True, (0.0, 0.0, 0.0)
    monkeypatch.setattr(share, "read", lambda: (2.0, 8.0, 8.0))  # 8 logical cores, only this process busy
    pool = [2]
    monkeypatch.setattr(torch, "set_num_threads", pool.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: pool[-1])
    share.adjust()
    assert pool == [2, 4]  # back to the 4 threads of a physical core each, not 8
