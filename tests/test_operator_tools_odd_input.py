"""The admin API and the CLI on what producers and workers may write: args
that are valid jsonb but that Python's JSON decoder refuses, names and
errors holding terminal escape sequences; and the API's and CLI's answers
to a deadlock, a bulk retry that fails part way, a token no client can send."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from psycopg.types.json import Jsonb

from awa_sql.admin.app import Settings, create_app, token_problem
from awa_sql.admin.errors import TRY_AGAIN, from_database
from awa_sql.cli.common import printable
from awa_sql.cli.storage import table
from tests.support.admin import client_for, reader_login
from tests.support.jobs import claim, enqueue

pytestmark = pytest.mark.one_version

LOCK_TIMEOUT = 5  # exit code of a lock timeout (docs/admin.md)

# Valid jsonb that json.loads refuses: an integer of 5001 digits (jsonb keeps
# 1e5000 as one), and arrays nested 3000 deep.
BIG_NUMBER = '{"x": 1e5000}'
DEEP = '{"a":' + "[" * 3000 + "]" * 3000 + "}"


@pytest.fixture
def undecodable(db, logins):
    """Queue 'odd': a job with args {"ok": 1}, one with a 5001-digit number,
    one nested 3000 deep, in that order of job id."""
    with db.connect(logins.producer) as p:
        return [enqueue(p, "odd", "t", args=Jsonb({"ok": 1}))[0],
                *(p.execute("select job_id from awa.enqueue('odd', 't', %s::jsonb)",
                            [text]).fetchone()[0] for text in (BIG_NUMBER, DEEP))]


def _is_marker(args: object, error: str) -> bool:
    return (isinstance(args, dict) and list(args) == ["undecodable"]
            and args["undecodable"].startswith(error))


def test_the_api_shows_args_python_cannot_decode_as_a_marker(db, undecodable):
    ok, big, deep = undecodable
    with client_for(db.dsn(reader_login(db)), writable=False) as api:
        for job_id, error in ((big, "ValueError: Exceeds the limit (4300 digits)"),
                              (deep, "RecursionError")):
            got = api.get(f"/api/jobs/{job_id}")
            assert got.status_code == 200, got.text
            assert got.json()["job_id"] == job_id
            assert _is_marker(got.json()["args"], error), got.json()["args"]
        page = api.get("/api/queues/odd/jobs")
        assert page.status_code == 200, page.text
        jobs = page.json()["jobs"]
    assert [j["job_id"] for j in jobs] == [ok, big, deep]
    assert jobs[0]["args"] == {"ok": 1}
    assert _is_marker(jobs[1]["args"], "ValueError") and _is_marker(jobs[2]["args"],
                                                                      "RecursionError")


def test_awa_jobs_shows_args_python_cannot_decode_as_a_marker(db, logins, undecodable):
    ok, big, deep = undecodable
    for job_id, error in ((big, "ValueError"), (deep, "RecursionError")):
        shown = db.awa("jobs", "show", str(job_id), "--json", user=logins.reader)
        assert shown.returncode == 0, shown.stderr
        assert _is_marker(json.loads(shown.stdout)["args"], error), shown.stdout
        text = db.awa("jobs", "show", str(job_id), user=logins.reader)
        assert text.returncode == 0, text.stderr
        assert '"undecodable": "' + error in text.stdout, text.stdout
    listed = db.awa("jobs", "list", "--queue", "odd", "--json", user=logins.reader)
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["job_id"], j["args"]) for j in jobs[:1]] == [(ok, {"ok": 1})]
    assert _is_marker(jobs[1]["args"], "ValueError") and _is_marker(jobs[2]["args"],
                                                                      "RecursionError")


# -- what a terminal is shown --------------------------------------------------------------

# A queue name that clears the screen, retitles the window and forges a row.
FORGED = "a\x1b[2J\x1b]0;pwned\x07\nzz-forged  64  auto"


def test_printable_escapes_controls_and_format_characters_only():
    assert printable("orders é 中文 😀") == "orders é 中文 😀"
    assert printable(FORGED) == "a\\x1b[2J\\x1b]0;pwned\\x07\\nzz-forged  64  auto"
    # C1 (CSI, NEL), DEL, the line and paragraph separators, a bidi override,
    # a zero-width space: each as its escape.
    assert (printable("\x9b\x85\x7f\u2028\u2029\u202e\u200b")
            == "\\x9b\\x85\\x7f\\u2028\\u2029\\u202e\\u200b")
    assert printable("line 1\n\tline 2\r\x1b", keep="\n\t") == "line 1\n\tline 2\\r\\x1b"
    # The joiners, which join what a reader sees and move no cursor, stay:
    # an emoji sequence, a Persian word, a subdivision flag.
    for text in ("\U0001f469\u200d\U0001f4bb", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
                 "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"):
        assert printable(text) == text
    assert table(["queue"], [[FORGED]]).splitlines()[2] == printable(FORGED)


def _unsafe(text: str) -> list[str]:
    return [c for c in text if c != "\n" and not c.isprintable()]


def test_storage_show_escapes_a_queue_name_and_json_keeps_it(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue(%s, 't', '{}'::jsonb)", [FORGED])
    shown = db.awa("storage", "show", user=logins.reader)
    assert shown.returncode == 0, shown.stderr
    assert _unsafe(shown.stdout) == [], repr(shown.stdout)
    assert not any(line.startswith("zz-forged") for line in shown.stdout.splitlines())
    assert shown.stdout.splitlines()[2].startswith(printable(FORGED) + "  1  manual")
    assert f"lanes of {printable(FORGED)} (S = 1)" in shown.stdout
    as_json = db.awa("storage", "show", "--json", user=logins.reader)
    assert [q["queue"] for q in json.loads(as_json.stdout)["queues"]] == [FORGED]


def test_awa_jobs_escapes_kind_worker_and_error_and_json_keeps_them(db, logins):
    kind, worker, error = "k\x1b[8m", "w\x9b2J\u202e", "boom\x1b]0;x\x07\nat line 2"
    with db.connect(logins.producer) as p:
        failed = enqueue(p, "esc", kind, max_attempts=1)[0]
        running = enqueue(p, "esc", kind)[0]
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["esc"], n=1, worker=worker)
        assert job_id == failed
        w.execute("select awa.fail(%s, %s, %s)", [job_id, lease, error])
        assert claim(w, ["esc"], n=1, worker=worker)[0][0] == running
    listed = db.awa("jobs", "list", "--queue", "esc", user=logins.reader)
    assert listed.returncode == 0, listed.stderr
    assert _unsafe(listed.stdout) == [], repr(listed.stdout)
    assert printable(kind) in listed.stdout and printable(worker) in listed.stdout
    assert "boom\\x1b]0;x\\x07 at line 2" in listed.stdout  # one line, as before
    for job_id in (failed, running):
        shown = db.awa("jobs", "show", str(job_id), user=logins.reader)
        assert shown.returncode == 0, shown.stderr
        assert _unsafe(shown.stdout) == [], repr(shown.stdout)
    assert shown.stdout.splitlines()[1:2] == ["state          running"]
    assert f"worker         {printable(worker)}" in shown.stdout.splitlines()
    failed_text = db.awa("jobs", "show", str(failed), user=logins.reader).stdout
    assert failed_text.endswith("last error\nboom\\x1b]0;x\\x07\nat line 2\n"), failed_text
    as_json = json.loads(db.awa("jobs", "show", str(failed), "--json",
                                user=logins.reader).stdout)
    assert (as_json["kind"], as_json["last_error"]) == (kind, error)


# -- a deadlock ----------------------------------------------------------------------------


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_rolled_back_transaction_is_409_try_again(db, sqlstate):
    with db.connect() as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute(f"do $$ begin raise exception 'rolled back' using errcode = '{sqlstate}';"
                     " end $$")
    mapped = from_database(raised.value, write=True)
    assert mapped is not None
    assert mapped.body() == {"error": "rolled back", "sqlstate": sqlstate, "hint": TRY_AGAIN}
    assert mapped.status == 409


# -- a bulk retry that fails part way ------------------------------------------------------


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_bulk_retry_that_fails_part_way_says_what_it_committed(db, logins, as_json):
    """Two failed jobs; an operator's open transaction has retried the
    second (uncommitted: its row stays locked). Batches of one: the first
    retries the first job and commits, the second waits 5 s for the lock."""
    with db.connect(logins.producer) as p:
        for priority in (2, 1):
            p.execute("select awa.enqueue('part', 'k', max_attempts => 1,"
                      " priority => %s::smallint)", [priority])
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["part"]):
            w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect() as su:
        first, second = (r[0] for r in su.execute(
            "select job_id from awa.jobs('part', 'failed') order by priority desc").fetchall())
    with db.connect(logins.operator, autocommit=False) as holder:
        holder.execute("select awa.retry_job(%s)", [second])
        got = db.awa("jobs", "retry", "--queue", "part", "--batch", "1", "--yes",
                     *(["--json"] if as_json else []), user=logins.operator)
        holder.rollback()
    assert got.returncode == LOCK_TIMEOUT, got.stderr
    if as_json:
        out = json.loads(got.stdout)
        assert out["error"]["sqlstate"] == "55P03", out
        assert {k: out[k] for k in ("queue", "state", "retried", "more")} == {
            "queue": "part", "state": "failed", "retried": 1, "more": True}
    else:
        assert got.stdout == "retried 1 job of part\n"
    assert "earlier batches were committed: the 1 job they retried stays retried" in got.stderr
    assert "lock timeout" in got.stderr
    with db.connect() as su:
        states = dict(su.execute("select job_id, state from awa.jobs('part')").fetchall())
    assert states == {first: "ready", second: "failed"}


# -- a token no client can send ------------------------------------------------------------


@pytest.mark.parametrize("token, problem", [
    ("0123456789abcdef0123\n", "ends with whitespace ('\\n')"),
    (" 0123456789abcdef0123", "starts with whitespace (' ')"),
    ("pässwörd-0123456789ab", "a non-ASCII character (U+00E4) at character 2"),
    ("0123456789\tabcdef0123", "a control character (\\t) at character 11"),
])
def test_a_token_no_http_client_can_send_is_refused_at_start(db, token, problem):
    assert problem in (token_problem(token) or "")
    with pytest.raises(ValueError, match=re.escape(problem)):
        create_app(Settings(dsn=db.dsn(), writable=True, token=token))
    served = db.awa("admin", "serve", "--writable", "--port", "0",
                    env={"AWA_ADMIN_TOKEN": token}, timeout=60)
    assert served.returncode == 2, served.stdout + served.stderr
    assert served.stdout == ""
    assert served.stderr.startswith("awa: AWA_ADMIN_TOKEN "), served.stderr
    assert problem in served.stderr, served.stderr


def test_a_token_with_inner_spaces_and_punctuation_is_taken():
    assert token_problem("correct horse battery staple !#$%&'*+-./") is None


def test_a_bulk_batch_lost_with_its_connection_may_have_been_applied(capsys):
    """A batch whose error has no SQLSTATE lost its connection, maybe during
    its COMMIT: the message does not say it was not applied."""
    import argparse

    from awa_sql.cli.jobs import _say_partial

    args = argparse.Namespace(json=False, queue="q")
    _say_partial(args, "retried", "", 2, psycopg.OperationalError("server closed the connection"))
    said = capsys.readouterr()
    assert said.out == "retried 2 jobs of q\n"
    assert "the batch that failed may or may not have been applied, the rest were not" in said.err
    assert "the rest of the queue's were not" not in said.err
