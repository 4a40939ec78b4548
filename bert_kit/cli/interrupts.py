"""Ctrl-C (SIGINT) and SIGTERM at any moment of a command: one line, exit 130 / 143.

Python raises KeyboardInterrupt wherever the main thread happens to be. While a command starts
that is inside an import most of the time (torch and numpy take most of a second), where it can
leave a library half-imported (numpy without numpy.matrix: the command then failed with "numpy
has no attribute 'matrix'"), be swallowed by one (the command ran on and exited 0), or reach C++
code that aborts on it. So the bert-kit command installs `handle` first thing (`install`):

- a signal that arrives inside an import, or before the command line is ready to catch it (the
  imports of bert_kit.cli), ends the process at once, with one line: nothing has been written
  yet, and nothing half-imported is left to run;
- anywhere else SIGINT raises KeyboardInterrupt, as Python's own handler does, and SIGTERM raises
  `Terminated` (a KeyboardInterrupt too, so the same clean-up runs); the command line reports
  either in one line (`bert_kit.cli.run_command`).

Once a command's own work begins, SIGTERM goes back to ending the process at once (`started`),
as it always has: a Python handler would wait for a long call in Rust or C++ (training a
tokenizer) to return. `serve` keeps it through loading its model and workers. Commands that stop
gracefully (training, serving) install their own handlers while they run.
"""

from __future__ import annotations

import os  # builtins only: this module is imported before anything else, while a signal may come
import signal
import sys
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command stands as KeyboardInterrupt is for Ctrl-C (exit 143)."""


def command_name() -> str:
    """The subcommand on this process's command line ("" before there is one)."""
    return next((a for a in sys.argv[1:] if not a.startswith("-")), "")


def runs_as_command() -> bool:
    """Whether this process runs the bert-kit command line (the `bert-kit` script, or `python -m
    bert_kit`), rather than a program that imports bert-kit."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == "bert_kit.__main__" or \
        os.path.basename(getattr(main, "__file__", None) or "") == "bert-kit"


def handle(signum: int, frame: Any) -> None:
    """The command's SIGINT / SIGTERM handler (see the module docstring)."""
    inside_import = False
    while frame is not None and not inside_import:
        inside_import = frame.f_code.co_filename.startswith("<frozen importlib")
        frame = frame.f_back
    if inside_import or not _caught:
        command = command_name()
        what = "terminated" if signum == signal.SIGTERM else "interrupted"
        os.write(2, f"bert-kit{' ' + command if command else ''}: {what}\n".encode())
        os._exit(128 + signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()


_caught = False  # whether the command line catches KeyboardInterrupt now (`caught`)


class caught:
    """Inside, the command line catches KeyboardInterrupt and Terminated; outside (before the
    command starts, after it ended) `handle` ends the process at once."""

    def __enter__(self) -> None:
        global _caught
        self.before, _caught = _caught, True

    def __exit__(self, *exc: Any) -> None:
        global _caught
        _caught = self.before


def install() -> None:
    """`handle` for SIGINT and SIGTERM (idempotent)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, handle)


def started(keep_sigterm: bool) -> None:
    """The command's own work begins: SIGTERM ends the process at once again, unless `keep_sigterm`."""
    if not keep_sigterm and signal.getsignal(signal.SIGTERM) is handle:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
