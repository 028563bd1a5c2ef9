"""``awa admin serve``: the app under uvicorn."""

from __future__ import annotations

import os

from awa_sql.admin.app import Settings, create_app
from awa_sql.connect import resolve_dsn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700


def settings_from(dsn: str | None, writable: bool) -> Settings:
    token = os.environ.get("AWA_ADMIN_TOKEN") or None
    if writable and not token:
        raise ValueError("--writable needs a token: set AWA_ADMIN_TOKEN to a long random "
                         "string and send it as 'Authorization: Bearer <token>'")
    return Settings(dsn=resolve_dsn(dsn), writable=writable, token=token)


def serve(dsn: str | None, host: str, port: int, writable: bool) -> int:
    import uvicorn

    app = create_app(settings_from(dsn, writable))
    mode = "writable" if writable else "read-only"
    print(f"awa admin ({mode}) on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return 0
