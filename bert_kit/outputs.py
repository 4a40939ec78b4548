"""Where bert-kit writes, and the rule it writes by: it replaces or deletes only what it wrote itself.

Output files (`predict`, `embed`, `evaluate`, `plot`, `attention`, the `--output` of `pretrain` and
`finetune`) follow one rule, checked by `check_output_file` before any work:
* a symbolic link is written through: the file it points to gets the new content, the link stays;
* an existing output that is not a regular file (a device such as /dev/full, a FIFO, a socket, a
  terminal behind /dev/stdout) is refused: bert-kit never replaces one with a file of its own;
* an output that is one of the command's input files (the same file once links are resolved) is
  refused;
* `write_file` writes the whole file beside its target and renames it over the target (a crash
  leaves the old file or none, never half of one), with the mode of the file it replaces, else the
  mode the umask gives a new file (0644 under umask 022).

Output folders (run folders, the model folders best/, final/ and checkpoints, exports, `convert`
and `tokenizer train` outputs) hold a record, `.bert-kit-files.json`, of the files and folders
bert-kit wrote there:

    {"written_by": "bert-kit export", "files": ["config.json", "model.onnx", "tokenizer.json", ...]}

A later command deletes or replaces only what the record lists; anything else in the folder is the
user's, and a command that would have to replace it stops and names it (`OutputFolder`). Deleting
never follows a symbolic link: a recorded link is removed, not what it points to.

A run folder also holds `.bert-kit.lock`: `FolderLock` takes an exclusive `flock` on it for the
run's lifetime (the OS releases it when the process ends, crashed or killed), so a second run
into the same folder stops at once, naming the process that holds it.

Imports without torch.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from bert_kit.checks import ConfigError, writing

RECORD = ".bert-kit-files.json"  # the files and folders bert-kit wrote in a folder
LOCK = ".bert-kit.lock"  # a run folder's lock: holds the pid of the run that has it
OWN = (RECORD, LOCK)  # bookkeeping: never a user's file, never listed in a record

PathLike = str | os.PathLike


# ---- output files ---------------------------------------------------------------------------------

def default_mode() -> int:
    """The mode a new file gets from this process's umask (0o644 under umask 022)."""
    try:  # Linux says it without changing it (os.umask would, for every thread, for an instant)
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _same_file(output: Path, source: Path) -> bool:
    """Whether writing `output` would replace the file `source` (links resolved, hard links too)."""
    try:
        return source.is_file() and os.path.samefile(output, source)
    except OSError:
        return False


def check_output_file(path: PathLike | None, flag: str, inputs: Iterable[PathLike | None] = ()) -> None:
    """Refuse an output file that cannot be written by the rule above, before any work: a folder,
    something that is not a regular file, one of the command's input files `inputs`, or a path
    under a file or an unwritable folder. Raises ConfigError (exit code 2)."""
    if path is None:
        return
    path = Path(path)
    try:
        info = os.stat(path)  # follows links, also /dev/stdout's to a pipe or terminal
    except (FileNotFoundError, NotADirectoryError):
        info = None  # a new file, or a link to one (written where it points); a path under a file: below
    except OSError as e:
        raise ConfigError(f"{flag} {path}: {e.strerror}: choose another output file") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{flag} {path} is a folder: name a file to write")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{flag} {path} is {_kind(info.st_mode)}, not a regular file: bert-kit writes only "
                          "regular files (it never replaces a device, FIFO or socket); name a file")
    if info is not None:
        for source in inputs:
            if source is not None and str(source) and _same_file(path, Path(source)):
                raise ConfigError(f"{flag} {path} is the input file {source}: writing it would destroy that input; "
                                  "choose another output file")
    target = Path(os.path.realpath(path))
    check_writable(target.parent, flag, path)


def check_output_dir(path: PathLike, key: str) -> None:
    """Refuse an output folder that is a file, lies under a file, or cannot be written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={path} is a file, not a folder: choose another {key}")
    check_writable(path, key, path)


def check_writable(folder: Path, key: str, target: Path) -> None:
    """The nearest existing folder on the way to `folder` must be a folder we can create files in."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key} {target}: {existing} is a file, not a folder")
    try:  # a real write: permission bits say nothing for root, or on a read-only mount
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        raise ConfigError(f"{key} {target}: cannot write in {existing} ({reason}): "
                          "choose a writable location") from None


def write_file(path: PathLike, write: Callable[[IO[Any]], Any], binary: bool = False) -> Path:
    """Call `write(f)` on a temporary file beside the target, then rename it over the target: the
    file `path` points to when it is a link (the link stays). A failed write names `path` and
    leaves the old file as it was. Returns the file written."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)  # keep the mode of the file replaced
    except OSError:
        mode = default_mode()  # mkstemp's 0600 is for secrets, not for results
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, mode)
        with writing(path), open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return target


def write_text(path: PathLike, text: str) -> Path:
    """`write_file` of a text (UTF-8)."""
    return write_file(path, lambda f: f.write(text))


# ---- output folders and their record ---------------------------------------------------------------

def read_record(folder: PathLike, written_by: str | None = None) -> list[str] | None:
    """The names a folder's record lists, or None when it has none. A record that cannot be read,
    or (given `written_by`) that another command wrote, lists nothing of ours."""
    record = _record(folder)
    if record is None:
        return None
    files = record.get("files")
    if not isinstance(files, list) or (written_by is not None and record.get("written_by") != written_by):
        return []
    return [f for f in files if _plain_name(f)]


def _record(folder: PathLike) -> dict | None:
    path = Path(folder) / RECORD
    if not os.path.lexists(path):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _plain_name(name: Any) -> bool:
    """A record lists entries of its own folder only: no paths, nothing that leaves the folder."""
    return isinstance(name, str) and name not in ("", ".", "..", *OWN) and "/" not in name and "\\" not in name


def write_record(folder: PathLike, names: Iterable[str], written_by: str, merge: bool = False) -> None:
    """Record `names` (entries of `folder`) as written by bert-kit; merge: keep what is listed already."""
    names = set(names)
    if merge:
        names |= set(read_record(folder) or [])
    record = {"written_by": written_by, "files": sorted(n for n in names if _plain_name(n))}
    write_text(Path(folder) / RECORD, json.dumps(record, indent=2) + "\n")


def entries(folder: PathLike) -> list[str]:
    """Names in `folder` other than bert-kit's bookkeeping files (none for a folder that does not exist)."""
    folder = Path(folder)
    return sorted(n for n in os.listdir(folder) if n not in OWN) if folder.is_dir() else []


def remove_entry(path: PathLike) -> None:
    """Delete a file, a folder tree or a symbolic link (the link itself, never what it points to)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)  # does not follow links inside the tree either


def inside(path: PathLike, folder: PathLike) -> bool:
    """Whether deleting `folder` would delete `path`: as written, or, unless `folder` is a link
    (deleting a link removes only the link), once links are resolved."""
    if Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder)):
        return True
    return not os.path.islink(folder) and Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


class OutputFolder:
    """A folder a command fills, which may hold only what bert-kit wrote there before.

        out = OutputFolder(args.output, "--output", "bert-kit convert")   # checked before the work
        ... the work ...
        out.prepare()                       # recorded links of an earlier write removed
        ... write files into out.path ...
        out.commit(["config.json", ...])    # earlier recorded entries not written again removed; recorded

    Only what an earlier run of the same command (`written_by`) recorded may be replaced. legacy:
    the names a folder that command wrote before records existed holds (when it has no record).
    """

    def __init__(self, path: PathLike, key: str, written_by: str, legacy: Iterable[str] = ()) -> None:
        self.path, self.key, self.written_by = Path(path), key, written_by
        check_output_dir(self.path, key)
        record = read_record(self.path, written_by)
        ours = set(legacy if record is None else record)
        present = entries(self.path)
        theirs = [n for n in present if n not in ours]
        if theirs:
            shown = ", ".join(theirs[:8]) + (f" and {len(theirs) - 8} more" if len(theirs) > 8 else "")
            other = (_record(self.path) or {}).get("written_by")
            by = f"; {other} wrote them" if isinstance(other, str) and other != written_by and record == [] else ""
            raise ConfigError(f"{key} {self.path} holds files that no earlier {written_by} wrote there ({shown}{by}): "
                              f"choose a new or empty folder ({written_by} replaces only what it wrote itself)")
        self.previous = [n for n in present if n in ours]

    def prepare(self) -> Path:
        """Create the folder; remove the earlier write's links, so that no write goes through one
        into a file elsewhere. Returns the folder."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in self.previous:
            if (self.path / name).is_symlink():
                (self.path / name).unlink()
        return self.path

    def commit(self, written: Iterable[str]) -> None:
        """Remove what the earlier write recorded and this one did not write again; record `written`."""
        written = set(written)
        for name in self.previous:
            if name not in written:
                remove_entry(self.path / name)
        write_record(self.path, written, self.written_by)


# ---- one run at a time ---------------------------------------------------------------------------

class FolderBusyError(ConfigError):
    """Another process holds the folder's lock."""


class FolderLock:
    """An exclusive lock on a run folder for one process at a time (`flock` on FOLDER/.bert-kit.lock,
    which holds the pid). Released by `release`, or by the OS when the process ends in any way.

    A folder that the run left holding nothing but its bookkeeping (it failed before writing
    anything) is removed again on release, when this lock created it."""

    def __init__(self, folder: PathLike) -> None:
        self.folder = Path(folder)
        self.fd: int | None = None
        self.created = False

    def acquire(self) -> "FolderLock":
        try:
            import fcntl
        except ImportError:  # not a POSIX system: runs are not locked there
            return self
        self.created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, default_mode())
            except FileNotFoundError:  # the folder was removed by a run that left it empty: again
                self.folder.mkdir(parents=True, exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    print(f"warning: cannot lock {path} ({e.strerror}): a second run started into {self.folder} "
                          "would not be stopped", file=sys.stderr, flush=True)
                    return self
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise FolderBusyError(f"{self.folder} is in use by another run (pid {self._holder(path)}, which holds "
                                      f"{path}): wait for it to end, or choose another output_dir") from None
            try:  # a holder that released it may have removed the file meanwhile: lock the one in place
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    @staticmethod
    def _holder(path: Path) -> str:
        try:
            return path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if not entries(self.folder) and not [n for n in (read_record(self.folder) or [])
                                                 if os.path.lexists(self.folder / n)]:
                (self.folder / RECORD).unlink(missing_ok=True)  # a record of nothing
                (self.folder / LOCK).unlink(missing_ok=True)
                if self.created:
                    self.folder.rmdir()
        except OSError:
            pass  # a folder someone wrote into meanwhile stays as it is
        finally:
            os.close(self.fd)  # releases the lock
            self.fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# ---- stop signals while a folder is built ----------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT while a folder is built (an export), raised where the work is, so that it
    cleans up."""

    def __init__(self, signum: int, finished: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.finished = signum, finished  # finished: it came as the export was done


class StopSignals:
    """While active (in the main thread), SIGTERM and SIGINT raise `Interrupted`. After `hold()`
    (cleaning up) a signal waits: it is raised when the block ends."""

    def __enter__(self) -> "StopSignals":
        self.signum, self.holding, self._previous = None, False, {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first and not self.holding:
            self.holding = True
            raise Interrupted(signum)

    def hold(self) -> None:
        self.holding = True

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if exc_type is None and self.signum is not None:
            raise Interrupted(self.signum, finished=True)
