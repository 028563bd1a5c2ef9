"""Which ``Host`` headers the HTTP servers answer (``awa admin serve``, ``awa
metrics serve``, ``awa demo``, ``awa maintain``'s /metrics): the check
against DNS rebinding; and the URL each prints at start.

A page in a browser on the operator's machine can point a name it controls
at 127.0.0.1 and then read, as same-origin, whatever a server there answers:
the admin API's jobs and their args, /metrics. The browser still sends the
page's name as ``Host``, so a server that answers only the names it is
reached by refuses the read. Ports are not compared: the name is what the
attacker controls. Docs: docs/security.md (DNS rebinding), docs/admin.md.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")  # noqa: S104 - names to recognise, not to bind
ANY_HOST = "*"

_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")


def canonical(text: str) -> str | None:
    """The host of a ``Host`` header or of an ``--allowed-host`` value: lower
    case, without the port, the brackets of an IPv6 address or a trailing
    dot; IPv6 addresses compressed (``[0::1]:8700`` is ``::1``). None when it
    is not a host name or address."""
    value = text.strip().lower()
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not re.fullmatch(r":\d*", rest)):
            return None
        return _ipv6(address)
    if value.count(":") > 1:  # an IPv6 address without brackets, as --host takes one
        return _ipv6(value)
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    name = name.removesuffix(".")
    return name if _NAME.fullmatch(name) else None


def _ipv6(text: str) -> str | None:
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        return None


def shown(host: str) -> str:
    """A host as a URL names it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def url(host: str, port: int, path: str = "/") -> str:
    """The URL of a server bound to ``host``:``port`` (``http://[::1]:8700/``)."""
    return f"http://{shown(host)}:{port}{path}"


@dataclass(frozen=True)
class HostCheck:
    """The Host names one server answers to (``any_host``: every name).
    ``names`` are canonical; ``suffixes`` come from ``*.example.com``
    patterns (``.example.com``: its subdomains, not itself). ``how`` says,
    in the refusal, how to allow another name."""

    names: tuple[str, ...]
    suffixes: tuple[str, ...] = ()
    any_host: bool = False
    how: str = ""

    def allows(self, header: str | None) -> bool:
        if self.any_host:
            return True
        host = canonical(header) if header else None
        if host is None:
            return False
        return host in self.names or host.endswith(self.suffixes)

    def refusal(self, header: str | None) -> str:
        """Why a request with this ``Host`` header is refused, and what to do."""
        host = canonical(header) if header else None
        if not header:
            what = "a request without a Host header"
        else:
            what = f"Host {(shown(host) if host else header[:200])!r}"
        allowed = ", ".join([*map(shown, self.names), *("*" + s for s in self.suffixes)])
        how = self.how.format(host=shown(host) if host else "NAME")
        return (f"refused {what}: this server answers only to {allowed} (the check "
                f"against DNS rebinding); {how}")


def parse_allowed_host(text: str) -> str:
    """An ``--allowed-host`` value, canonical: a name, an address (an IPv6
    one with or without brackets), ``*.example.com`` or ``*``. ValueError
    when it is none of those."""
    value = text.strip().lower()
    if value == ANY_HOST:
        return ANY_HOST
    pattern = value.startswith("*.")
    body = value[2:] if pattern else value
    # No port: the check never compares ports, so a port given would mislead.
    has_port = "]:" in body if body.startswith("[") else body.count(":") == 1
    host = None if has_port else canonical(body)
    if host is not None and not (pattern and ":" in host):
        return "*." + host if pattern else host
    raise ValueError(f"allowed host {text!r} is not a host name or address without a port "
                     "(examples: admin.example.com, 10.0.0.5, ::1, *.example.com, *)")


def allowed_from_env(variable: str) -> list[str]:
    """The comma-separated hosts in environment variable ``variable``."""
    raw = os.environ.get(variable, "")
    try:
        return [parse_allowed_host(part) for part in raw.split(",") if part.strip()]
    except ValueError as error:
        raise ValueError(f"{variable}: {error}") from None


def host_check(bound: str, allowed: Iterable[str] = (), how: str = "") -> HostCheck:
    """What a server bound to ``bound`` answers to: the loopback names and
    ``bound`` itself (a wildcard too: ``http://0.0.0.0:port/`` reaches this
    machine, and an address cannot be rebound), and each of ``allowed`` (values of
    ``parse_allowed_host``). Bound to a wildcard address with nothing in
    ``allowed``, any name: a Prometheus scrape names the host as its target
    does, often by an address this server cannot know."""
    given = list(allowed)
    if ANY_HOST in given or (is_wildcard(bound) and not given):
        return HostCheck(names=(), any_host=True, how=how)
    names: list[str] = []
    suffixes: list[str] = []
    own = canonical(bound)
    for host in [*LOOPBACK_NAMES, *([own] if own else []), *given]:
        if host.startswith("*."):
            suffixes.append(host[1:])
        elif host not in names:
            names.append(host)
    return HostCheck(names=tuple(names), suffixes=tuple(dict.fromkeys(suffixes)), how=how)


def is_wildcard(bound: str) -> bool:
    return bound.strip() in WILDCARD_ADDRESSES


def how_to_allow(command: str, variable: str) -> str:
    """``HostCheck.how`` for a command with ``--allowed-host`` and ``variable``."""
    return f"to allow it, start {command} with --allowed-host {{host}} or add it to {variable}"


def for_server(command: str, variable: str, bound: str, given: Sequence[str] | None,
               prefix: str = "awa: warning: ") -> tuple[HostCheck, str | None]:
    """The Host check of ``command``'s server bound to ``bound``: the names
    ``given`` (its ``--allowed-host`` values), else those of ``variable``;
    and the warning line it prints at start, or None (``wildcard_warning``)."""
    allowed = list(given) if given else allowed_from_env(variable)
    return (host_check(bound, allowed, how=how_to_allow(command, variable)),
            wildcard_warning(bound, allowed, variable, prefix))


def wildcard_warning(bound: str, allowed: Sequence[str], variable: str,
                     prefix: str = "awa: warning: ") -> str | None:
    """The one line a server bound to every address with no allowed host
    prints at start (``prefix``: none for a logger's line); None otherwise."""
    if not is_wildcard(bound) or allowed:
        return None
    return (f"{prefix}listening on {bound or '*'} with no allowed host, so any Host "
            "header is answered: a web page in any browser that reaches this server can read "
            "it through DNS rebinding; name the hosts clients use with --allowed-host NAME "
            f"(repeatable) or {variable}=name1,name2")
