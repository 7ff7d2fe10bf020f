"""One run per directory: the lock a command holds on its --output_dir while it trains, evaluates or predicts.

The lock is an exclusive `flock` on `<output_dir>/.bertbench.lock`, which holds the holder's host, pid, start time and
command. What it guarantees:
- A second command on the same directory, on this machine, is refused at once in one line naming the holder.
- A killed holder (SIGKILL, a crashed node's process) cannot leave it stuck: the kernel drops a dead process's lock,
  and the file left behind is only a note of the last holder.
- On NFS (v4, or v3 with lockd) Linux turns flock into the server's byte-range locks, so commands on different nodes
  exclude each other too; a node that dies holding the lock keeps it until the server's lease or lockd notices
  (NFSv4: about 90 s). A filesystem without locks (Lustre mounted without `-o flock`, some FUSE filesystems) makes
  the lock fail: the command says so in a warning and runs unprotected rather than not at all.
A command that fails leaves no lock file where there was none (a failed start leaves the directory exactly as it
was), and no directory it created that holds nothing else. It deletes the file while still holding the lock; a command
that opened the file before that and locks it after finds, on checking, that the path no longer names the file it
locked, and starts over on the file there now: two commands never hold two different files of one directory. A
command that succeeds leaves the file, a note of the last holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable

from bertbench.common.errors import UsageError
from bertbench.common.run_files import LOCK


class RunDirectoryBusy(UsageError):
    """Another command holds the run directory; the message names it (exit status 2: nothing was done)."""


class RunLock:
    """`with RunLock(output_dir):` holds output_dir for this process (see the module's doc)."""

    def __init__(self, directory: str | os.PathLike, log: Callable[[str], None] = lambda line: None):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, LOCK)
        self.log = log
        self._descriptor: int | None = None
        self._created_directory = self._created_file = False

    def __enter__(self) -> RunLock:
        while True:  # again when a failed command removed the file or the directory it had made meanwhile
            self._created_directory |= not os.path.isdir(self.directory)
            os.makedirs(self.directory, exist_ok=True)
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._created_file = True
            except FileExistsError:
                try:
                    descriptor = os.open(self.path, os.O_RDWR)
                except FileNotFoundError:
                    continue
                self._created_file = False
            except FileNotFoundError:
                continue
            self._lock(descriptor)
            if _names(self.path, descriptor):
                break
            os.close(descriptor)
        os.ftruncate(descriptor, 0)
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(sys.argv)[:500],
        }
        os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
        self._descriptor = descriptor
        return self

    def _lock(self, descriptor: int) -> None:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            raise RunDirectoryBusy(
                f"{self.directory}: another run is using this directory ({holder}); wait for it "
                "to end, or use another --output_dir"
            ) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                os.close(descriptor)
                raise
            self.log(
                f"warning: {self.path}: this filesystem does not lock files ({error.strerror}): nothing stops "
                "a second run on this directory"
            )

    def __exit__(self, error_type, *exc_info) -> None:
        if self._descriptor is None:
            return
        only_the_lock = self._created_directory and os.listdir(self.directory) == [LOCK]
        if self._created_file and (error_type is not None or only_the_lock):
            os.remove(self.path)  # while locked: see the module's doc
            if self._created_directory and not os.listdir(self.directory):
                os.rmdir(self.directory)
        os.close(self._descriptor)  # closing releases the lock
        self._descriptor = None


def _names(path: str, descriptor: int) -> bool:
    """Whether `path` is still the file open as `descriptor` (a failed holder may have removed it since it was
    opened)."""
    try:
        there, held = os.stat(path), os.fstat(descriptor)
    except FileNotFoundError:
        return False
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _read_holder(descriptor: int) -> str:
    """'pid N on HOST since TIME' from the lock file, or a plain phrase when it cannot be read."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0).decode())
        return f"pid {holder['pid']} on {holder['host']} since {holder['started']}: {holder['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder did not say who it is"
