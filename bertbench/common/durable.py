"""Making writes survive a crash or power cut: what checkpoints, converted weights and results rely on."""

from __future__ import annotations

import os


class WriteError(OSError):
    """A file that could not be written (a full disk, a file-size limit, a lost mount): the message names the file
    and what is kept. A runtime failure (exit status 1, bertbench.common.errors)."""


def write_failure(path: str, error: BaseException, kept: str) -> WriteError:
    """The one-line WriteError for `path`: why (the OS's words, or torch's first line) and what is kept."""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else \
        (str(error).strip().splitlines() or [type(error).__name__])[0]
    return WriteError(f"{path}: could not be written ({reason}); {kept}")


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file, or a directory's entries (so a rename into it is durable), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8, \\n line ends) so that readers, and a crash, see the old file or the whole new one:
    a temporary file beside it, fsynced, renamed over it; the temporary file never outlives a failure, and a failed
    write is a WriteError naming the file."""
    path = os.fspath(path)
    temporary = f"{path}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        kept = "the previous file is kept" if os.path.exists(path) else "nothing was written"
        raise write_failure(path, error, kept) from None
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
