"""What the command line prints when a command fails: one line, and an exit code.

    bert-kit pretrain: error: run.yaml:7: clip_grad=-1.0 is out of range: expected a finite number >= 0 ...

One exit-code rule for every command:

- 2: the command or its inputs are wrong, and rerunning it unchanged fails again: a bad flag or
  setting (`ConfigError`), an unknown key or choice, a missing, unreadable or malformed input
  file, config file or model folder (`InputNotFoundError`, ENOENT, EACCES), a bad line in a data
  file, a corrupt model or checkpoint (`CorruptFileError`), text that is not UTF-8, an input
  nested too deeply, an output location that cannot be used.
- 1: the run itself failed, or cannot run here: a non-finite loss, out of memory, a full disk or
  another I/O failure while writing, a failure of the distributed group, a missing optional
  package, an unexpected error (one line with a hint to rerun with `--debug`, or BERT_KIT_DEBUG=1,
  to see the traceback; please report it).
- 130 / 143: interrupted by SIGINT / SIGTERM (a training run continues with `--resume latest`).

`check_output_file` and `check_output_dir` let a command refuse an unusable output location
before any work is done, rather than failing when it writes its results.
"""

from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path, PurePath
from typing import Any, Iterable

from bert_kit import outputs
from bert_kit.checks import ConfigError

USAGE, FAILURE = 2, 1

# errno of a path that is wrong (exit 2); any other OS error is a failed run (exit 1): a full disk, EIO
WRONG_PATH = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EEXIST,
              errno.ENAMETOOLONG, errno.ELOOP, errno.EROFS}


def describe(exc: BaseException) -> tuple[int, str]:
    """(exit code, one-line message) for an exception that ended a command (the rule above)."""
    if isinstance(exc, ConfigError):  # also InputNotFoundError
        return USAGE, one_line(str(exc))
    if isinstance(exc, OSError) and exc.errno is not None:
        return (USAGE if exc.errno in WRONG_PATH else FAILURE), describe_os_error(exc)
    if isinstance(exc, OSError):  # raised with a message of ours ("model folder not found: ...")
        wrong = isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError))
        return (USAGE if wrong else FAILURE), one_line(str(exc))
    code = re.search(r"\(os error (\d+)\)", str(exc))  # an I/O error from Rust (tokenizers, safetensors)
    if code:
        error = OSError(int(code.group(1)), str(exc), _path_in_traceback(exc))
        return (USAGE if error.errno in WRONG_PATH else FAILURE), describe_os_error(error)
    if isinstance(exc, UnicodeDecodeError):
        where = _path_in_traceback(exc)
        return USAGE, (f"{where or 'an input file'} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                       "save it as UTF-8")
    if isinstance(exc, RecursionError):  # json.loads of [[[[...]]]]: the input, not the code
        return USAGE, ("an input is nested too deeply to read (a JSON or YAML value thousands of levels deep?): "
                       "rerun with --debug to see which file")
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return FAILURE, f"out of memory ({one_line(str(exc))[:200]}): lower batch_size or max_length"
    if isinstance(exc, KeyError):  # str(KeyError) is the repr of its argument; ours name the file and key
        return USAGE, one_line(str(exc.args[0]) if exc.args else "KeyError")
    if isinstance(exc, ValueError):  # a bad data file, a corrupt model (CorruptFileError)
        return USAGE, one_line(str(exc))
    if isinstance(exc, (LookupError, FloatingPointError, ImportError)) or type(exc).__name__ == "DistributedError":
        return FAILURE, one_line(str(exc))  # a non-finite loss; a rank that failed or timed out; a missing extra
    return FAILURE, (f"{type(exc).__name__}: {one_line(str(exc))} (unexpected: rerun with --debug to see the "
                     "traceback, and please report it)")


def describe_os_error(exc: OSError) -> str:
    """One line naming the file and what to do, by errno."""
    path = exc.filename or _path_in_traceback(exc)
    where = f"{path}" if path else "a file"
    code = exc.errno
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return (f"no space left on the device writing {where}: free some space or write elsewhere, then run "
                "again (a training run continues from its last complete checkpoint with --resume latest)")
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied: {where}: choose a location you may write to (or read), or fix its permissions"
    if code == errno.EROFS:
        return f"read-only file system: {where}: choose a writable location"
    if code == errno.EISDIR:
        return f"{where} is a folder: name a file"
    if code == errno.ENOTDIR:
        return f"{where}: a part of this path is a file, not a folder"
    if code == errno.EEXIST:
        return f"{where} already exists and is not a folder"
    if code == errno.ENOENT and not exc.filename and exc.args and isinstance(exc.args[0], str):
        return one_line(exc.args[0])  # our own message ("config file not found: ...")
    if code == errno.ENOENT:
        return f"no such file or folder: {where}"
    return f"{exc.strerror or one_line(str(exc))}: {where}"


def one_line(message: str) -> str:
    """Join a multi-line message (e.g. a list of mismatched weights) into one line."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return lines[0] + " " + "; ".join(lines[1:])


def _path_in_traceback(exc: BaseException) -> str | None:
    """The file a failed read or write was working on, when the error does not say: Python
    reports a full disk as OSError(ENOSPC) and a decode error without the file name. Looks, in
    the innermost frames first, for an open file object among the locals or held by `self`
    (e.g. a logger's file), or the Path whose pathlib method failed."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for name, value in frame.f_locals.items():
            if name == "self" and isinstance(value, PurePath):
                return str(value)
            held = list(vars(value).values()) if name == "self" and hasattr(value, "__dict__") else []
            for candidate in [value, *held]:
                if isinstance(candidate, io.IOBase) and isinstance(getattr(candidate, "name", None), str):
                    return candidate.name
    return None


# ---- output locations, checked before the work ---------------------------------------------------

def check_output_file(path: str | Path | None, flag: str, inputs: Iterable[str | Path | None] = ()) -> None:
    """Refuse an output file that is a folder, not a regular file (a device, FIFO or socket), one of
    the command's input files `inputs`, or lies under a file or an unwritable folder
    (`bert_kit.outputs` has the rule every command writes by)."""
    outputs.check_output_file(path, flag, inputs)


def check_output_dir(path: str | Path, key: str) -> None:
    """Refuse an output folder that is a file, lies under a file, or cannot be written."""
    outputs.check_output_dir(path, key)


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(--debug given or BERT_KIT_DEBUG set, argv without --debug)."""
    env = os.environ.get("BERT_KIT_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return env or "--debug" in argv, [a for a in argv if a != "--debug"]


def print_traceback(exc: BaseException, file: Any) -> None:
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__, file=file)
