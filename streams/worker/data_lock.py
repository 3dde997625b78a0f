"""Who may run on a data directory: one ``serve``, or any number of workers of one market.

A data directory holds a market's keys and its workers' local checkpoints. Two ``serve`` on one
directory are two markets with the same keys on different brokers, and the second would start
silently; workers of one market may share a directory (each writes only the checkpoint slots of
the partitions it serves), which is what a market of several workers on one machine does.

So ``serve`` holds ``<data dir>/.lock`` exclusively and a worker holds it shared, with
``flock``: the kernel releases the lock when the process ends however it ends, so a lock file
left by a crashed process never blocks the next one (no stale lock to remove by hand).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirInUse", "hold_data_dir"]

LOCK_FILE = ".lock"


class DataDirInUse(Exception):
    """Another process holds the data directory in a way this one cannot share."""


@contextlib.contextmanager
def hold_data_dir(data_dir: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``data_dir`` while the ``with`` block runs (or until the process ends, however it
    ends).

    Raises
    ------
    DataDirInUse
        Another ``serve`` holds it (or, ``exclusive``, anything does); the message names the
        process id the holder recorded, when it is still running.
    OSError
        The directory cannot be made or the lock file opened (permissions).
    """
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirInUse(
                f"another epsilon-market serve or worker is running on the data directory "
                f"{data_dir}{_holder(fd)} (it holds {path}): stop it first, or give this one "
                "another --data-dir (EMARKET_DATA_DIR)"
            ) from None
        if exclusive:  # who holds it, for the message of the next one
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> str:
    """`` (pid N)`` if the file names a running process, else nothing."""
    try:
        pid = int(os.pread(fd, 32, 0).split()[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, OSError):
        return ""
    return f" (pid {pid})"
