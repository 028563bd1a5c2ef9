"""The deploy gate (awa._security_violations, read by `awa status --check` and
`awa migrate`) against grants it once missed, and the capability a runtime
snapshot's kind claims (docs/security.md)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from psycopg import sql

from tests.support.jobs import enqueue

PUBLISH = "select awa.publish_runtime(%s::uuid, %s, 'h', 42, '0.1.0', 0, %s::jsonb)"


def _public_columns(conn) -> list[tuple[str, str]]:
    return conn.execute(
        "select c.oid::regclass::text, t.attname::text from pg_class c"
        " join pg_attribute t on t.attrelid = c.oid"
        " where c.relnamespace = 'awa'::regnamespace and t.attacl is not null"
        "   and exists (select from aclexplode(t.attacl) a where a.grantee = 0)"
        " order by 1, 2").fetchall()


def test_a_column_granted_to_public_fails_the_gate_and_migrate_revokes_it(db, logins):
    """Column privileges live in pg_attribute, not in the relation's ACL: the
    gate read only the latter, and a producer could read every job's args."""
    with db.connect(logins.producer) as p:
        enqueue(p, "secret", args=psycopg.types.json.Jsonb({"card": "4111"}))
    with db.connect() as su:
        su.execute("grant select (args) on awa.ready to public")
        su.execute("grant insert (staged_xid) on awa.copy_staging to public")
    with db.connect(logins.producer) as p:  # the damage
        assert p.execute("select args from awa.ready").fetchall() == [({"card": "4111"},)]

    gate = db.awa("status", "--check")
    assert gate.returncode == 10, gate.stdout + gate.stderr
    assert ("relations or columns PUBLIC may use: awa.copy_staging (staged_xid), awa.ready (args)"
            in gate.stdout), gate.stdout

    repaired = db.awa("migrate", check=True)
    assert "applied function layer" in repaired.stdout, repaired.stdout
    assert db.awa("status", "--check").returncode == 0
    with db.connect() as su:
        assert _public_columns(su) == []
        assert su.execute("select * from awa._security_violations()").fetchall() == []
    with db.connect(logins.producer) as p, pytest.raises(psycopg.errors.InsufficientPrivilege):
        p.execute("select args from awa.ready")


def _install(empty_db, prefix: str) -> None:
    empty_db.awa("migrate", "--create-roles", "--role-prefix", prefix, check=True)


def _grant(db, role: str, to: str) -> None:
    with db.cluster.admin() as su:
        su.execute(sql.SQL("grant {} to {}").format(sql.Identifier(role), sql.Identifier(to)))


# (granted, to, what the gate names, a call the grant lets the member's login
# make); {p} is the role prefix, {app} a login holding the producer role.
MEMBERSHIPS = {
    "the operator role to the producer role": (
        "{p}operator", "{p}producer", "{p}producer is a member of {p}operator",
        "select count(*) from awa.queue_overview"),
    "the owner role to the worker role": (
        "{p}owner", "{p}worker", "{p}worker is a member of {p}owner",
        "select count(*) from awa.ready"),
    "a producer's login to the reader role": (
        "{app}", "{p}reader", "{p}reader is a member of {p}producer through {app}",
        "select awa.enqueue('q', 'k')"),
}


def test_a_bound_role_granted_to_another_fails_the_gate(empty_db, role_prefix):
    """GRANT awa_operator TO awa_producer gives every producer login the
    operator's functions with no grant on any of awa's objects, so the
    grants rule never saw it. The gate names the membership, with the roles
    of this database's role map; awa migrate, which runs as the owner and
    cannot revoke a role, fails naming it too, and the gate passes once it
    is revoked. Each of MEMBERSHIPS in turn, on one install."""
    db, p = empty_db, role_prefix
    _install(db, p)
    app = db.login_role(f"{p}producer")
    for grant in MEMBERSHIPS:
        _membership_fails_the_gate_until_revoked(db, p, app, grant)


def _membership_fails_the_gate_until_revoked(db, p: str, app: str, grant: str) -> None:
    granted, to, named, call = (x.format(p=p, app=app) for x in MEMBERSHIPS[grant])
    member = db.login_role(to)
    with db.connect(member) as m, pytest.raises(psycopg.errors.InsufficientPrivilege):
        m.execute(call)
    _grant(db, granted, to)
    with db.connect(member) as m:  # the escalation
        m.execute(call)

    gate = db.awa("status", "--check", "--role-prefix", p)
    assert gate.returncode == 6, (grant, gate.stdout + gate.stderr)
    assert f"problem: bound roles granted to one another: {named}" in gate.stdout, \
        (grant, gate.stdout)
    applied = "select max(applied_at) from awa.schema_functions"
    with db.connect() as su:
        layer_at = su.execute(applied).fetchone()[0]
    migrated = db.awa("migrate", "--role-prefix", p)
    # Refused before any step: the layer step, run as the owner, cannot revoke it.
    assert migrated.returncode == 6, migrated.stdout + migrated.stderr
    assert named in migrated.stderr and "REVOKE each such grant" in migrated.stderr
    with db.connect() as su:
        assert su.execute(applied).fetchone()[0] == layer_at
    with db.connect() as su:
        (hint,) = su.execute("select hint from awa._security_violations()"
                             " where rule = 'role_membership'").fetchone()
    assert f"GRANT {p}producer, {p}worker TO app" in hint, hint

    with db.cluster.admin() as su:
        su.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(granted),
                                                      sql.Identifier(to)))
    with db.connect() as su:
        assert su.execute("select * from awa._security_violations()").fetchall() == []


def test_a_login_holding_two_runtime_roles_passes_the_gate(db):
    """Two capabilities are two roles granted to the login: no bound role is
    a member of another. A login holding the owner role (the one that runs
    awa migrate) is not a bound role either."""
    db.login_role("awa_producer", "awa_worker")
    db.login_role("awa_operator", "awa_reader", "awa_maintenance")
    db.login_role("awa_owner")
    with db.connect() as su:
        assert su.execute("select * from awa._security_violations()").fetchall() == []
    gate = db.awa("status")
    assert "security:" not in gate.stdout, gate.stdout


def _snapshot(kind: str, activity: str) -> str:
    return json.dumps([{"queue": "alpha", "activity": activity, "age_seconds": 0}])


def test_a_snapshot_kind_needs_its_role(db, logins):
    """A runtime's kind is shown as a capability (awa.runtime_overview, the
    admin page): a producer-only login published worker snapshots with
    claims, listed as a worker claiming from the queue."""
    with db.connect(logins.producer) as p:
        enqueue(p, "alpha")
    refused = [(logins.producer, "worker", "claim"), (logins.worker, "producer", "enqueue")]
    role = {"worker": "awa_worker", "producer": "awa_producer"}
    for login, kind, activity in refused:
        with db.connect(login) as c, pytest.raises(
                psycopg.errors.InsufficientPrivilege,
                match=f"awa.publish_runtime: kind {kind} needs role {role[kind]}, which login"
                      f" '{login}' does not hold"):
            c.execute(PUBLISH, [uuid.uuid4(), kind, _snapshot(kind, activity)])
    with db.connect() as su:
        assert su.execute("select count(*) from awa.runtimes").fetchone()[0] == 0

    both = db.login_role("awa_producer", "awa_worker")
    allowed = [(logins.producer, "producer", "enqueue"), (logins.worker, "worker", "claim"),
               (both, "producer", "enqueue"), (both, "worker", "claim")]
    for login, kind, activity in allowed:
        with db.connect(login) as c:
            c.execute(PUBLISH, [uuid.uuid4(), kind, _snapshot(kind, activity)])
    with db.connect() as su:
        listed = su.execute(
            "select r.owner_login, r.kind, q.activity from awa.runtime_overview r"
            " join awa.runtime_queue_overview q using (instance_id)").fetchall()
    assert sorted(listed) == sorted(allowed)
