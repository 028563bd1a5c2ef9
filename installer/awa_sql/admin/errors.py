"""Errors the API returns as JSON: ``{"error": ..., "sqlstate": ...}``."""

from __future__ import annotations

import psycopg

# What a database error means to an HTTP client. Class 22 (bad data: out of
# range, null, bad name) is the client's fault; the rest are named here.
STATUS_BY_SQLSTATE = {
    "42704": 404,  # unknown queue
    "42501": 403,  # the server's login lacks awa_operator
    "25006": 503,  # read-only transaction: a standby
    "42883": 501,  # function missing: an older awa contract
    "55P03": 409,  # lock timeout: a cancel waited for a claim in flight; try again
    "40001": 409,  # the job moved on every look, or a serialization failure; try again
    "40P01": 409,  # a deadlock: the server rolled back this request's transaction; try again
    "55006": 409,  # a drop of a queue that is not empty
    "0A000": 409,  # a drop of a partition or stripe, or of a queue that has them
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, sqlstate: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint

    def body(self) -> dict:
        out: dict = {"error": self.message}
        if self.sqlstate:
            out["sqlstate"] = self.sqlstate
        if self.hint:
            out["hint"] = self.hint
        return out


def _missing_role(write: bool) -> str:
    """What a 42501 means here: PostgreSQL names the function or schema
    refused, not the awa role the server's login lacks."""
    role, does = ("awa_operator", "make changes") if write else ("awa_reader", "read")
    return f"the admin server's login needs {role} to {does}: grant {role} to it"


# Class 40, rolled back and worth running again (what PostgreSQL's docs say
# to retry): the request changed nothing.
RETRYABLE = frozenset(("40001", "40P01"))
TRY_AGAIN = "the request's transaction was rolled back, nothing changed: try again"


def from_database(err: psycopg.Error, write: bool = False) -> ApiError | None:
    """The ApiError a database error maps to, or None for a server fault;
    ``write``: the request was a change (for what a permission error needs)."""
    state = err.sqlstate or ""
    diag = err.diag
    message = diag.message_primary or str(err).strip()
    hint = diag.message_hint
    if state == "42501" and not hint:
        hint = _missing_role(write)
    if state in RETRYABLE and not hint:
        hint = TRY_AGAIN
    if state.startswith("22"):
        return ApiError(400, message, state, hint)
    if state in STATUS_BY_SQLSTATE:
        return ApiError(STATUS_BY_SQLSTATE[state], message, state, hint)
    return None
