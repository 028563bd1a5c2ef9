"""Which browser requests the HTTP servers answer on the routes that read the
database (the admin API under ``/api/``, ``/metrics`` of ``awa admin
serve``, ``awa demo`` and ``awa metrics serve``): the check against
cross-site reads.

A page the operator opens can embed ``<img
src="http://127.0.0.1:8700/api/queues/big/drop/plan">``: it cannot read the
answer (the Host check and the same-origin policy see to that), but each
load makes the database do the read. A browser says where a request comes
from: ``Sec-Fetch-Site`` on every request to an https or loopback URL
(``same-origin``, ``same-site``, ``cross-site``, or ``none`` for a URL the
user opened), and ``Origin`` on a POST and on a script's cross-origin
fetch. A page can set neither. Clients that are not browsers (curl,
scripts, Prometheus) send neither and are answered.

Docs: docs/security.md (cross-site reads), docs/admin.md.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from awa_sql.hosts import canonical

# The Sec-Fetch-Site values answered: the server's own pages, and a URL the
# user typed, bookmarked or opened from outside a page. ``same-site`` is
# refused too: for a loopback server it is any page on another port of the
# same address (``http://127.0.0.1:3000``, a dev server), which is no more
# the admin's own than another site is; the admin page itself is same-origin.
ANSWERED = ("same-origin", "none")

WHO_IS_ANSWERED = ("this server answers its API and /metrics only to its own pages, a URL "
                   "opened directly, and clients that are not browsers (curl, scripts, "
                   "Prometheus)")

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        split = urlsplit("//" + netloc)
        port = split.port
    except ValueError:
        return None
    host = canonical(split.hostname) if split.hostname else None
    return None if host is None else (host, port or default_port)


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` (an ``Origin`` header) is this server's own origin,
    as the ``Host`` header ``host`` names it: the same name or address and
    port (the scheme's default port when either leaves it out)."""
    try:
        split = urlsplit(origin.strip())
    except ValueError:
        return False
    default = _DEFAULT_PORTS.get(split.scheme.lower())
    if (default is None or not split.netloc or split.path or split.query or split.fragment
            or "@" in split.netloc or not host):
        return False
    own = _host_port(host, default)
    return own is not None and _host_port(split.netloc, default) == own


def refusal(fetch_site: str | None, origin: str | None, host: str | None) -> str | None:
    """Why a request with these ``Sec-Fetch-Site``, ``Origin`` and ``Host``
    headers is refused, or None when it is answered. ``Sec-Fetch-Site``
    decides when a browser sent it (behind a TLS proxy that sends its
    upstream's address as ``Host``, the page's own ``Origin`` names another
    host than ``Host`` does); without it, an ``Origin`` must be the server's
    own; a request with neither is answered."""
    if fetch_site is not None:
        site = fetch_site.strip().lower()
        if site in ANSWERED:
            return None
        return (f"refused a request with Sec-Fetch-Site: {site[:40]}: a page other than this "
                f"server's own made the browser send it (the check against cross-site "
                f"reads); {WHO_IS_ANSWERED}")
    if origin is None or same_origin(origin, host):
        return None
    return (f"refused a request with Origin: {origin[:200]}: not this server's own "
            f"origin (the check against cross-site reads); {WHO_IS_ANSWERED}")


def guarded(path: str) -> bool:
    """Whether a request for ``path`` is checked: the routes that read the
    database. The HTML pages and static files read none (the page's own
    reads come back same-origin), so a link from another site opens them."""
    return path == "/api" or path.startswith("/api/") or path == "/metrics"
