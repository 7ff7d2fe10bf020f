"""Making writes survive a crash or power cut: what checkpoints, converted weights and results rely on."""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file, or a directory's entries (so a rename into it is durable), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8, \\n line ends) so that readers, and a crash, see the old file or the whole new one:
    a temporary file beside it, fsynced, renamed over it; the temporary file never outlives a failure."""
    path = os.fspath(path)
    temporary = f"{path}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
