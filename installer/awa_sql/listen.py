"""The listening sockets of the HTTP servers (``awa admin serve``, ``awa
metrics serve``, ``awa demo``): a port that cannot be had is one error
naming the address, which the CLI prints as one line."""

from __future__ import annotations

import socket

from awa_sql.hosts import shown


class CannotListen(Exception):
    """The address cannot be bound: the port is taken, the host is not this
    machine's or has no address."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(f"cannot listen on {shown(host)}:{port}: {error}")
        self.host = host
        self.port = port
        self.error = error


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port), as uvicorn binds
    one, not yet listening; ``CannotListen`` when the address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CannotListen(host, port, error) from None
    return sock
