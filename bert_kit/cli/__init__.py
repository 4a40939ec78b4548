"""The `bert-kit` command line: one dict from subcommand to the module that implements it.

Each module named in COMMANDS defines `add_arguments(parser)` and `run(args) -> int`; modules
are imported only when their subcommand runs (and to build `--help`), so start-up stays quick.

After the subcommand, options, positional arguments and `key=value` overrides may come in any
order (`bert-kit finetune --config run.yaml --output r.json lr=1e-4`).

A failing command prints one line, `bert-kit COMMAND: error: ...`, naming the file (and line or
key, or the setting) at fault and what to do. Exit codes, one rule for every command
(`bert_kit.cli.errors`): 2 when the command or its inputs are wrong (a bad flag or setting, an
unknown command, a missing, unreadable or malformed input file or model folder, a bad data file,
a corrupt model, text that is not UTF-8); 1 when the run itself failed (a non-finite loss, out of
memory, a full disk or another I/O failure while writing, a failure of the distributed group, an
unexpected error); 130 / 143 when interrupted (SIGINT / SIGTERM).
`--debug` (anywhere on the line) or BERT_KIT_DEBUG=1 also prints the traceback.
Waiting threads spin only briefly, and BERT_KIT_THREADS=N fixes every thread pool, so that
commands share a busy machine's cores (`bert_kit.threads`).
A command run as the process's own command line ends the process as soon as it is done
(`exit_now`), rather than letting Python free torch and the run's objects one by one.
"""

from __future__ import annotations

from bert_kit.cli import interrupts

if interrupts.runs_as_command():  # first: Ctrl-C while the imports below run ends the command cleanly
    interrupts.install()

import argparse  # noqa: E402
import atexit  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from importlib import import_module  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402

from bert_kit.checks import suggestion  # noqa: E402
from bert_kit.cli.errors import debug_requested, describe, one_line, print_traceback  # noqa: E402
from bert_kit.threads import share_cores  # noqa: E402

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("bert_kit.cli.demo", "whole pipeline on built-in text, no download: tokenizer, pretraining, fine-tuning"),
    "pretrain": ("bert_kit.cli.pretrain", "MLM (+NSP) pretraining from a YAML run config"),
    "finetune": ("bert_kit.cli.finetune", "fine-tune on classification, token-classification, qa, similarity, "
                 "embedding or reranker"),
    "tune": ("bert_kit.cli.tune", "hyperparameter search over a config's search: block, with Optuna (the [search] extra)"),
    "glue": ("bert_kit.cli.glue", "fine-tune and score a model on every GLUE task, with the GLUE score"),
    "evaluate": ("bert_kit.cli.evaluate", "evaluate a model folder on a task's data file"),
    "predict": ("bert_kit.cli.predict", "run a fine-tuned model over a file, JSONL out"),
    "embed": ("bert_kit.cli.embed", "sentence embeddings of a text file (one text per line) to .npy"),
    "mine-negatives": ("bert_kit.cli.mine_negatives", "hard negatives for (query, positive) pairs, as triplets"),
    "fill-mask": ("bert_kit.cli.fill_mask", "top-k predictions for [MASK] tokens in a text"),
    "attention": ("bert_kit.cli.attention", "PNG grid of every layer's and head's attention map"),
    "tokenizer": ("bert_kit.cli.tokenizer", "train a WordPiece vocabulary on text files"),
    "convert": ("bert_kit.cli.convert", "import/export HF checkpoints (safetensors or pytorch_model.bin)"),
    "merge": ("bert_kit.cli.merge", "merge a LoRA adapter into its base model: a plain model folder"),
    "export": ("bert_kit.cli.export", "export a model folder to ONNX (any head, optional int8) for CPU inference"),
    "plot": ("bert_kit.cli.plot", "draw the loss curve of a run folder's metrics.jsonl"),
    "serve": ("bert_kit.cli.serve", "a model folder behind HTTP with dynamic batching (needs the [serve] extra)"),
    "models": ("bert_kit.cli.models", "list the model presets and the local copies of hub models"),
}
# commands whose run turns SIGTERM into `Terminated` (one line, 143); the others die of it at once
# (`interrupts.started`). serve: while it loads the model and starts its workers, then it drains.
SIGTERM_RAISES = ("serve",)


def version() -> str:
    """`bert-kit --version`: this package's version, with torch's and Python's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from bert_kit import __version__

    try:
        torch = installed("torch")
    except PackageNotFoundError:
        torch = "not installed"
    return f"bert-kit {__version__} (torch {torch}, Python {sys.version.split()[0]})"


class VersionAction(argparse.Action):
    """--version: print `version()` and exit. Found when asked only: it reads the installed
    packages' metadata (~50 ms of every command's start-up if built with the parser)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version of bert-kit, torch and Python, and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> NoReturn:
        print(version())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" error also names the nearest choice
    (`--task clasification` -> did you mean 'classification'?); its subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        found = re.match(r"argument (\S+): invalid choice: '?(.*?)'? \(choose from (.*)\)$", message)
        if found:  # choices are quoted up to Python 3.12, plain from 3.12.8 on
            choices = [c.strip().strip("'") for c in found.group(3).split(", ")]
            hint = suggestion(found.group(2), choices)
            message += f"; {hint}" if hint else ""
        super().error(message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, import just that subcommand's module ("" imports none, which
    is all that --help, --version and the list of commands need: they start without torch)."""
    parser = Parser(prog="bert-kit", description="Pretrain, fine-tune and evaluate BERT models.")
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (or set BERT_KIT_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            try:
                import_module(module).add_arguments(p)
            except ModuleNotFoundError as e:
                if e.name != module:
                    raise
    parser.command_parsers = sub.choices  # name -> subcommand parser, for parse_arguments
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse `argv`; after the subcommand, options and positionals (overrides) may be intermixed.

    argparse's plain parse stops filling a positional list at the first option, so
    `--output r.json lr=1e-4` would be refused; its intermixed parse takes them in any order
    but cannot handle nested subcommands (`bert-kit tokenizer train`), which parse as usual."""
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    command = argv[at] if at is not None else None
    if command is not None and command not in COMMANDS:
        hint = suggestion(command, COMMANDS, quote=False)
        parser.error(f"unknown command {command!r}{f' ({hint})' if hint else ''}; `bert-kit --help` lists the commands")
    if command is None:
        return parser.parse_args(argv)  # help, --version
    parser.parse_args(argv[:at])  # options before the command: --help, --version
    sub = parser.command_parsers[command]
    nested = any(a.nargs in (argparse.PARSER, argparse.REMAINDER) for a in sub._actions)
    args = sub.parse_args(argv[at + 1:]) if nested else sub.parse_intermixed_args(argv[at + 1:])
    args.command = command
    return args


def process_started() -> float:
    """time.time() at this process's launch (Linux: from /proc; elsewhere: now), so that a time budget
    counts the interpreter's and torch's start-up as well."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: start time
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # both on the clock since boot
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def observed() -> bool:
    """Whether a tracer, profiler, debugger or coverage tool watches this process: the old hooks
    (`sys.settrace`, `sys.setprofile`) or, from Python 3.12, a `sys.monitoring` tool (cProfile's)."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))


def exit_now(code: int) -> None:
    """End this process with exit status `code` at once. Tearing the interpreter down after a
    command frees torch's modules and the command's objects one by one: about a second, after
    every output was written. What a normal exit does that matters is done first: the atexit
    handlers (temporary folders, logging, child processes, the process group) and flushing
    stdout and stderr. Returns, for a normal exit, under a tracer or profiler (they write their
    results at exit), in an interactive session, or while a thread other than daemons runs."""
    if observed() or sys.flags.interactive:
        return
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
        return
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        atexit._run_exitfuncs()  # and forgets them: a normal exit after this runs none twice
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # noqa: BLE001 (e.g. a closed pipe: the normal exit reports it as Python does)
        return
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Without `argv` it is this process's command line: the command's clock
    (a time budget) starts at the process's launch, SIGINT and SIGTERM end it in one line at any
    moment (`interrupts`), and the process ends with the command (`exit_now`). With `argv` (a call
    from Python), the clock starts at this call, the caller's signal handlers stay, and the exit
    status is returned."""
    if argv is None:
        interrupts.install()
    code = run_command(argv)
    if argv is None:
        exit_now(code)
    return code


def run_command(argv: list[str] | None) -> int:
    """The command of `main`; its exit status (130 / 143 when interrupted, at any moment)."""
    given = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        with interrupts.caught():
            return _run(argv, given)
    except KeyboardInterrupt as e:  # Terminated too (SIGTERM)
        return _interrupted(next((a for a in given if not a.startswith("-")), ""), e)


def _run(argv: list[str] | None, given: list[str]) -> int:
    started = process_started() if argv is None else time.time()
    debug, argv = debug_requested(given)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=wanted if wanted in COMMANDS else "")
    try:
        args = parse_arguments(parser, argv)
    except SystemExit as e:  # argparse has printed the usage error (exit 2), --help or --version (exit 0)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    args.started = started
    try:
        with warnings.catch_warnings():  # a warning is one line too, not Python's two with a source line
            warnings.showwarning = lambda message, *_, **__: print(
                f"bert-kit {args.command}: warning: {one_line(str(message))}", file=sys.stderr)
            share_cores()  # before torch starts its threads
            module = import_module(COMMANDS[args.command][0])
            interrupts.started(keep_sigterm=args.command in SIGTERM_RAISES)
            return int(module.run(args) or 0)
    except Exception as e:  # one line instead of a traceback (unless asked for)
        code, message = describe(e)
        if debug:
            print_traceback(e, sys.stderr)
        print(f"bert-kit {args.command}: error: {message}", file=sys.stderr)
        return code


def _interrupted(command: str, e: KeyboardInterrupt) -> int:
    """One line for Ctrl-C (130) or SIGTERM (143)."""
    terminated = isinstance(e, interrupts.Terminated)
    print(f"bert-kit{' ' + command if command else ''}: {'terminated' if terminated else 'interrupted'}",
          file=sys.stderr)
    return 143 if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
