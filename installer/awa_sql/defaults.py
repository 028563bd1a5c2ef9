"""Defaults that several commands share, in a module light enough for the CLI
to read before it loads anything heavy (FastAPI, uvicorn)."""

from __future__ import annotations

LOCAL_HOST = "127.0.0.1"  # the embedded server's address; HTTP servers bind it by default
ADMIN_PORT = 8700  # awa admin serve, and the demo's admin page and /metrics
METRICS_PORT = 9187  # awa metrics serve
MAINTAIN_METRICS_PORT = 9189  # awa maintain's own /metrics

# The cadences a maintenance task takes, in seconds: awa maintain's
# --<task>-every and Worker(maintain={...}).
EVERY_MIN = 0.05
EVERY_MAX = 3600.0

# awa._scheduled_capped counts a queue's scheduled jobs up to this many, so
# that a watch reads at most that much of its index (tests compare the two):
# a count at the cap means at least that many, shown as "10000+".
SCHEDULED_CAP = 10_000

# How long a job tool (`awa jobs`, the admin API's retries and cancels) waits
# for rows another transaction holds: a cancel for a claim in flight that
# holds its job (ADR 025), a bulk retry for failed rows another retry
# holds. Past it the call fails with 55P03 (exit 5, HTTP 409).
JOB_TOOL_LOCK_TIMEOUT = "5s"

# Why awa.retry_job returns false for a job that is failed or cancelled
# (docs/sql-api.md): not its state. `awa jobs retry ID` and the admin API say it.
RETRY_REFUSED = ("another job of its queue holds its unique key now (a live one: retry it "
                 "once that job has finished; one that completed with a unique window: once "
                 "the window has passed), or it failed before migration 0015 and kept no "
                 "args")

# The states awa.retry_jobs takes jobs from, one a call, failed the default
# (awa._retry_states in sql/jobs.sql, which decides; tests compare the two):
# `awa jobs retry --queue Q --state` and the admin API's bulk retry plan.
RETRY_STATES = ("failed", "cancelled")
