"""A migration that rebuilds a table a view of the function layer reads, as
0015 rebuilt awa.finished under the earlier layer's awa.queue_overview: the
runner runs it again after dropping the function layer's views, which the
layer step makes again; a view of someone else's on them stops the run,
and one of someone else's in schema awa is never dropped."""

from __future__ import annotations

import subprocess

import psycopg
import pytest
from psycopg import sql

from awa_sql import migrate
from awa_sql.roles import Roles
from awa_sql.source import Migration, checksum, load_layer, load_migrations
from tests.support.catalog import snapshot

MIGRATIONS = load_migrations()
LAYER = load_layer()

# What 0015 did to awa.finished, to a table that views of this layer read
# (awa.lane_contention and awa.queue_history): renamed, made again like it,
# its rows copied, the old one dropped.
REBUILD = """\
alter table awa.contention_samples rename to contention_samples_old;
alter index awa.contention_samples_pkey rename to contention_samples_old_pkey;
alter index awa.contention_samples_sampled_at_idx
rename to contention_samples_old_sampled_at_idx;
create table awa.contention_samples (like awa.contention_samples_old including all);
do $$
begin
    execute format('comment on table awa.contention_samples is %L',
                   obj_description('awa.contention_samples_old'::regclass, 'pg_class'));
end;
$$;
insert into awa.contention_samples select * from awa.contention_samples_old;
drop table awa.contention_samples_old;
"""
EXTRA = Migration(version=MIGRATIONS[-1].version + 1, name="rebuild_samples", text=REBUILD,
                  checksum=checksum(REBUILD.encode()), transactional=True)
WITH_EXTRA = [*MIGRATIONS, EXTRA]

VIEWS = """
    select c.relname, pg_catalog.pg_get_viewdef(c.oid), c.relacl::text
      from pg_catalog.pg_class c
     where c.relnamespace = 'awa'::regnamespace and c.relkind = 'v'
     order by 1
"""


def _samples(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("select * from awa.contention_samples order by queue_id, sampled_at"
                        ).fetchall()


def _fill(conn: psycopg.Connection) -> None:
    conn.execute("select awa.enqueue('views-q', 'k')")
    for _ in range(3):
        conn.execute("select awa.sample_lane_contention()")
    assert _samples(conn), "no sample taken"


def _run(conn: psycopg.Connection, lines: list[str]) -> migrate.Plan:
    return migrate.migrate(conn, Roles(), migrations=WITH_EXTRA, layer=LAYER, log=lines.append)


def test_a_migration_under_a_layer_view_runs_again_without_the_views(db):
    """The first try fails on awa.lane_contention (2BP01); the run says so in
    one line, runs the migration again after dropping the layer's views,
    and the layer step makes them again, with their grants and
    comments: the catalog is as the layer leaves it, the rows are kept and the
    gate finds nothing pending or broken. The run's login is not a
    superuser, only a member of the owner role."""
    with db.connect() as conn:
        _fill(conn)
        rows = _samples(conn)
        # The layer applied again, the reference (it gives the queue's
        # sequences an ACL of their own).
        conn.execute("delete from awa.schema_functions")
        migrate.migrate(conn, Roles(), layer=LAYER, log=lambda _line: None)
        views, before = conn.execute(VIEWS).fetchall(), snapshot(conn)
    assert {v[0] for v in views} >= {"lane_contention", "queue_history", "queue_overview"}

    lines: list[str] = []
    with db.connect(db.login_role("awa_owner")) as conn:
        _run(conn, lines)
    again = [line for line in lines if "running it again" in line]
    assert again == [
        f"migration {EXTRA.label} failed on what the function layer's views read"
        " (awa.lane_contention, awa.queue_history): running it again after dropping the"
        " function layer's views, which the layer makes again"], lines
    assert f"applied migration {EXTRA.label}" in " ".join(lines)
    assert any(line.startswith("applied function layer") for line in lines), lines

    with db.connect() as conn:
        assert _samples(conn) == rows
        assert conn.execute(VIEWS).fetchall() == views
        assert snapshot(conn) == before
        assert conn.execute("select count(*) from awa._security_violations()").fetchone()[0] == 0
        gate = migrate.build_plan(migrate.read_state_in_transaction(conn, Roles()), Roles(),
                                  migrations=WITH_EXTRA, layer=LAYER)
    assert gate.up_to_date and gate.security == [] and gate.layer_changes == []
    reader = db.login_role("awa_reader")
    with db.connect(reader) as conn:
        assert conn.execute("select count(*) from awa.queue_history").fetchone()[0] >= 1


def test_a_normal_upgrade_drops_no_view(db):
    """Only that failure drops the views: a migration that no view's read
    stands in the way of leaves each view as it was (the same row of
    pg_class, not one made again)."""
    touch = "comment on table awa.contention_samples is 'rebuilt later';\n"
    plain = Migration(version=EXTRA.version, name="comment", text=touch,
                      checksum=checksum(touch.encode()), transactional=True)
    views = "select relname, oid, xmin::text from pg_class where relkind = 'v'" \
            " and relnamespace = 'awa'::regnamespace order by 1"
    lines: list[str] = []
    with db.connect() as conn:
        before = conn.execute(views).fetchall()
        migrate.migrate(conn, Roles(), migrations=[*MIGRATIONS, plain], layer=LAYER,
                        log=lines.append)
        assert conn.execute(views).fetchall() == before
    assert not any("running it again" in line for line in lines), lines


@pytest.mark.parametrize("owner", ["the superuser", "another login"])
def test_a_view_of_someone_else_on_a_layer_view_stops_the_run_naming_it(db, owner):
    """A view of the user's on awa.queue_overview keeps the views of schema
    awa from being dropped: never dropped with them, it stops the run, its
    name in the message, and the migration, the views and the rows stay as
    they were."""
    with db.connect() as conn:
        _fill(conn)
        if owner == "another login":
            login = db.login_role("awa_reader")
            conn.execute(sql.SQL("grant create on schema public to {}").format(
                sql.Identifier(login)))
        else:
            login = None
    with db.connect(login) as conn:
        conn.execute("create view public.my_queues as select queue from awa.queue_overview")
    with db.connect() as conn:
        rows, before = _samples(conn), snapshot(conn)
        applied = conn.execute("select count(*) from awa.schema_migrations").fetchone()[0]
        lines: list[str] = []
        with pytest.raises(migrate.MigrationError) as stopped:
            _run(conn, lines)
        message = str(stopped.value)
        assert stopped.value.exit_code == migrate.EXIT_ERROR
        assert "view public.my_queues depends on view awa.queue_overview" in message, message
        assert f"migration {EXTRA.label} failed and was rolled back" in message, message
        assert "Nothing of this step was applied" in message, message
        assert any("running it again" in line for line in lines), lines
        assert not any(line.startswith("applied") for line in lines), lines
        assert conn.execute("select count(*) from awa.schema_migrations").fetchone()[0] \
            == applied
        assert snapshot(conn) == before
        assert _samples(conn) == rows
        assert conn.execute("select count(*) from public.my_queues").fetchone()[0] >= 1


def test_views_of_someone_else_in_schema_awa_are_never_dropped(db):
    """The layer's views are those its files put in place: a view of the
    user's in schema awa is not one. One on a layer view stops the run,
    named; one on nothing of the layer's outlives a run that drops the
    layer's views."""
    assert set(migrate.layer_views()) >= {"awa.lane_contention", "awa.queue_history",
                                          "awa.queue_overview"}
    with db.connect() as conn:
        _fill(conn)
        # Made as the owner role: the runner refuses objects of another owner.
        conn.execute("set role awa_owner")
        conn.execute("create view awa.my_note as select 1 as one")
        conn.execute("create view awa.my_history as select * from awa.queue_history")
        conn.execute("reset role")
        with pytest.raises(migrate.MigrationError) as stopped:
            _run(conn, [])
        assert "view awa.my_history depends on view awa.queue_history" in str(stopped.value)
        conn.execute("drop view awa.my_history")
        lines: list[str] = []
        _run(conn, lines)
        assert any("running it again" in line for line in lines), lines
        assert conn.execute("select * from awa.my_note").fetchall() == [(1,)]


def _psql(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
        input=script, capture_output=True, text=True, check=False, timeout=120,
    )


def test_a_script_stops_there_and_its_header_says_how_to_get_through(db):
    """A --sql script cannot run the migration again: it stops at it,
    leaving the views. The statement its header gives (for psql's \\gexec)
    drops the layer's views; the script rendered again gets through,
    and its layer step makes them again."""
    def script() -> str:
        with db.connect() as conn:
            state = migrate.read_state_in_transaction(conn, Roles())
        return migrate.render_sql(migrate.build_plan(state, Roles(), migrations=WITH_EXTRA,
                                                     layer=LAYER))

    with db.connect() as conn:
        _fill(conn)
        rows, views = _samples(conn), conn.execute(VIEWS).fetchall()
    first = script()
    stopped = _psql(db.dsn(), first)
    assert stopped.returncode != 0
    assert "cannot drop table awa.contention_samples_old" in stopped.stderr, stopped.stderr
    with db.connect() as conn:
        assert conn.execute(VIEWS).fetchall() == views  # the header's comment ran nothing

    header = first[:first.index("\\set ON_ERROR_STOP on")]
    assert "SQLSTATE 2BP01" in header
    drop = "".join(line.removeprefix("--   ") + "\n" for line in header.splitlines()
                   if line.startswith("--   "))
    assert drop.rstrip().endswith("\\gexec")
    dropped = _psql(db.dsn(), drop)
    assert dropped.returncode == 0, dropped.stderr
    with db.connect() as conn:
        assert conn.execute(VIEWS).fetchall() == []

    through = _psql(db.dsn(), script())
    assert through.returncode == 0, through.stderr
    with db.connect() as conn:
        assert conn.execute(VIEWS).fetchall() == views
        assert _samples(conn) == rows
        assert conn.execute("select count(*) from awa._security_violations()").fetchone()[0] == 0
        assert conn.execute("select max(version) from awa.schema_migrations").fetchone()[0] \
            == EXTRA.version
