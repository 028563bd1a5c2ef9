"""``awa jobs show|list|retry|cancel`` as a real process, as logins holding
only awa_reader or awa_operator: tables, --json, and the exit codes of
docs/admin.md (2 bad arguments or not confirmed, 7 refused by the server,
8 no such job, 9 a job in a state the command does not apply to)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from psycopg.types.json import Jsonb

from awa_sql.defaults import RETRY_STATES
from tests.support.jobs import claim, enqueue

# The commands' output and exit codes; the functions they call are tested
# on every version in test_jobs.
pytestmark = pytest.mark.one_version

NO_SUCH_JOB = 8
WRONG_STATE = 9


@pytest.fixture
def failed(db, logins):
    """Five failed jobs of queue 'cli' (two of kind 'mail'), one ready, one running."""
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, "cli", "mail" if i < 2 else "sms", args=Jsonb({"i": i}),
                       ordering_key=b"acct-1" if i == 0 else None, max_attempts=1)[0]
               for i in range(5)]
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["cli"]):
            w.execute("select awa.fail(%s, %s, %s)", [job_id, lease, f"error {job_id}\nline 2"])
    with db.connect(logins.producer) as p:
        running = enqueue(p, "cli", "mail")[0]
    with db.connect(logins.worker) as w:
        assert claim(w, ["cli"])[0][0] == running
    with db.connect(logins.producer) as p:
        ready = enqueue(p, "cli", "mail")[0]
    return {"failed": ids, "ready": ready, "running": running}


def _state(db, job_id):
    with db.connect() as su:
        row = su.execute("select state from awa.job(%s)", [job_id]).fetchone()
    return None if row is None else row[0]


def test_show_prints_a_job_for_people_and_for_scripts(db, logins, failed):
    job_id = failed["failed"][0]
    out = db.awa("jobs", "show", str(job_id), user=logins.reader, check=True).stdout
    assert "state         failed" in out
    assert "ordering key  acct-1" in out and "attempts      1 of 1" in out
    assert '"i": 0' in out and f"error {job_id}\nline 2" in out
    data = json.loads(db.awa("jobs", "show", str(job_id), "--json", user=logins.reader,
                             check=True).stdout)
    assert (data["job_id"], data["state"], data["args"]) == (job_id, "failed", {"i": 0})
    assert (data["ordering_key"], data["ordering_key_hex"]) == ("acct-1", b"acct-1".hex())
    assert data["finished_at"].startswith("20")
    missing = db.awa("jobs", "show", "999999999", user=logins.reader)
    assert missing.returncode == NO_SUCH_JOB
    assert "no job 999999999" in missing.stderr


def test_list_pages_with_after_and_filters(db, logins, failed):
    everything = json.loads(db.awa("jobs", "list", "--queue", "cli", "--json",
                                   user=logins.reader, check=True).stdout)
    ids = [j["job_id"] for j in everything["jobs"]]
    assert ids == sorted(ids) and len(ids) == 7 and everything["next_after"] is None
    first = json.loads(db.awa("jobs", "list", "--queue", "cli", "--state", "failed",
                              "--limit", "3", "--json", user=logins.reader, check=True).stdout)
    assert [j["job_id"] for j in first["jobs"]] == failed["failed"][:3]
    rest = json.loads(db.awa("jobs", "list", "--queue", "cli", "--state", "failed", "--after",
                             str(first["next_after"]), "--json", user=logins.reader,
                             check=True).stdout)
    assert [j["job_id"] for j in rest["jobs"]] == failed["failed"][3:]
    mail = db.awa("jobs", "list", "--queue", "cli", "--state", "failed", "--kind", "mail",
                  user=logins.reader, check=True).stdout
    lines = mail.splitlines()
    assert lines[0].split()[:4] == ["job", "state", "kind", "attempts"]
    assert [int(line.split()[0]) for line in lines[2:]] == failed["failed"][:2]
    assert "error" in lines[2] and "line 2" in lines[2]  # one line per job
    page = db.awa("jobs", "list", "--queue", "cli", "--limit", "2", user=logins.reader,
                  check=True).stdout
    assert f"more: --after {ids[1]}" in page


@pytest.mark.parametrize("args", [
    ["list", "--queue", "cli", "--limit", "0"],
    ["list", "--queue", "cli", "--state", "done"],
    ["list", "--queue", "nope"],
    ["list", "--queue", "bad#name"],
    ["retry"],
    ["retry", "1", "--queue", "cli"],
    ["cancel", "1", "--kind", "mail"],
    ["cancel", "--queue", "cli", "--batch", "0"],
    ["retry", "--queue", "cli", "--state", "ready"],
    ["retry", "--queue", "cli", "--state", "Cancelled"],
    ["retry", "1", "--state", "cancelled"],
    ["cancel", "--queue", "cli", "--state", "failed"],
    ["show", "x"],
])
def test_bad_arguments_exit_2_and_change_nothing(db, logins, failed, args):
    result = db.awa("jobs", *args, user=logins.operator)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip()
    assert [_state(db, j) for j in failed["failed"]] == ["failed"] * 5


@pytest.mark.parametrize(("args", "says"), [
    (["show", "99999999999999999999"],
     "argument ID: job id must be between 1 and 9223372036854775807, got 99999999999999999999"),
    (["show", "-1"], "argument ID: job id must be between 1 and 9223372036854775807, got -1"),
    (["show", "0"], "argument ID: job id must be between 1 and 9223372036854775807, got 0"),
    (["retry", "9223372036854775808"],
     "argument ID: job id must be between 1 and 9223372036854775807, got 9223372036854775808"),
    (["cancel", "-7"], "argument ID: job id must be between 1 and 9223372036854775807, got -7"),
    (["list", "--queue", "cli", "--after", "-1"],
     "argument --after: job id must be between 0 and 9223372036854775807, got -1"),
])
def test_a_job_id_out_of_range_exits_2_naming_the_value_and_the_range(db, logins, args, says):
    result = db.awa("jobs", *args, user=logins.operator)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr


def test_retry_and_cancel_one_job_with_their_exit_codes(db, logins, failed):
    job_id = failed["failed"][1]
    done = db.awa("jobs", "retry", str(job_id), user=logins.operator, check=True)
    assert f"retried job {job_id}: now ready" in done.stdout
    again = db.awa("jobs", "retry", str(job_id), user=logins.operator)
    assert again.returncode == WRONG_STATE and "is ready" in again.stderr
    cancel = db.awa("jobs", "cancel", str(job_id), "--json", user=logins.operator, check=True)
    assert json.loads(cancel.stdout) == {"job_id": job_id, "changed": True, "state": "cancelled"}
    twice = db.awa("jobs", "cancel", str(job_id), user=logins.operator)
    assert twice.returncode == WRONG_STATE and "is cancelled" in twice.stderr
    assert db.awa("jobs", "cancel", "999999999", user=logins.operator).returncode == NO_SUCH_JOB
    refused = db.awa("jobs", "retry", str(failed["failed"][2]), user=logins.reader)
    assert refused.returncode == 7 and "42501" in refused.stderr
    assert "this command needs a login that holds awa_operator" in refused.stderr
    assert _state(db, failed["failed"][2]) == "failed"


def test_a_retry_refused_for_a_held_unique_key_says_so_not_the_state(db, logins):
    """awa.retry_job returns false for a failed job whose unique key another
    job holds: the command says why, rather than "only failed or cancelled
    jobs can be retried" of a failed job."""
    with db.connect(logins.producer) as p:
        first = enqueue(p, "uk", max_attempts=1, unique_key=b"k")[0]
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["uk"]):
            w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect(logins.producer) as p:
        assert enqueue(p, "uk", unique_key=b"k")[0] != first  # the key is free: a new job
    refused = db.awa("jobs", "retry", str(first), user=logins.operator)
    assert refused.returncode == WRONG_STATE
    assert f"job {first} is failed but was not retried: another job of its queue holds its " \
           "unique key" in refused.stderr
    assert _state(db, first) == "failed"


def test_a_bulk_retry_that_leaves_counted_jobs_says_how_many_and_why(db, logins):
    """The bulk retry counts the failed jobs, then retries them in batches:
    one whose unique key another job holds now stays failed. The command
    says how many of those it counted it did not retry, and why, rather
    than only "retried 1 job"."""
    with db.connect(logins.producer) as p:
        keyed = enqueue(p, "ukb", max_attempts=1, unique_key=b"k")[0]
        enqueue(p, "ukb", max_attempts=1)
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["ukb"], 2):
            w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect(logins.producer) as p:
        assert enqueue(p, "ukb", unique_key=b"k")[0] != keyed
    retried = db.awa("jobs", "retry", "--queue", "ukb", "--yes", user=logins.operator,
                     check=True)
    assert retried.stdout.strip() == "retried 1 job of ukb"
    assert "1 of the 2 failed jobs counted was not retried: another job of its queue holds " \
           "its unique key" in retried.stderr, retried.stderr
    assert _state(db, keyed) == "failed"


def test_bulk_retry_and_cancel_ask_first_then_loop_in_batches(db, logins, failed):
    unconfirmed = db.awa("jobs", "retry", "--queue", "cli", user=logins.operator)
    assert unconfirmed.returncode == 2
    assert "Retry 5 failed jobs of cli?" in unconfirmed.stderr
    assert [_state(db, j) for j in failed["failed"]] == ["failed"] * 5
    mail = db.awa("jobs", "retry", "--queue", "cli", "--kind", "mail", "--yes",
                  user=logins.operator, check=True)
    assert "retried 2 jobs of kind 'mail' of cli" in mail.stdout
    rest = json.loads(db.awa("jobs", "retry", "--queue", "cli", "--batch", "2", "--yes",
                             "--json", user=logins.operator, check=True).stdout)
    assert rest == {"queue": "cli", "kind": None, "state": "failed", "retried": 3,
                    "more": False}
    assert [_state(db, j) for j in failed["failed"]] == ["ready"] * 5
    with db.connect(logins.producer) as p:
        later = enqueue(p, "cli", "mail", run_at="2999-01-01")[0]
    asked = db.awa("jobs", "cancel", "--queue", "cli", user=logins.operator)
    assert "Cancel 6 ready and 1 scheduled jobs of cli?" in asked.stderr
    cancelled = db.awa("jobs", "cancel", "--queue", "cli", "--batch", "4", "--yes",
                       user=logins.operator, check=True)
    assert "cancelled 7 jobs of cli" in cancelled.stdout
    assert _state(db, later) == "cancelled"
    assert _state(db, failed["running"]) == "running"  # bulk cancel leaves running jobs
    none = db.awa("jobs", "cancel", "--queue", "cli", "--yes", user=logins.operator,
                  check=True)
    assert "no ready or scheduled jobs in cli" in none.stdout


def test_bulk_retry_of_cancelled_jobs_asks_naming_the_state_and_leaves_failed_ones(
        db, logins, failed):
    """The AwaJobsFailing runbook: a flood cancelled with `awa jobs cancel
    --queue Q --kind K --yes` comes back after the fix with `awa jobs retry
    --queue Q --kind K --state cancelled`, the failed jobs left failed."""
    with db.connect(logins.producer) as p:
        bad = [enqueue(p, "cli", "bad", args=Jsonb({"b": i}))[0] for i in range(3)]
    db.awa("jobs", "cancel", "--queue", "cli", "--kind", "bad", "--yes",
           user=logins.operator, check=True)
    asked = db.awa("jobs", "retry", "--queue", "cli", "--kind", "bad", "--state", "cancelled",
                   user=logins.operator)
    assert asked.returncode == 2
    assert "Retry 3 cancelled jobs of kind 'bad' of cli?" in asked.stderr, asked.stderr
    assert [_state(db, j) for j in bad] == ["cancelled"] * 3
    none = db.awa("jobs", "retry", "--queue", "cli", "--kind", "bad", "--yes",
                  user=logins.operator, check=True)  # the default: failed jobs only
    assert "no failed jobs of kind 'bad' in cli" in none.stdout
    done = db.awa("jobs", "retry", "--queue", "cli", "--kind", "bad", "--state", "cancelled",
                  "--batch", "2", "--yes", "--json", user=logins.operator, check=True)
    assert json.loads(done.stdout) == {"queue": "cli", "kind": "bad", "state": "cancelled",
                                       "retried": 3, "more": False}
    assert [_state(db, j) for j in bad] == ["ready"] * 3
    assert [_state(db, j) for j in failed["failed"]] == ["failed"] * 5
    again = db.awa("jobs", "retry", "--queue", "cli", "--kind", "bad", "--state", "cancelled",
                   "--yes", user=logins.operator, check=True)
    assert "no cancelled jobs of kind 'bad' in cli" in again.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["retry", "--queue", "cli", "--state", "cancelled"],
     {"queue": "cli", "kind": None, "state": "cancelled", "retried": 0, "more": False}),
    (["retry", "--queue", "cli", "--kind", "nokind"],
     {"queue": "cli", "kind": "nokind", "state": "failed", "retried": 0, "more": False}),
    (["cancel", "--queue", "cli", "--kind", "nokind"],
     {"queue": "cli", "kind": "nokind", "cancelled": 0, "more": False}),
])
def test_a_bulk_change_that_finds_no_jobs_still_answers_in_json(db, logins, failed, args,
                                                                 expected):
    """With --json, a bulk retry or cancel that found nothing printed "no
    cancelled jobs in cli", which a script reading JSON cannot parse."""
    done = db.awa("jobs", *args, "--yes", "--json", user=logins.operator, check=True)
    assert json.loads(done.stdout) == expected
    assert [_state(db, j) for j in failed["failed"]] == ["failed"] * 5


def test_a_bulk_retry_of_cancelled_jobs_says_those_left_cancelled_and_why(db, logins):
    """The count and the "not retried" message name the state asked for, and
    the list command they point to lists that state."""
    with db.connect(logins.producer) as p:
        keyed = enqueue(p, "ukc", unique_key=b"k")[0]
        enqueue(p, "ukc")
    db.awa("jobs", "cancel", "--queue", "ukc", "--yes", user=logins.operator, check=True)
    with db.connect(logins.producer) as p:
        assert enqueue(p, "ukc", unique_key=b"k")[0] != keyed  # the cancel gave the key back
    retried = db.awa("jobs", "retry", "--queue", "ukc", "--state", "cancelled", "--yes",
                     user=logins.operator, check=True)
    assert retried.stdout.strip() == "retried 1 job of ukc"
    assert "1 of the 2 cancelled jobs counted was not retried: another job of its queue " \
           "holds its unique key" in retried.stderr, retried.stderr
    assert "awa jobs list --queue ukc --state cancelled lists it" in retried.stderr
    assert _state(db, keyed) == "cancelled"


def test_the_retry_states_the_cli_offers_are_the_database_s(db):
    with db.connect() as su:
        assert su.execute("select awa._retry_states()").fetchone()[0] == list(RETRY_STATES)


def test_a_bulk_cancel_past_the_count_says_that_more_may_be_left(db, logins):
    """One run counts at most 100,000 jobs a state and stops there (so that
    jobs failing again are not retried round and round); with --yes it said
    only 'cancelled 100000 jobs' and exited 0 with the rest left."""
    with db.connect(logins.producer) as p:
        p.execute("select count(*) from awa.enqueue_batch("
                  " array_fill('bulk'::text, array[100001]), array_fill('k'::text, array[100001]))")
    done = db.awa("jobs", "cancel", "--queue", "bulk", "--batch", "100000", "--yes", "--json",
                  user=logins.operator, check=True, timeout=300)
    assert json.loads(done.stdout) == {"queue": "bulk", "kind": None, "cancelled": 100_000,
                                       "more": True}
    assert "more may be left; run the command again" in done.stderr
    again = db.awa("jobs", "cancel", "--queue", "bulk", "--yes", user=logins.operator,
                   check=True)
    assert "cancelled 1 job of bulk" in again.stdout and "more may" not in again.stderr


def test_an_error_without_a_sqlstate_prints_no_bracket(db, logins):
    """A connection refused has no SQLSTATE to print."""
    result = db.awa("jobs", "list", "--queue", "q", user=logins.reader,
                    env={"AWA_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert result.returncode == 7, result.stderr
    assert result.stderr.startswith("awa: "), result.stderr
    assert "None" not in result.stderr and "[" not in result.stderr.splitlines()[0]


def test_a_job_due_past_year_9999_is_listed_and_shown(db, logins):
    """Python cannot hold such a date: psycopg raised DataError and the
    tools failed on the whole queue. Enqueues refuse such a time now (ADR
    043); a job stored before they did is shown at datetime's last moment."""
    with db.connect(logins.producer) as p:
        job = enqueue(p, "far", run_at="2999-01-01")[0]
        enqueue(p, "far")
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = 'infinity' where job_id = %s", [job])
    listed = db.awa("jobs", "list", "--queue", "far", user=logins.reader)
    assert listed.returncode == 0, listed.stderr
    assert str(job) in listed.stdout and "9999-12-31" in listed.stdout
    shown = db.awa("jobs", "show", str(job), user=logins.reader)
    assert shown.returncode == 0, shown.stderr
    assert "9999-12-31" in shown.stdout


def test_bulk_wording_for_one_job_is_singular(db, logins):
    with db.connect(logins.producer) as p:
        failing = enqueue(p, "one", max_attempts=1)[0]
        enqueue(p, "one")
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["one"], 1)
        assert job_id == failing
        w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    asked = db.awa("jobs", "retry", "--queue", "one", user=logins.operator)
    assert "Retry 1 failed job of one?" in asked.stderr, asked.stderr
    retried = db.awa("jobs", "retry", "--queue", "one", "--yes", user=logins.operator,
                     check=True)
    assert retried.stdout.strip() == "retried 1 job of one"
    cancelled = db.awa("jobs", "cancel", "--queue", "one", "--yes", user=logins.operator,
                       check=True)
    assert cancelled.stdout.strip() == "cancelled 2 jobs of one"


@pytest.mark.parametrize("args", [
    ["storage", "show"],
    ["jobs", "list", "--queue", "cli", "--json"],
    ["jobs", "show", "1"],
])
def test_a_closed_stdout_ends_any_command_quietly(db, logins, failed, args):
    """As `awa storage show | head` once head has gone: the pipe's read end is
    closed before the command writes anything."""
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "awa_sql", *args], stdout=write, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, timeout=120, check=False,
            env={**os.environ, "AWA_DATABASE_URL": db.dsn(logins.reader)})
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")


def test_far_dates_load_as_datetime_s_ends_in_text_and_binary(db):
    from datetime import UTC, datetime

    from awa_sql.connect import read_far_dates
    last, first = datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)
    with db.connect() as conn:
        read_far_dates(conn)
        for binary in (False, True):
            got = conn.cursor(binary=binary).execute(
                "select 'infinity'::timestamptz, '-infinity'::timestamptz,"
                " '12000-01-01 00:00+00'::timestamptz, '0044-03-15 00:00+00 BC'::timestamptz,"
                " '2020-01-01 00:00+00'::timestamptz").fetchone()
            assert got == (last, first, last, first, datetime(2020, 1, 1, tzinfo=UTC)), binary


def test_list_of_running_jobs_names_their_worker_and_lease(db, logins, failed):
    """What an operator needs to find a dead worker's jobs and to call
    awa.release_worker with its name."""
    running = db.awa("jobs", "list", "--queue", "cli", "--state", "running",
                     user=logins.reader, check=True)
    header, _, row = running.stdout.splitlines()[:3]
    assert "worker" in header and "lease until" in header
    assert str(failed["running"]) in row and " w " in f" {row} "
    failed_only = db.awa("jobs", "list", "--queue", "cli", "--state", "failed",
                         user=logins.reader, check=True)
    assert "worker" not in failed_only.stdout.splitlines()[0]


def test_list_of_one_worker_shows_its_running_jobs_only_and_pages_them(db, logins, failed):
    """`--worker NAME`: the jobs awa.release_worker('NAME') would release."""
    with db.connect(logins.producer) as p:
        mine = [enqueue(p, "cli", "mail")[0] for _ in range(3)]
    with db.connect(logins.worker) as w:
        # The fixture's running job and its ready one are w's and the first
        # here; then two of ours and one of another worker's, interleaved.
        assert [r[0] for r in claim(w, ["cli"], 1)] == [failed["ready"]]
        assert [r[0] for r in claim(w, ["cli"], 1, worker="other")] == [mine[0]]
        assert [r[0] for r in claim(w, ["cli"], 2)] == mine[1:]
    ws = [failed["running"], failed["ready"], *mine[1:]]
    listed = db.awa("jobs", "list", "--queue", "cli", "--worker", "w", user=logins.reader,
                    check=True).stdout.splitlines()
    assert "worker" in listed[0] and "lease until" in listed[0]
    assert [int(line.split()[0]) for line in listed[2:]] == ws
    assert all(line.split()[1] == "running" and " w " in f" {line} " for line in listed[2:])
    first = json.loads(db.awa("jobs", "list", "--queue", "cli", "--worker", "w", "--state",
                              "running", "--limit", "3", "--json", user=logins.reader,
                              check=True).stdout)
    assert [(j["job_id"], j["worker"]) for j in first["jobs"]] == [(i, "w") for i in ws[:3]]
    assert first["next_after"] == ws[2]
    rest = json.loads(db.awa("jobs", "list", "--queue", "cli", "--worker", "w", "--after",
                             str(first["next_after"]), "--limit", "3", "--json",
                             user=logins.reader, check=True).stdout)
    assert [j["job_id"] for j in rest["jobs"]] == ws[3:] and rest["next_after"] is None
    other = db.awa("jobs", "list", "--queue", "cli", "--worker", "other", "--json",
                   user=logins.reader, check=True).stdout
    assert [j["job_id"] for j in json.loads(other)["jobs"]] == [mine[0]]
    nobody = db.awa("jobs", "list", "--queue", "cli", "--worker", "gone-1", user=logins.reader,
                    check=True)
    assert nobody.stdout.strip() == "no running jobs held by worker 'gone-1' in cli"


@pytest.mark.parametrize("state", ["failed", "ready", "scheduled"])
def test_list_of_one_worker_with_another_state_exits_2_naming_both(db, logins, failed, state):
    result = db.awa("jobs", "list", "--queue", "cli", "--worker", "w", "--state", state,
                    user=logins.reader)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == (
        f"awa: --worker 'w' lists running jobs only (a worker holds no others): drop --state "
        f"{state}, or give --state running")


def test_release_worker_ends_a_dead_workers_leases_and_the_rescue_retries_its_jobs(
        db, logins, failed):
    """`awa jobs release-worker NAME`: the runbook's step for a worker known
    dead, without SQL. Its running job's lease ends now, another worker's
    is left, and the next rescue pass sends the job back to retry."""
    with db.connect(logins.worker) as w:
        assert claim(w, ["cli"], 1, worker="alive")[0][0] == failed["ready"]
    refused = db.awa("jobs", "release-worker", "w", user=logins.reader)
    assert refused.returncode == 7 and "awa_operator" in refused.stderr
    got = db.awa("jobs", "release-worker", "w", user=logins.operator, check=True)
    assert got.stdout.strip() == ("ended the leases of 1 running job of worker w: the next "
                                  "rescue pass of awa maintain sends it back to retry, the "
                                  "attempt counted")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
    assert _state(db, failed["running"]) in ("scheduled", "ready")
    assert _state(db, failed["ready"]) == "running"  # the other worker's, untouched
    again = db.awa("jobs", "release-worker", "w", "--json", user=logins.operator, check=True)
    assert json.loads(again.stdout) == {"worker": "w", "released": 0}
    none = db.awa("jobs", "release-worker", "w", user=logins.operator, check=True)
    assert none.stdout.strip() == "worker w runs no job: nothing changed"


def test_bulk_retry_and_cancel_work_under_any_datestyle(db, logins, failed):
    """The bound is the server's clock, read in binary: its text form under
    a DateStyle psycopg does not parse ('SQL, DMY') failed the command with
    a traceback."""
    env = {"PGOPTIONS": "-c DateStyle=SQL,DMY"}
    retried = db.awa("jobs", "retry", "--queue", "cli", "--yes", user=logins.operator,
                     env=env, check=True)
    assert "retried 5 jobs of cli" in retried.stdout
    cancelled = db.awa("jobs", "cancel", "--queue", "cli", "--yes", user=logins.operator,
                       env=env, check=True)
    assert "cancelled 6 jobs of cli" in cancelled.stdout
