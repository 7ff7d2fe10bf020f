"""Making writes survive a crash or power cut: what checkpoints, converted weights and results rely on. Every file
bertbench writes whole goes through atomic_output (write_atomically for data in memory); a directory of files
through write_directory_atomically; read_json reads what was written as JSON back, naming the file in an error."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bertbench.common.errors import UsageError


class WriteError(OSError):
    """A file that could not be written (a full disk, a file-size limit, a lost mount): the message names the file
    and what is kept. A runtime failure (exit status 1, bertbench.common.errors)."""


def write_failure(path: str, error: BaseException, kept: str) -> WriteError:
    """The one-line WriteError for `path`: why (the OS's words, or torch's first line) and what is kept."""
    reason = (
        error.strerror
        if isinstance(error, OSError) and error.strerror
        else (str(error).strip().splitlines() or [type(error).__name__])[0]
    )
    return WriteError(f"{path}: could not be written ({reason}); {kept}")


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file, or a directory's entries (so a rename into it is durable), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def temporary_path(path: str | os.PathLike) -> str:
    """A fresh name beside `path` for the file that will replace it: hidden, unique (two writers never share one)
    and ending in .tmp, so that is_temporary_name recognises it and listings of results pass over it."""
    directory, name = os.path.split(os.fspath(path))
    return os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")


def is_temporary_name(name: str) -> bool:
    """Whether a file name is one of temporary_path's (what a killed write leaves behind)."""
    return name.startswith(".") and name.endswith(".tmp")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path (temporary_path) for a writer that creates the file itself (torch.save, a profiler
    trace, an open() of its own): when the block ends, the file is fsynced, renamed over `path` and the rename
    fsynced, so readers and a crash see the old file or the whole new one; when the block raises (a signal too),
    the temporary file is removed and `path` is untouched."""
    path = os.fspath(path)
    temporary = temporary_path(path)
    try:
        yield temporary
        fsync_path(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
    fsync_path(os.path.dirname(path) or ".")


def write_atomically(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` (text as UTF-8 with \\n line ends, or bytes) through atomic_output; a failed write is a
    WriteError naming the file and saying what is kept."""
    path = os.fspath(path)
    try:
        with atomic_output(path) as temporary, open(temporary, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as error:
        kept = "the previous file is kept" if os.path.exists(path) else "nothing was written"
        raise write_failure(path, error, kept) from None


def move_files(moves: Iterable[tuple[str, str]]) -> None:
    """Move complete files (source, destination) into place, as a command publishes what it wrote in a temporary
    directory: each fsynced and renamed (making the destination's directory), then each directory whose entries
    changed fsynced, so that after a crash every moved file is whole where it appears."""
    directories = set()
    for source, destination in moves:
        directory = existing = os.path.dirname(os.path.abspath(destination))
        while not os.path.isdir(existing):  # made here: the directory holding it gains an entry too
            directories.add(existing)
            existing = os.path.dirname(existing)
        directories.add(existing)
        os.makedirs(directory, exist_ok=True)
        fsync_path(source)
        os.replace(source, destination)
    for directory in directories:
        fsync_path(directory)


def write_directory_atomically(out_dir: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Runs `write(tmp)` in a temporary directory beside `out_dir`, fsyncs its files, then swaps it in: out_dir is
    the complete new directory or the untouched old one (put back when the swap fails). Files and directory get
    the modes of a shared output (0644, 0755), not mkdtemp's 0700 or safetensors' 0600."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    parent, base = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    old = None
    try:
        os.chmod(tmp, 0o755)
        write(tmp)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
            fsync_path(os.path.join(tmp, name))
        fsync_path(tmp)
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.replace(out_dir, old)  # rename onto an empty directory replaces it
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if old is not None:
                os.replace(old, out_dir)
                old = None
            raise
        fsync_path(parent)
    finally:
        for leftover in (tmp, old):
            if leftover is not None and os.path.isdir(leftover):
                shutil.rmtree(leftover)


def read_json(path: str | os.PathLike, error: type[Exception] = UsageError) -> Any:
    """A JSON file's value; a file that is not JSON (or not UTF-8) is an `error` (a UsageError, or the reader's own
    input error) naming the file and the line or byte (an input error: exit status 2), a missing one the OSError
    naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.loads(handle.read())
    except json.JSONDecodeError as bad:
        raise error(f"{path}: not JSON ({bad.msg} at line {bad.lineno}, column {bad.colno})") from None
    except UnicodeDecodeError as bad:
        raise error(f"{path}: not JSON (not UTF-8 text: byte {bad.start})") from None
