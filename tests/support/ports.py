"""A local TCP port another socket holds (listening or refusing), and what a command that cannot
bind it must print: one line naming the address, no traceback; whether this
machine has the IPv6 loopback."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 this block holds, listening, until it ends."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        yield taken.getsockname()[1]


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port of 127.0.0.1 this block holds without listening: a connection to
    it is refused, and no other process can start listening on it meanwhile
    (a port found free and let go could be taken by a server another test
    starts)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def assert_cannot_listen(result: subprocess.CompletedProcess, address: str) -> None:
    """The command failed (exit 7, EXIT_ERROR) with one line naming ``address``."""
    assert result.returncode == 7, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on {address}" in result.stderr, result.stderr


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(),
                                reason="no IPv6 loopback (::1) on this machine")
