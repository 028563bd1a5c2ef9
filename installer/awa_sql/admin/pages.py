"""The HTML pages (queues, a queue, a job): a shell each, filled in by
static/admin.js from the API.

Everything the browser loads ships in this package (static/); nothing is
fetched from anywhere else at run time.
"""

from __future__ import annotations

import html
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from awa_sql.version import __version__

STATIC = FilePath(__file__).resolve().parent / "static"

SHELL = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · awa admin</title>
<link rel="stylesheet" href="/static/admin.css?v={version}">
</head>
<body data-page="{page}" data-queue="{queue}" data-job="{job}" data-writable="{writable}">
<header><a href="/">awa admin</a> <span class="mode">{mode}</span></header>
<main id="app"><p class="muted">Loading…</p></main>
<script src="/static/admin.js?v={version}"></script>
</body>
</html>
"""


# Only the page's own script, stylesheet and API; never inside another
# site's frame, where a page could lay its own buttons over Change S, Pause
# and Retry (clickjacking: the admin's Host is its own, so the Host check
# lets the framed page load).
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _shell(request: Request, page: str, title: str, queue: str = "",
           job: int | None = None) -> HTMLResponse:
    writable = request.app.state.settings.writable
    body = SHELL.format(
        title=html.escape(title), page=page, queue=html.escape(queue, quote=True),
        job="" if job is None else job,
        writable="true" if writable else "false", version=__version__,
        mode="writable" if writable else "read-only",
    )
    return HTMLResponse(body, headers=HEADERS)


def install(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def queue_list(request: Request) -> HTMLResponse:
        return _shell(request, "queues", "Queues")

    @app.get("/queues/{queue:path}", response_class=HTMLResponse, include_in_schema=False)
    def queue_page(request: Request, queue: str) -> HTMLResponse:
        return _shell(request, "queue", queue, queue)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: Annotated[int, Path(ge=1, le=2**63 - 1)]
                 ) -> HTMLResponse:
        return _shell(request, "job", f"Job {job_id}", job=job_id)
