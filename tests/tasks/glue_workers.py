"""A stand-in for a GLUE run, imported by the worker processes of `run_all` in tests/tasks/test_glue.py
(so it imports nothing heavy): it says which process and GPU ran it, fails or kills its process
when the run's id asks for it."""

from __future__ import annotations

import os
import time


def fake_execute(run: dict, device: str) -> dict:
    print(f"running {run['id']} on {device}", flush=True)  # to the run's log when there are several GPUs
    if run["task"] == "fails":
        raise ValueError(f"{run['id']}: a bad data file")
    if run["task"] == "dies":
        time.sleep(0.5)  # the other worker takes the runs left meanwhile
        os._exit(3)
    time.sleep(0.2)
    return {"task": run["task"], "metrics": {"accuracy": 50.0}, "device": device,
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
