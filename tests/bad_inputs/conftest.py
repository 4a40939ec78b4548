"""Helpers for the bad-input suite: run a `bert-kit` command and check what the user sees.

Every test here feeds one bad input (a setting, a file, a folder, an API argument, a full disk,
an interruption) and asserts the exact outcome: either the correct result, or a one-line error
that names the file (and line or key) at fault, with the documented exit code and no traceback.

`cli(*argv)` runs `bert_kit.cli.main` in this process (fast: torch is imported once); an
exception escaping `main` is what a user would see as a traceback, so it fails the test.
`cli_process(*argv)` runs `python -m bert_kit` as its own process, for the few checks that
need one (signals, exit codes seen by a shell).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        """Non-blank stderr lines that are not progress bars or warnings."""
        return [ln for ln in self.err.splitlines() if ln.strip() and "it/s]" not in ln and "Warning" not in ln]

    def one_line_error(self, *needles: str, code: int | None = None) -> str:
        """Assert the command failed with exactly one error line holding every needle; return it."""
        assert self.code != 0, f"expected a failure, got exit 0\nstdout: {self.out}\nstderr: {self.err}"
        if code is not None:
            assert self.code == code, f"exit {self.code}, expected {code}\nstderr: {self.err}"
        assert "Traceback" not in self.err, self.err
        errors = [ln for ln in self.error_lines if "error:" in ln]
        assert len(errors) == 1, f"expected one error line, got:\n{self.err}"
        for needle in needles:
            assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
        return errors[0]


@pytest.fixture()
def cli(capsys, monkeypatch, tmp_path):
    """cli(*argv) -> Outcome, running in tmp_path (the working directory of the command)."""
    from bert_kit.cli import main

    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> Outcome:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Outcome(int(code), captured.out, captured.err)

    return run


@pytest.fixture()
def cli_process(tmp_path):
    """cli_process(*argv, timeout=120) -> Outcome of `python -m bert_kit ARGV` run in tmp_path."""

    def run(*argv: str, timeout: float = 120) -> Outcome:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-m", "bert_kit", *map(str, argv)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=timeout)
        return Outcome(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    """Valid tiny inputs (corpus, tokenizer, model folders, run configs, a finished run) to break;
    see tests/bad_inputs/assets.py. Built once per session; copy before changing them."""
    from tests.bad_inputs.assets import build_assets

    with one_thread():
        return build_assets(tmp_path_factory.mktemp("assets"))


@contextmanager
def one_thread():
    """One torch thread: tiny models gain nothing from more on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture()
def single_thread():
    with one_thread():
        yield
