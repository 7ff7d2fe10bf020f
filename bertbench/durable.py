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
