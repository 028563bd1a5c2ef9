"""The one guard every write passes: writable server, right token, a primary."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from awa_sql.admin.errors import ApiError

bearer = HTTPBearer(auto_error=False, description="the token in AWA_ADMIN_TOKEN")


def require_write(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    settings = request.app.state.settings
    if not settings.writable:
        raise ApiError(403, "this admin server is read-only; start it with --writable "
                       "and AWA_ADMIN_TOKEN to allow changes")
    if credentials is None:
        raise ApiError(403, "a write needs the header 'Authorization: Bearer <AWA_ADMIN_TOKEN>'")
    if not settings.token or not hmac.compare_digest(
        credentials.credentials.encode(), settings.token.encode()
    ):
        raise ApiError(403, "wrong bearer token")
    with request.app.state.pool.connection() as conn:
        if conn.execute("select pg_catalog.pg_is_in_recovery()").fetchone()[0]:
            raise ApiError(503, "the database is a read-only standby; point the admin "
                           "server at the primary to make changes", "25006")
