"""awa.failure_summary and ``awa jobs failures``: what is failing, where, since
when. The failed jobs kept, one row per logical queue, kind and error class
(the first line of the last error that holds text, cut to 200 characters),
with the count, the first and the last failure and the last one's job; the
since and queue filters; the roles that may call it (those of
awa.count_jobs); bad input; the CLI's table and --json."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.support.jobs import claim, enqueue

COLUMNS = ["logical_queue", "kind", "error", "failed", "first_failed_at", "last_failed_at",
           "sample_job_id", "sample_error"]
RUNTIME = ["producer", "worker", "maintenance", "operator", "reader"]
TIMEOUT = "timeout talking to the bank"
LONG = "x" * 300


def summary(conn, queue=None, since=None, max_groups=100) -> list[dict]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in conn.execute(
        "select * from awa.failure_summary(%s, %s::interval, %s)",
        [queue, since, max_groups]).fetchall()]


def fail_jobs(db, logins, queue, kind, errors, *, reverse=False, **kw) -> list[int]:
    """One job of `queue` per error, each with one attempt, failed with it in
    its own transaction (so each has its own finished_at), in job id order or
    the reverse; the ids in the order they failed."""
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, queue, kind, max_attempts=1, **kw)[0] for _ in errors]
    order = list(zip(ids, errors, strict=True))
    if reverse:
        order.reverse()
    with db.connect(logins.worker) as w:
        leases = {c[0]: c[1] for c in claim(w, [queue])}
        assert sorted(leases) == sorted(ids)
        for job_id, error in order:
            assert w.execute("select awa.fail(%s, %s, %s)",
                             [job_id, leases[job_id], error]).fetchone()[0]
    return [job_id for job_id, _ in order]


def finished_at(db, job_id):
    with db.connect() as su:
        return su.execute("select finished_at from awa.job(%s)", [job_id]).fetchone()[0]


@pytest.fixture
def incident(db, logins):
    """Failed jobs of queues 'orders' and 'other', and jobs that must not count:
    completed, cancelled, failed with attempts left."""
    ids = {
        # Failed in reverse id order: the last to fail is the lowest id.
        "timeout": fail_jobs(db, logins, "orders", "charge",
                             [f"{TIMEOUT}\n  at frame {i}" for i in range(3)], reverse=True),
        "declined": fail_jobs(db, logins, "orders", "charge", ["card declined"]),
        "smtp": fail_jobs(db, logins, "orders", "mail", ["smtp down", "smtp down\r\nretry"]),
        "other": fail_jobs(db, logins, "other", "charge", [TIMEOUT]),
        "long": fail_jobs(db, logins, "other", "charge", [LONG + "\nmore"]),
        "blank": fail_jobs(db, logins, "other", "charge", ["\n\n   boom at start  \nrest"]),
    }
    with db.connect(logins.producer) as p:
        done = enqueue(p, "orders", "charge")[0]
        retried = enqueue(p, "orders", "charge", max_attempts=3)[0]
        cancelled = enqueue(p, "orders", "charge", run_at="2999-01-01")[0]
    with db.connect(logins.worker) as w:
        leases = {c[0]: c[1] for c in claim(w, ["orders"])}
        assert w.execute("select awa.complete(%s, %s)", [done, leases[done]]).fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, %s)",
                         [retried, leases[retried], TIMEOUT]).fetchone()[0]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [cancelled]).fetchone()[0]
    return ids


def _row(queue, kind, error, ids, sample_error):
    """The row expected of a group whose jobs failed in the order `ids`."""
    return {"logical_queue": queue, "kind": kind, "error": error, "failed": len(ids),
            "sample_job_id": ids[-1], "sample_error": sample_error}


def _without_times(rows):
    return [{k: v for k, v in r.items() if not k.endswith("_at")} for r in rows]


def test_groups_by_queue_kind_and_first_line_most_failures_first(db, logins, incident):
    ids = incident
    with db.connect(logins.reader) as r:
        rows = summary(r)
    # Most failures first; among groups of one, the latest failure first.
    assert _without_times(rows) == [
        _row("orders", "charge", TIMEOUT, ids["timeout"], f"{TIMEOUT}\n  at frame 0"),
        _row("orders", "mail", "smtp down", ids["smtp"], "smtp down\r\nretry"),
        _row("other", "charge", "boom at start", ids["blank"], "\n\n   boom at start  \nrest"),
        _row("other", "charge", "x" * 200, ids["long"], LONG + "\nmore"),
        _row("other", "charge", TIMEOUT, ids["other"], TIMEOUT),
        _row("orders", "charge", "card declined", ids["declined"], "card declined"),
    ]
    first = rows[0]
    # The last to fail is the sample, not the highest job id.
    assert first["sample_job_id"] == min(ids["timeout"])
    assert first["first_failed_at"] == finished_at(db, ids["timeout"][0])
    assert first["last_failed_at"] == finished_at(db, ids["timeout"][-1])
    assert first["first_failed_at"] < first["last_failed_at"]
    with db.connect(logins.operator) as op:
        assert summary(op, max_groups=2) == rows[:2]


def test_a_failed_job_carried_to_the_long_ring_counts(db, logins, incident):
    """A carry moves a failed job kept past its ring's round to the long ring
    (slots 64-95, sql/retention.sql); it is still a failure kept."""
    job_id = incident["declined"][0]
    with db.connect() as su:
        su.execute("update awa.finished set slot = 70 where job_id = %s", [job_id])
        assert su.execute("select state from awa.job(%s)", [job_id]).fetchone()[0] == "failed"
    with db.connect(logins.reader) as r:
        declined = [g for g in summary(r) if g["error"] == "card declined"]
    assert [(g["failed"], g["sample_job_id"]) for g in declined] == [(1, job_id)]


def test_since_keeps_the_failures_of_that_long_back(db, logins, incident):
    ids = incident["timeout"]
    with db.connect() as su:
        su.execute("update awa.finished set finished_at = now() - interval '3 days'"
                   " where job_id = %s", [ids[0]])
        su.execute("update awa.finished set finished_at = now() - interval '2 hours'"
                   " where job_id = %s", [ids[1]])
    with db.connect(logins.reader) as r:
        def timeouts(since):
            return [(g["failed"], g["first_failed_at"], g["sample_job_id"])
                    for g in summary(r, "orders", since) if g["error"] == TIMEOUT]

        assert timeouts(None) == [(3, finished_at(db, ids[0]), ids[2])]
        assert timeouts("1 day") == [(2, finished_at(db, ids[1]), ids[2])]
        assert timeouts("1 hour") == [(1, finished_at(db, ids[2]), ids[2])]
        assert summary(r, since="0 seconds") == []


def test_the_queue_filter_takes_a_logical_name_and_refuses_an_unknown_one(db, logins,
                                                                          incident):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('parts', 3)")
    keyed = [{"ordering_key": f"key-{i}".encode()} for i in range(12)]
    parts = []
    for kw in keyed:
        parts += fail_jobs(db, logins, "parts", "sync", ["conflict"], **kw)
    with db.connect(logins.reader) as r:
        homes = {q for q, in r.execute(
            "select queue from awa.jobs('parts') where state = 'failed'").fetchall()}
        assert len(homes) > 1  # spread over its partitions
        assert _without_times(summary(r, "parts")) == [
            _row("parts", "sync", "conflict", parts, "conflict")]
        assert {g["logical_queue"] for g in summary(r, "other")} == {"other"}
        assert len(summary(r, "orders")) == 3
        assert {g["logical_queue"] for g in summary(r)} == {"orders", "other", "parts"}
        with pytest.raises(psycopg.errors.UndefinedObject):
            summary(r, "nope")
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            summary(r, "bad#name")


def test_the_roles_of_count_jobs_may_call_it_and_no_other(db, logins, incident):
    with db.connect() as su:
        may = {role: su.execute(
            "select has_function_privilege(%s, 'awa.failure_summary(text, interval, integer)',"
            " 'execute'), has_function_privilege(%s,"
            " 'awa.count_jobs(text, text, text, integer)', 'execute')",
            [f"awa_{role}", f"awa_{role}"]).fetchone() for role in RUNTIME}
    assert {role: summary_may for role, (summary_may, _) in may.items()} == {
        "producer": False, "worker": False, "maintenance": False, "operator": True,
        "reader": True}
    assert all(a == b for a, b in may.values())
    for role in ("operator", "reader"):
        with db.connect(getattr(logins, role)) as conn:
            assert len(summary(conn)) == 6
    for role in ("producer", "worker", "maintenance"):
        with db.connect(getattr(logins, role)) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            summary(conn)


@pytest.mark.parametrize(("since", "max_groups", "error", "message"), [
    ("-1 second", 100, psycopg.errors.InvalidParameterValue,
     "since must be between 0 and 10 years, got -00:00:01"),
    ("10 years 1 day", 100, psycopg.errors.InvalidParameterValue,
     "since must be between 0 and 10 years, got 10 years 1 day"),
    (None, 0, psycopg.errors.InvalidParameterValue,
     "max_groups must be between 1 and 100000, got 0"),
    (None, 100001, psycopg.errors.InvalidParameterValue,
     "max_groups must be between 1 and 100000, got 100001"),
    (None, -5, psycopg.errors.InvalidParameterValue,
     "max_groups must be between 1 and 100000, got -5"),
    (None, None, psycopg.errors.NullValueNotAllowed, "max_groups must not be null"),
])
def test_bad_input_is_refused_naming_the_value_and_the_range(db, logins, since, max_groups,
                                                             error, message):
    with db.connect(logins.reader) as r, pytest.raises(error) as raised:
        summary(r, since=since, max_groups=max_groups)
    assert raised.value.diag.message_primary == message


# -- awa jobs failures --------------------------------------------------------------------


@pytest.mark.one_version
def test_cli_prints_the_groups_for_people_and_for_scripts(db, logins, incident):
    out = db.awa("jobs", "failures", user=logins.reader, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["queue", "kind", "failed", "first", "last", "last", "job",
                                "error"]
    top = lines[2].split()
    assert top[:3] == ["orders", "charge", "3"]
    assert str(min(incident["timeout"])) in top and lines[2].endswith(TIMEOUT)
    assert len(lines) == 2 + 6 and "more:" not in out
    data = json.loads(db.awa("jobs", "failures", "--json", user=logins.reader,
                             check=True).stdout)
    assert data["more"] is False and len(data["failures"]) == 6
    first = data["failures"][0]
    assert (first["logical_queue"], first["kind"], first["error"], first["failed"]) == (
        "orders", "charge", TIMEOUT, 3)
    assert first["sample_job_id"] == min(incident["timeout"])
    assert first["sample_error"] == f"{TIMEOUT}\n  at frame 0"
    assert first["first_failed_at"] < first["last_failed_at"]
    assert first["last_failed_at"] == finished_at(db, min(incident["timeout"])).isoformat()


@pytest.mark.one_version
def test_cli_filters_by_queue_and_since_and_limits(db, logins, incident):
    with db.connect() as su:
        su.execute("update awa.finished set finished_at = now() - interval '2 hours'"
                   " where queue_id = (select queue_id from awa.queue_meta"
                   " where queue = 'other')")
    other = json.loads(db.awa("jobs", "failures", "--queue", "other", "--json",
                              user=logins.operator, check=True).stdout)
    assert {g["logical_queue"] for g in other["failures"]} == {"other"}
    assert len(other["failures"]) == 3
    recent = json.loads(db.awa("jobs", "failures", "--since", "1h", "--json",
                               user=logins.reader, check=True).stdout)
    assert {g["logical_queue"] for g in recent["failures"]} == {"orders"}
    nothing = db.awa("jobs", "failures", "--queue", "other", "--since", "90m",
                     user=logins.reader, check=True).stdout
    assert nothing.strip() == "no failed jobs kept of other that failed in the last 90m"
    limited = db.awa("jobs", "failures", "--limit", "2", user=logins.reader, check=True).stdout
    assert len(limited.split("\n\n")[0].splitlines()) == 2 + 2
    assert "more: the 2 groups of most failures are shown; --limit for more" in limited
    assert json.loads(db.awa("jobs", "failures", "--limit", "2", "--json", user=logins.reader,
                             check=True).stdout)["more"] is True


@pytest.mark.one_version
@pytest.mark.parametrize(("args", "says"), [
    (["--since=-1h"], "since must be between 0 and 10 years, got -01:00:00 [22023]"),
    (["--since", "4000d"], "since must be between 0 and 10 years, got 4000 days [22023]"),
    (["--since", "1x"], "argument --since: age must be a number and a unit (s, m, h, d, w), "
                        "like 30m, 1h or 2d, got '1x'"),
    (["--since", "h"], "got 'h'"),
    (["--limit", "0"], "--limit must be between 1 and 100000, got 0"),
    (["--queue", "nope"], "[42704]"),
])
def test_cli_bad_arguments_exit_2_naming_the_value(db, logins, args, says):
    result = db.awa("jobs", "failures", *args, user=logins.reader)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


@pytest.mark.one_version
def test_cli_refused_to_a_login_without_the_role(db, logins):
    refused = db.awa("jobs", "failures", user=logins.producer)
    assert refused.returncode == 7 and "42501" in refused.stderr
    empty = db.awa("jobs", "failures", user=logins.reader, check=True)
    assert empty.stdout.strip() == "no failed jobs kept"


@pytest.mark.one_version
def test_cli_points_to_the_jobs_still_retrying_which_it_does_not_count(db, logins):
    """A job that fails every attempt is retried for hours before it is
    failed for good: all that while the summary finds nothing, and says
    where the failing attempts are instead of leaving "no failed jobs"."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('mail', 'poison')")
    with db.connect(logins.worker) as w:
        (job,) = w.execute("select job_id, run_lease from awa.claim(array['mail'], 1, 'w')"
                           ).fetchall()
        assert w.execute("select awa.fail(%s, %s, 'boom')", list(job)).fetchone()[0]
    result = db.awa("jobs", "failures", "--queue", "mail", user=logins.reader, check=True)
    assert result.stdout.strip() == "no failed jobs kept of mail"
    assert ("jobs still retrying are not counted here: awa jobs list --queue mail"
            " --state scheduled shows them, with their last error") in result.stderr
    listed = db.awa("jobs", "list", "--queue", "mail", "--state", "scheduled",
                    user=logins.reader, check=True).stdout
    assert "poison" in listed and "1/25" in listed and "boom" in listed
    every = db.awa("jobs", "failures", user=logins.reader, check=True)
    assert "awa jobs list --queue QUEUE --state scheduled" in every.stderr
