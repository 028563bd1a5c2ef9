"""Scratch folders for the suite's throwaway servers: in memory (tmpfs) when it can.

The suite creates and drops a database per test, a few hundred files each time.
On ext4 without a journal (the root file system of this project's machines),
allocating an inode skips the inodes freed in the last minutes
(``recently_deleted`` in the kernel), so ``create database`` slows down as
files come and go: 400-650 ms a clone of the migrated template once the suite
(and whatever else runs) has churned for a while, nearly all of it in the
kernel, against 20-50 ms on tmpfs. The servers run with ``fsync=off`` and are
thrown away, so memory is all they need: about 0.5 GB at the peak of a run.

``AWA_TEST_TMPDIR`` names the folder to use instead; otherwise ``/dev/shm`` when
it is a tmpfs with room, else the usual temporary folder. A server whose test is
about durability (tests/test_copy_durability.py) stays on disk.
"""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path

SHM = Path("/dev/shm")  # noqa: S108 - a private mkdtemp inside it, never a fixed name
MIN_FREE = 4 << 30  # two clusters' WAL (max_wal_size 1 GB each) and their databases


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(len(f := line.split()) >= 3 and f[1] == str(path) and f[2] == "tmpfs"
               for line in mounts)


@cache
def root() -> str | None:
    """The folder scratch folders go in; None means tempfile's default."""
    if env := os.environ.get("AWA_TEST_TMPDIR"):
        return env
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    if _is_tmpfs(SHM) and os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= MIN_FREE:
        return str(SHM)
    return None


def mkdtemp(prefix: str) -> Path:
    """A new private folder for a throwaway server (see the module's docstring)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root()))
