"""The migration runner: install and upgrade schema ``awa`` in one database.

A run has three kinds of step, always in this order:

1. bootstrap (first install only): create the roles when asked, let the
   migrating login act as the owner role, create schema ``awa`` owned by it,
   and revoke PUBLIC's default EXECUTE on everything the owner creates;
2. each pending numbered migration from ``migrations/``, in its own
   transaction (unless its header says ``-- awa:no-transaction``), run as the
   owner role and recorded in ``awa.schema_migrations``;
3. the function layer from ``sql/`` in one transaction, whenever any file,
   the package version or a migration changed, or its security rules no
   longer hold (grants lost to a restore with --no-acl, a REVOKE): the
   bootstrap's schema grants again, every file in manifest order, then
   PUBLIC is revoked again from everything and ``awa._assert_security()``
   checks owners, ACLs and pinned search_paths before the commit.

``read_state`` reads those rules (``awa._security_violations()``) too, so
``awa status`` reports lost grants with nothing pending; an object of
another owner stops the plan (the layer runs as the owner and cannot take
it back).

The same steps are either executed (``apply``) or printed as one psql script
(``render_sql``), so the two cannot disagree.

A migration that fails because a view of schema ``awa`` reads what it
changes (an earlier layer's view on a table it rebuilds: SQLSTATE 2BP01
naming the view) runs again in a fresh transaction that first drops the
function layer's views (``layer_views``, never a view of someone else's):
the layer's step, last in every plan with a migration, makes them again
with their grants. Only then: readers keep their views through a normal
upgrade.

Nothing depends on a session, so the runner works through a transaction
pooler (ADR 006): a run holds ``pg_advisory_xact_lock(1635213645, 0)``
('awaM', 0) in an open transaction on a second connection, which serialises
whole runs; each step's own transaction takes ``(1635213645, 1)``, sets its
settings with SET LOCAL, and re-reads what is applied before applying, so a
step another runner already applied is skipped. A ``-- awa:no-transaction``
migration needs a session of its own and is refused behind a pooler.
"""

from __future__ import annotations

import functools
import random
import re
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from awa_sql.connect import behind_pooler
from awa_sql.roles import RUNTIME_CAPABILITIES, Roles
from awa_sql.source import CHECKSUM_ALGORITHM, LayerFile, Migration, load_layer, load_migrations
from awa_sql.version import __version__

MIGRATION_LOCK = (1635213645, 0)  # 'awaM' as int4, then 0: held for a whole run
STEP_LOCK = (1635213645, 1)  # held by each step's transaction
DEFAULT_LOCK_TIMEOUT = "5s"  # per DDL lock inside a migration
DEFAULT_LOCK_WAIT = "120s"  # waiting for another runner to finish
SEARCH_PATH = "pg_catalog, pg_temp"

# Exit codes of every `awa` command (docs/migrations.md lists them). Each code
# has one meaning, so a deploy gate can tell "pending" from "could not ask".
EXIT_OK = 0
EXIT_PENDING = 1  # awa status --check: migrations or the function layer pending
EXIT_USAGE = 2  # bad arguments or input (argparse's own code), or a change not confirmed
EXIT_DRIFT = 3
EXIT_NEWER = 4
EXIT_LOCK_TIMEOUT = 5
EXIT_ROLES = 6
EXIT_ERROR = 7  # could not connect, permission denied, or the server failed
# awa status --check: nothing pending, but the grants (or a definer's
# search_path) differ from what the layer sets; awa migrate applies them again.
# 8 and 9 are awa jobs' and awa storage's (cli/jobs.py, cli/common.py).
EXIT_SECURITY = 10
EXIT_INTERRUPTED = 130  # Ctrl-C, where re-raising SIGINT cannot end the process


class MigrationError(RuntimeError):
    exit_code = EXIT_ERROR


class DriftError(MigrationError):
    """An applied migration no longer matches its file."""

    exit_code = EXIT_DRIFT


class NewerDatabaseError(MigrationError):
    """The database was migrated by a newer awa-sql than this one."""

    exit_code = EXIT_NEWER


class LockTimeoutError(MigrationError):
    exit_code = EXIT_LOCK_TIMEOUT


class RolesError(MigrationError):
    exit_code = EXIT_ROLES


def _q(composable: sql.Composable) -> str:
    return composable.as_string(None)


def _ident(name: str) -> str:
    return _q(sql.Identifier(name))


def _lit(value: object) -> str:
    return _q(sql.Literal(value))


_VERSION = re.compile(
    r"v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?(?:\+.*)?",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def version_tuple(version: str) -> tuple:
    """A key that orders versions as PEP 440 does: 0.1.0.dev1 < 0.1.0a1 <
    0.1.0rc1 < 0.1.0 < 0.1.0.post1 (trailing zeros of the release aside). A
    version it cannot read orders by its digits."""
    m = _VERSION.fullmatch(version.strip())
    if m is None:
        return (tuple(int("".join(c for c in p if c.isdigit()) or 0)
                      for p in version.split(".")), (1,), -1, (1,))
    release = tuple(int(p) for p in m["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    post = -1 if m["post"] is None else int(m["post"] or 0)
    if m["pre"]:
        pre: tuple = (0, _PRE_RANK[m["pre"].lower()], int(m["pre_n"] or 0))
    elif m["dev"] is not None and post < 0:
        pre = (-1,)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (1,)
    dev = (1,) if m["dev"] is None else (0, int(m["dev"] or 0))
    return (release, pre, post, dev)


# --------------------------------------------------------------------------
# What the database holds


@dataclass(frozen=True)
class AppliedMigration:
    version: int
    name: str
    checksum: str
    contract_version: str
    applied_at: str | None = None
    applied_by: str | None = None
    execution_ms: float | None = None

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass
class DatabaseState:
    """Everything the planner needs to know about one database."""

    schema_owner: str | None = None
    applied: dict[int, AppliedMigration] = field(default_factory=dict)
    layer: dict[str, str] = field(default_factory=dict)
    layer_contract: str | None = None
    bound_roles: dict[str, str] = field(default_factory=dict)
    existing_roles: set[str] = field(default_factory=set)
    current_user: str = ""
    is_superuser: bool = False
    # The run can act as the owner role: now (SET and INHERIT, or a
    # superuser), or after the bootstrap's grant on a first install (a
    # CREATEROLE login that inherits, holding ADMIN on the role or about to
    # create it). Whoever cannot is refused before any step (_check_roles).
    can_act_as_owner: bool = False
    login_inherits: bool = True
    # ADMIN OPTION on the owner role without membership: it could grant
    # itself the role, which only a first install's bootstrap does.
    owner_admin_only: bool = False
    # awa.schema_migrations exists (from the catalog, which needs no USAGE
    # on schema awa), and whether this login read it: one that cannot act
    # as the owner role reads none of awa's tables.
    has_records: bool = False
    records_read: bool = False
    public_can_create_in_public: bool = False
    # CREATE on the database, which the bootstrap's CREATE SCHEMA needs: the
    # login's own, or the owner role's, which the bootstrap makes it inherit.
    can_create_schema: bool = True
    offline: bool = False
    # awa._security_violations() as the owner: (rule, message) of each broken
    # invariant. Read only where it can be (an installed layer that has it, in
    # a schema the owner role owns), else empty.
    security: list[tuple[str, str]] = field(default_factory=list)

    @property
    def installed(self) -> bool:
        if self.schema_owner is None:
            return False
        return bool(self.applied) if self.records_read else self.has_records


def read_state(conn: psycopg.Connection, roles: Roles) -> DatabaseState:
    state = DatabaseState()
    row = conn.execute(
        """
        select current_user, r.rolsuper, r.rolinherit,
               (select pg_catalog.pg_get_userbyid(n.nspowner)
                  from pg_catalog.pg_namespace n where n.nspname = 'awa'),
               -- Each of awa's tables, from the catalog (no USAGE needed),
               -- and whether this login may read it: a name in a schema the
               -- login may not use is an error, not null.
               t.migrations is not null,
               u.usable and pg_catalog.has_table_privilege(t.migrations, 'SELECT'),
               u.usable and pg_catalog.has_table_privilege(t.functions, 'SELECT'),
               u.usable and pg_catalog.has_table_privilege(t.binding, 'SELECT'),
               coalesce((select pg_catalog.bool_or(a.grantee = 0 and a.privilege_type = 'CREATE')
                           from pg_catalog.pg_namespace n,
                                pg_catalog.aclexplode(n.nspacl) a
                          where n.nspname = 'public'), false),
               pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')
          from pg_catalog.pg_roles r
         cross join (select coalesce(pg_catalog.bool_or(
                                pg_catalog.has_schema_privilege(n.oid, 'USAGE')), false)
                              as usable
                       from pg_catalog.pg_namespace n where n.nspname = 'awa') as u
         cross join (select
                    pg_catalog.max(c.oid) filter (where c.relname = 'schema_migrations')
                        as migrations,
                    pg_catalog.max(c.oid) filter (where c.relname = 'schema_functions')
                        as functions,
                    pg_catalog.max(c.oid) filter (where c.relname = 'role_binding') as binding
                  from pg_catalog.pg_class c
                  join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                 where n.nspname = 'awa') as t
         where r.rolname = current_user
        """
    ).fetchone()
    assert row is not None
    (state.current_user, state.is_superuser, state.login_inherits, state.schema_owner,
     state.has_records, may_read_migrations, may_read_layer, may_read_binding,
     state.public_can_create_in_public, state.can_create_schema) = row
    # has_table_privilege is null for a table that does not exist.
    may_read_migrations, may_read_layer, may_read_binding = (
        bool(x) for x in (may_read_migrations, may_read_layer, may_read_binding))
    state.existing_roles = {
        name
        for (name,) in conn.execute(
            "select rolname from pg_catalog.pg_roles where rolname = any(%s)",
            [list(roles.as_dict().values())],
        )
    }
    if not state.can_create_schema and roles.owner in state.existing_roles:
        state.can_create_schema = conn.execute(
            "select pg_catalog.has_database_privilege(%s, pg_catalog.current_database(),"
            " 'CREATE')", [roles.owner]).fetchone()[0]
    acts_now = state.is_superuser
    if state.is_superuser:
        state.can_act_as_owner = True
    elif roles.owner in state.existing_roles:
        # SET ROLE to it for the steps, and its privileges inherited for the
        # reads of this state (as itself) and for the bootstrap's ALTER
        # DEFAULT PRIVILEGES FOR ROLE: a NOINHERIT login, or a grant WITH
        # INHERIT FALSE, could not do either.
        can_set, inherits, admin = conn.execute(
            "select pg_catalog.pg_has_role(current_user, %s, 'SET'),"
            " pg_catalog.pg_has_role(current_user, %s, 'USAGE'),"
            " pg_catalog.pg_has_role(current_user, %s, 'USAGE WITH ADMIN OPTION')",
            [roles.owner, roles.owner, roles.owner],
        ).fetchone()
        acts_now = bool(can_set and inherits)
        state.owner_admin_only = bool(admin and not acts_now)
        # ADMIN without both SET and INHERIT (createrole_self_grant may give
        # one): the bootstrap grants the login both, on a first install only.
        state.can_act_as_owner = acts_now or (
            state.owner_admin_only and state.login_inherits and not state.has_records)
    else:
        # Created by this run's roles step (--create-roles), the creator
        # holding ADMIN on it: as above.
        state.can_act_as_owner = state.login_inherits
    if roles.owner in state.existing_roles and not acts_now:
        # Nothing of awa's is read as a login that is not (yet) the owner:
        # an installed schema is refused (_check_roles), an empty one needs
        # nothing read.
        return state
    if may_read_migrations:
        state.records_read = True
        for r in conn.execute(
            "select version, name, checksum, contract_version, applied_at::text, applied_by,"
            " execution_ms::float8 from awa.schema_migrations order by version"
        ):
            state.applied[r[0]] = AppliedMigration(*r)
    if may_read_layer:
        for file, digest, contract in conn.execute(
            "select file, checksum, contract_version from awa.schema_functions"
        ):
            state.layer[file] = digest
            state.layer_contract = contract
    if may_read_binding:
        state.bound_roles = dict(
            conn.execute("select capability, role_name::text from awa.role_binding").fetchall()
        )
    if may_read_layer and may_read_binding and state.schema_owner == roles.owner and acts_now:
        state.security = _read_security(conn, roles)
    return state


def _read_security(conn: psycopg.Connection, roles: Roles) -> list[tuple[str, str]]:
    """The rules the layer step asserts (awa._security_violations), read as
    the owner role in a savepoint rolled back after, so that nothing of it,
    the role included, outlives the read. One pass over schema awa's catalog
    rows: cheap enough for every ``awa status``."""
    with conn.transaction(force_rollback=True):
        if conn.execute("select pg_catalog.to_regprocedure('awa._security_violations()')"
                        " is null").fetchone()[0]:
            return []  # a layer before it: the layer step is pending anyway
        if conn.execute("select pg_catalog.pg_has_role(current_user, %s, 'SET')",
                        [roles.owner]).fetchone()[0]:
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(roles.owner)))
        return [(rule, message) for rule, message in conn.execute(
            "select rule, message from awa._security_violations()")]


# --------------------------------------------------------------------------
# What to do about it


@dataclass(frozen=True)
class Step:
    kind: str  # roles | bootstrap | migration | layer
    label: str
    sql: str
    transactional: bool = True
    # A no-transaction migration runs as separate statements.
    statements: tuple[str, ...] = ()
    version: int | None = None  # a migration step's


@dataclass
class Plan:
    package_version: str
    steps: list[Step] = field(default_factory=list)
    # The function layer's recorded contract version the plan was built on
    # (None: no layer), which a rendered script checks before each step.
    layer_contract: str | None = None
    applied: list[AppliedMigration] = field(default_factory=list)
    pending: list[Migration] = field(default_factory=list)
    drifted: list[tuple[Migration, AppliedMigration]] = field(default_factory=list)
    unknown: list[AppliedMigration] = field(default_factory=list)
    layer_changes: list[str] = field(default_factory=list)
    missing_roles: list[str] = field(default_factory=list)
    # Broken invariants the layer step repairs (lost grants), each a message
    # naming what is wrong: the layer step is planned even when nothing else is.
    security: list[str] = field(default_factory=list)
    problems: list[MigrationError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def up_to_date(self) -> bool:
        return not self.steps and not self.problems

    def raise_problems(self) -> None:
        if self.problems:
            raise self.problems[0]


def build_plan(
    state: DatabaseState,
    roles: Roles,
    *,
    create_roles: bool = False,
    migrations: list[Migration] | None = None,
    layer: list[LayerFile] | None = None,
    package_version: str = __version__,
) -> Plan:
    migrations = load_migrations() if migrations is None else migrations
    layer = load_layer() if layer is None else layer
    plan = Plan(package_version=package_version, layer_contract=state.layer_contract)
    known = {m.version: m for m in migrations}
    newest_known = max(known, default=0)

    for applied in state.applied.values():
        plan.applied.append(applied)
        migration = known.get(applied.version)
        if migration is None:
            plan.unknown.append(applied)
        elif migration.checksum != applied.checksum:
            plan.drifted.append((migration, applied))
    # An installed schema this login could not read: nothing is known to
    # be pending, and the plan is refused (_check_roles).
    unread = state.installed and not state.records_read
    plan.pending = [] if unread else [m for m in migrations if m.version not in state.applied]

    newer = [a for a in plan.unknown if a.version > newest_known]
    layer_is_newer = state.layer_contract is not None and (
        version_tuple(state.layer_contract) > version_tuple(package_version)
    )
    if newer or layer_is_newer:
        db_version = max(
            [a.contract_version for a in newer] + [state.layer_contract or "0"],
            key=version_tuple,
        )
        detail = f", up to migration {newer[-1].label}" if newer else ""
        plan.problems.append(NewerDatabaseError(
            f"database was migrated by awa-sql {db_version}{detail}; this is awa-sql "
            f"{package_version}, which knows migrations up to {newest_known:04d}. "
            "Refusing to downgrade: run the newer awa-sql."
        ))
    for migration, applied in plan.drifted:
        plan.problems.append(DriftError(
            f"migration {migration.label}.sql changed after it was applied: database has "
            f"{CHECKSUM_ALGORITHM}:{applied.checksum}, file has "
            f"{CHECKSUM_ALGORITHM}:{migration.checksum}. Applied migrations are immutable; "
            "restore the file and put the change in a new migration."
        ))
    for applied in plan.unknown:
        if applied.version <= newest_known:
            plan.problems.append(DriftError(
                f"migration {applied.label} is applied but this package has no such file"
            ))

    _check_roles(state, roles, create_roles, plan)
    _check_security(state, roles, plan)
    if state.public_can_create_in_public:
        plan.warnings.append(
            "schema public still grants CREATE to PUBLIC: any login can plant functions "
            "there. awa-sql does not rely on it, but consider "
            "'REVOKE CREATE ON SCHEMA public FROM PUBLIC'."
        )
    # What the layer lacks, said even when a problem stops the plan (`awa
    # status` would have said "up to date").
    plan.layer_changes = [] if unread else _layer_changes(state, layer, package_version)
    if plan.problems:
        return plan

    if plan.missing_roles and create_roles:
        plan.steps.append(Step("roles", "create roles " + ", ".join(plan.missing_roles),
                               _roles_sql(roles, plan.missing_roles)))
    if not state.installed:
        plan.steps.append(Step("bootstrap", "create schema awa owned by " + roles.owner,
                               _bootstrap_sql(roles, create_schema=state.schema_owner is None)))
    for migration in plan.pending:
        plan.steps.append(_migration_step(migration, roles, package_version))

    if (plan.pending or plan.layer_changes or plan.security
            or state.bound_roles != roles.as_dict()):
        plan.steps.append(Step("layer", f"function layer ({len(layer)} files) and grants",
                               _layer_sql(layer, roles, package_version)))
    return plan


def _role_flags(bound: dict[str, str]) -> str:
    """The options that name a database's bound roles: ``--role-prefix P``
    when every name is P and its capability, else one option per name."""
    prefixes = {name[: -len(cap)] for cap, name in bound.items() if name.endswith(cap)}
    if len(prefixes) == 1 and all(name.endswith(cap) for cap, name in bound.items()):
        return f"--role-prefix {shlex.quote(prefixes.pop())}"
    return " ".join(f"--{cap}-role {shlex.quote(name)}" for cap, name in bound.items())


def _check_roles(state: DatabaseState, roles: Roles, create_roles: bool, plan: Plan) -> None:
    if state.bound_roles and state.bound_roles != roles.as_dict():
        differ = {
            cap: (state.bound_roles.get(cap), name)
            for cap, name in roles.as_dict().items()
            if state.bound_roles.get(cap) != name
        }
        plan.problems.append(RolesError(
            "this database is bound to other role names: "
            + ", ".join(f"{cap} is {old!r}, not {new!r}" for cap, (old, new) in differ.items())
            + f". Pass the same names: {_role_flags(state.bound_roles)}."
        ))
    if state.offline:
        plan.missing_roles = list(roles.as_dict().values())
        return
    plan.missing_roles = [n for n in roles.as_dict().values() if n not in state.existing_roles]
    if plan.missing_roles and not create_roles:
        plan.problems.append(RolesError(
            "missing roles: " + ", ".join(plan.missing_roles)
            + ". Run 'awa migrate --create-roles', or create them and grant the owner role "
            "to the login that migrates."
        ))
    if state.schema_owner is not None and state.schema_owner != roles.owner:
        if state.installed:
            plan.problems.append(RolesError(
                f"schema awa is installed but owned by {state.schema_owner!r}, not "
                f"{roles.owner!r}, as a restore with --no-owner (-O) leaves it: its SECURITY "
                f"DEFINER functions run as their owner. "
                + _GIVE_BACK.format(owner=roles.owner,
                                    what="schema awa and every object in it")
            ))
        else:
            plan.problems.append(RolesError(
                f"schema awa exists but is owned by {state.schema_owner!r}, not "
                f"{roles.owner!r}; refusing to install into a schema someone else owns."
            ))
    if not state.can_act_as_owner:
        plan.problems.append(RolesError(_cannot_act(state, roles)))
    if state.schema_owner is None and not state.can_create_schema:
        # Before the roles step, which would commit and leave them behind.
        plan.problems.append(RolesError(
            f"login {state.current_user!r} may not create schema awa: neither it nor the "
            f"owner role {roles.owner!r} has CREATE on this database. GRANT CREATE ON "
            f"DATABASE <database> TO {state.current_user} (or to {roles.owner}), or migrate "
            "as the database's owner."))


def _cannot_act(state: DatabaseState, roles: Roles) -> str:
    login, owner = state.current_user, roles.owner
    grant = f"GRANT {owner} TO {login} WITH INHERIT TRUE, SET TRUE"
    head = f"login {login!r} cannot act as {owner!r}: "
    needs = ("awa migrate needs the owner role's privileges inherited (the bootstrap's ALTER "
             "DEFAULT PRIVILEGES FOR ROLE, and every run's reads of schema awa)")
    if owner not in state.existing_roles:
        return (head + f"it is NOINHERIT, so the owner role this run would create and grant "
                f"it would not be inherited, and {needs}. ALTER ROLE {login} INHERIT, or "
                f"create the roles and {grant}.")
    if state.owner_admin_only and state.installed:
        return (head + f"{grant} (a login with ADMIN OPTION on it may run that itself). It "
                "holds ADMIN OPTION on the role but cannot both SET it and inherit its "
                "privileges, as the CREATEROLE login that created it may not, and awa migrate "
                "grants itself the owner role on a first install only, never to reach a "
                "schema awa already installed.")
    if state.owner_admin_only and not state.login_inherits:
        return (head + f"{grant}, or ALTER ROLE {login} INHERIT. It is NOINHERIT: the grant "
                f"awa migrate would make itself would not be inherited, and {needs}.")
    if state.installed:
        return head + (f"{grant}. Or run it as the login that migrates: an application's "
                       "login holds a runtime role, never the owner.")
    return (head + f"{grant}, or migrate as a login with CREATEROLE that created the roles "
            "and inherits (not NOINHERIT).")


_GIVE_BACK = (
    "awa migrate runs as {owner} and cannot take objects back: restore the dump again "
    "without --no-owner, as a superuser or a member of {owner} (docs/operations.md, \"Back "
    "up, restore, move to a new major version\"), or as a superuser ALTER {what} OWNER TO "
    "{owner}; then run awa status --check."
)


def _check_security(state: DatabaseState, roles: Roles, plan: Plan) -> None:
    """Objects of another owner and bound roles granted to one another stop the
    plan before any step (the layer step, run as the owner, can repair
    neither, and would fail after the migrations had committed); lost grants
    add the layer step. The rules are the installed layer's: an upgrade from
    a layer without role_membership meets it at the layer step (AW001, the
    migrations committed; a run after the REVOKE completes it)."""
    for rule, message in state.security:
        if rule == "owner":
            plan.problems.append(RolesError(
                f"{message}. "
                + _GIVE_BACK.format(owner=roles.owner, what="each object named")
            ))
        elif rule == "role_membership":
            plan.problems.append(RolesError(
                f"{message}. REVOKE each such grant as the role that granted it (or with "
                "GRANTED BY); a login that needs two capabilities gets both roles. Then run "
                "awa status --check."
            ))
        else:
            plan.security.append(message)


def _layer_changes(state: DatabaseState, layer: list[LayerFile], version: str) -> list[str]:
    changes = []
    current = {f.name: f.checksum for f in layer}
    for name, digest in current.items():
        if name not in state.layer:
            changes.append(f"{name} (new)")
        elif state.layer[name] != digest:
            changes.append(f"{name} (changed)")
    changes += [f"{name} (removed)" for name in state.layer if name not in current]
    if state.layer_contract is not None and state.layer_contract != version:
        changes.append(f"contract version {state.layer_contract} -> {version}")
    return changes


# --------------------------------------------------------------------------
# The SQL of each step


def _roles_sql(roles: Roles, missing: list[str]) -> str:
    # Each creation checks again so the script is safe to re-run.
    blocks = []
    for name in missing:
        blocks.append(
            "do $awa$\nbegin\n"
            "    if not exists (select from pg_catalog.pg_roles\n"
            f"                    where rolname = {_lit(name)}) then\n"
            f"        create role {_ident(name)} nologin;\n"
            "    end if;\nend\n$awa$;\n"
        )
    return "".join(blocks)


def _schema_grants_sql(roles: Roles) -> str:
    """The bootstrap's grants, which the layer step applies again: a restore
    with --no-acl, or a REVOKE, loses them (awa._security_violations checks them)."""
    owner = _ident(roles.owner)
    runtime = ", ".join(_ident(n) for n in roles.runtime().values())
    return (
        "-- Global form on purpose: the per-schema form cannot revoke the built-in\n"
        "-- PUBLIC EXECUTE default.\n"
        f"alter default privileges for role {owner} revoke execute on routines from public;\n"
        f"alter default privileges for role {owner} revoke usage on types from public;\n"
        "revoke all on schema awa from public;\n"
        f"grant usage on schema awa to {runtime};\n"
    )


def _bootstrap_sql(roles: Roles, create_schema: bool) -> str:
    owner = _ident(roles.owner)
    return (
        "-- The migrating login must be able to SET ROLE to the owner and inherit its\n"
        "-- privileges; a CREATEROLE login holds ADMIN on roles it created and can grant\n"
        "-- itself both (a plain GRANT would keep the options an existing grant has:\n"
        "-- createrole_self_grant = 'set' or 'inherit' gives one of the two).\n"
        "do $awa$\nbegin\n"
        f"    if not (pg_catalog.pg_has_role(current_user, {_lit(roles.owner)}, 'SET') and\n"
        f"            pg_catalog.pg_has_role(current_user, {_lit(roles.owner)}, 'USAGE'))\n"
        "    then\n"
        "        execute pg_catalog.format('grant %I to %I with inherit true, set true',\n"
        f"                                  {_lit(roles.owner)}, current_user);\n"
        "    end if;\nend\n$awa$;\n"
        + (f"create schema awa authorization {owner};\n" if create_schema else "")
        + _schema_grants_sql(roles)
    )


def _record_migration_sql(migration: Migration, version: str) -> str:
    return (
        "insert into awa.schema_migrations"
        " (version, name, checksum, checksum_algorithm, contract_version, execution_ms)\n"
        f"values ({migration.version}, {_lit(migration.name)}, {_lit(migration.checksum)},"
        f" {_lit(CHECKSUM_ALGORITHM)}, {_lit(version)},"
        " extract(epoch from pg_catalog.clock_timestamp() - pg_catalog.now()) * 1000);\n"
    )


def _migration_step(migration: Migration, roles: Roles, version: str) -> Step:
    owner = _ident(roles.owner)
    label = f"migration {migration.label}"
    if migration.transactional:
        body = (
            f"set local role {owner};\n"
            f"{migration.text.rstrip()}\n;\n"
            f"{_record_migration_sql(migration, version)}"
        )
        return Step("migration", label, body, version=migration.version)
    statements = (
        f"set role {owner};",
        migration.text.strip(),
        _record_migration_sql(migration, version).strip(),
        "reset role;",
    )
    return Step("migration", label, "\n".join(statements) + "\n", transactional=False,
                statements=statements, version=migration.version)


def _contract_version_sql(version: str) -> str:
    return (
        "create or replace function awa.contract_version() returns text\n"
        "language sql immutable parallel safe\n"
        f"set search_path = {SEARCH_PATH}\n"
        f"as $$select {_lit(version)}::text$$;\n"
        "select awa._grant_execute('awa.contract_version()', "
        + ", ".join(_lit(c) for c in RUNTIME_CAPABILITIES)
        + ");\n"
    )


# Every routine of schema awa is the function layer's (no migration makes
# one), so one that the layer's transaction did not create or replace (its
# pg_proc row older than the transaction) is an earlier layer's that this one
# no longer defines: a helper gone, or an overload whose arguments changed,
# which would make a call by the new arguments ambiguous. Dropped, so that an
# upgrade from any earlier layer ends as a fresh install does, and named in
# the run's output. (retired.sql drops, before the files, what CREATE OR
# REPLACE could not replace.) One that something still depends on, or that
# another role owns, is left and named.
SWEEP_SQL = """\
do $sweep$
declare
    stale record;
begin
    for stale in
        -- As text, read before the drop (a dropped one's oid has no name).
        select p.oid::pg_catalog.regprocedure::text as routine,
               case p.prokind when 'a' then 'aggregate' else 'routine' end as what
          from pg_catalog.pg_proc as p
         where p.pronamespace operator(pg_catalog.=) 'awa'::pg_catalog.regnamespace
           and p.xmin operator(pg_catalog.<>) pg_catalog.pg_current_xact_id()::xid
    loop
        begin
            execute pg_catalog.format('drop %s %s', stale.what, stale.routine);
            raise warning 'dropped %, an earlier function layer''s routine this one does not'
                ' define', stale.routine;
        exception when dependent_objects_still_exist or insufficient_privilege then
            raise warning 'left %, an earlier function layer''s routine this one does not'
                ' define: %', stale.routine, sqlerrm;
        end;
    end loop;
end
$sweep$;
"""


def _layer_sql(layer: list[LayerFile], roles: Roles, version: str) -> str:
    parts = [f"set local role {_ident(roles.owner)};\n"]
    rows = ",\n    ".join(f"({_lit(cap)}, {_lit(name)})" for cap, name in roles.as_dict().items())
    parts.append(
        "insert into awa.role_binding (capability, role_name) values\n    "
        f"{rows}\non conflict (capability) do update set role_name = excluded.role_name;\n"
    )
    parts.append(_schema_grants_sql(roles))
    for f in layer:
        parts.append(f"-- function layer: {f.name}\n{f.text.rstrip()}\n;\n")
    parts.append(_contract_version_sql(version))
    parts.append(SWEEP_SQL)
    names = ", ".join(_lit(f.name) for f in layer)
    records = ",\n    ".join(
        f"({_lit(f.name)}, {_lit(f.checksum)}, {_lit(CHECKSUM_ALGORITHM)}, {_lit(version)})"
        for f in layer
    )
    parts.append(
        "-- Re-assert after every change: DROP + CREATE would have reset an ACL.\n"
        "revoke all on all routines in schema awa from public;\n"
        "revoke all on all tables in schema awa from public;\n"
        "revoke all on all sequences in schema awa from public;\n"
        "select awa._record_grants();\n"
        "select awa._assert_security();\n"
        f"delete from awa.schema_functions where file not in ({names});\n"
        "insert into awa.schema_functions (file, checksum, checksum_algorithm, contract_version)"
        f" values\n    {records}\n"
        "on conflict (file) do update set checksum = excluded.checksum,"
        " checksum_algorithm = excluded.checksum_algorithm,"
        " contract_version = excluded.contract_version,"
        " applied_at = excluded.applied_at, applied_by = excluded.applied_by;\n"
    )
    return "".join(parts)


# --------------------------------------------------------------------------
# Doing it: settings are SET LOCAL inside each transaction, never on the session


def _set_local(conn: psycopg.Connection, name: str, value: str) -> None:
    conn.execute("select pg_catalog.set_config(%s, %s, true)", [name, value])


def _lock_wait_message(err: psycopg.Error, what: str, timeout: str) -> str:
    return f"{what}: could not get a lock within {timeout} ({err.diag.message_primary})"


def read_state_in_transaction(conn: psycopg.Connection, roles: Roles,
                              lock_timeout: str | None = None) -> DatabaseState:
    """``read_state`` in a transaction of its own, with its settings SET LOCAL."""
    with conn.transaction():
        _set_local(conn, "search_path", SEARCH_PATH)
        if lock_timeout is not None:
            _set_local(conn, "lock_timeout", lock_timeout)
        return read_state(conn, roles)


def _step_key(step: Step) -> str:
    return step.label if step.kind == "migration" else step.kind


Replan = Callable[[], Plan]


def _still_needed(step: Step, replan: Replan | None) -> Step | None:
    """The step as the database now needs it, or None when another runner applied it."""
    if replan is None:
        return step
    fresh = replan()
    fresh.raise_problems()
    return next((s for s in fresh.steps if _step_key(s) == _step_key(step)), None)


def _apply_in_transaction(conn: psycopg.Connection, step: Step, lock_timeout: str,
                          lock_wait: str, replan: Replan | None,
                          before: Callable[[], None] | None = None) -> bool:
    with conn.transaction():
        _set_local(conn, "search_path", SEARCH_PATH)
        _set_local(conn, "lock_timeout", lock_wait)
        conn.execute("select pg_catalog.pg_advisory_xact_lock(%s, %s)", STEP_LOCK)
        _set_local(conn, "lock_timeout", lock_timeout)
        current = _still_needed(step, replan)
        if current is None:
            return False
        if before is not None:
            before()
        conn.execute(current.sql)
    return True


@functools.cache
def layer_views() -> tuple[str, ...]:
    """The views the function layer makes, each put in place by
    awa._ensure_view (which makes one that is missing again, its grants and
    comment with it), by qualified name as format('%I.%I') and an error's
    detail print it. No migration makes a view; a view of schema awa that
    is not one of these is someone else's, and the runner never drops it."""
    return tuple(sorted({name for f in load_layer()
                         for name in re.findall(r"awa\._ensure_view\('(awa\.\w+)'", f.text)}))


def _views_sql() -> str:
    """Those of layer_views() the database has."""
    names = "array[" + ", ".join(_lit(v) for v in layer_views()) + "]::text[]"
    return ("select pg_catalog.format('%I.%I', n.nspname, c.relname) as name\n"
            "  from pg_catalog.pg_class as c\n"
            "  join pg_catalog.pg_namespace as n on n.oid = c.relnamespace\n"
            " where n.nspname = 'awa' and c.relkind = 'v'\n"
            f"   and pg_catalog.format('%I.%I', n.nspname, c.relname) = any ({names})")


def _drop_views_sql() -> str:
    """One DROP VIEW of them all, no CASCADE (PostgreSQL drops views that
    read one another together): anything else that depends on one of them
    stops it. No row when there is none. A --sql script's header shows it
    for psql's \\gexec."""
    return ("select 'drop view ' || pg_catalog.string_agg(v.name, ', ' order by v.name)\n"
            "  from (" + _views_sql().replace("\n", "\n        ") + ") as v\n"
            "having pg_catalog.count(*) > 0")


def _views_named(conn: psycopg.Connection, err: psycopg.Error) -> list[str]:
    """The function layer's views that ``err``'s detail names: by name,
    which reads the same in every lc_messages."""
    detail = err.diag.message_detail or ""
    with conn.transaction():
        _set_local(conn, "search_path", SEARCH_PATH)
        views = [name for (name,) in conn.execute(_views_sql())]
    return [v for v in sorted(views)
            if re.search(rf"(?<![\w$.\"]){re.escape(v)}(?![\w$\"])", detail)]


def _drop_views(conn: psycopg.Connection, step: Step, failure: psycopg.Error) -> None:
    row = conn.execute(_drop_views_sql()).fetchone()
    if row is None:
        return
    try:
        conn.execute(row[0])
    except psycopg.errors.DependentObjectsStillExist as err:
        def detail(e: psycopg.Error) -> str:
            return "; ".join((e.diag.message_detail or "").splitlines())

        raise MigrationError(
            f"{step.label} failed and was rolled back: {failure.diag.message_primary} "
            f"({detail(failure)}). To run it again awa migrate drops the function layer's "
            f"views, which the layer makes again, but it cannot: {detail(err)}. Drop each "
            "object named there that depends on one of them (and make it again after the "
            "run), then run awa migrate again. Nothing of this step was applied."
        ) from err


def _apply_migration(conn: psycopg.Connection, step: Step, lock_timeout: str, lock_wait: str,
                     replan: Replan | None, log: Callable[[str], None]) -> bool:
    try:
        return _apply_in_transaction(conn, step, lock_timeout, lock_wait, replan)
    except psycopg.errors.DependentObjectsStillExist as err:
        named = _views_named(conn, err)
        if not named:
            raise
        failure = err
    log(f"{step.label} failed on what the function layer's views read ({', '.join(named)}): "
        "running it again after dropping the function layer's views, which the layer "
        "makes again")
    return _apply_in_transaction(conn, step, lock_timeout, lock_wait, replan,
                                 before=lambda: _drop_views(conn, step, failure))


def _apply_outside_transaction(conn: psycopg.Connection, step: Step, lock_timeout: str,
                               lock_wait: str, replan: Replan | None) -> bool:
    # SET ROLE, then the statement, then its record: three transactions that
    # must share one server session, which a transaction pooler does not give.
    if behind_pooler(conn):
        raise MigrationError(
            f"{step.label} runs outside a transaction (-- awa:no-transaction) and needs a "
            "session of its own, which a transaction pooler such as PgBouncer does not give: "
            "run awa migrate over a direct connection to PostgreSQL. "
            "Nothing of this step was applied."
        )
    conn.execute("select pg_catalog.set_config('search_path', %s, false),"
                 " pg_catalog.set_config('lock_timeout', %s, false)", [SEARCH_PATH, lock_wait])
    conn.execute("select pg_catalog.pg_advisory_lock(%s, %s)", STEP_LOCK)
    try:
        conn.execute("select pg_catalog.set_config('lock_timeout', %s, false)", [lock_timeout])
        current = _still_needed(step, replan)
        if current is None:
            return False
        for statement in current.statements:
            conn.execute(statement)
        return True
    finally:
        conn.execute("reset role")
        conn.execute("select pg_catalog.pg_advisory_unlock(%s, %s)", STEP_LOCK)
        conn.execute("reset search_path")
        conn.execute("reset lock_timeout")


def apply_plan(
    conn: psycopg.Connection, plan: Plan, lock_timeout: str, log: Callable[[str], None],
    *, lock_wait: str = DEFAULT_LOCK_WAIT, replan: Replan | None = None,
    run_lock: RunLock | None = None,
) -> None:
    """Apply each step of ``plan`` in order on an autocommit connection.

    With ``replan``, each step's transaction re-reads the database under the
    step lock first and skips a step another runner applied meanwhile.
    """
    for step in plan.steps:
        started = time.monotonic()
        # A WARNING of the step's (awa._record_grants: privileges it took
        # back), said once the step is applied.
        warnings: list[str] = []
        collect = functools.partial(_collect_warning, warnings)
        conn.add_notice_handler(collect)
        try:
            if step.transactional and step.kind == "migration":
                applied = _apply_migration(conn, step, lock_timeout, lock_wait, replan, log)
            elif step.transactional:
                applied = _apply_in_transaction(conn, step, lock_timeout, lock_wait, replan)
            else:
                with run_lock.released() if run_lock else nullcontext():
                    applied = _apply_outside_transaction(conn, step, lock_timeout, lock_wait,
                                                         replan)
        except psycopg.errors.LockNotAvailable as err:
            raise LockTimeoutError(
                _lock_wait_message(err, step.label, lock_timeout)
                + "; nothing of this step was applied. Retry when the blocker is gone."
            ) from err
        except psycopg.Error as err:
            raise MigrationError(f"{step.label} failed and was rolled back: {err}") from err
        finally:
            conn.remove_notice_handler(collect)
        if applied:
            log(f"applied {step.label} ({(time.monotonic() - started) * 1000:.0f} ms)")
            for warning in warnings:
                log(f"warning: {warning}")
        else:
            log(f"skipped {step.label}: another runner applied it")


def _collect_warning(warnings: list[str], diag: psycopg.errors.Diagnostic) -> None:
    if diag.severity_nonlocalized == "WARNING":
        hint = f" ({diag.message_hint})" if diag.message_hint else ""
        warnings.append(f"{diag.message_primary}{hint}")


# A waiting runner's look at the run lock, then its pause outside any
# transaction (jittered, so that waiters started together spread out).
WAIT_SLICE_MS = 100
WAIT_PAUSE_S = (0.2, 0.6)


def _milliseconds(conn: psycopg.Connection, setting: str) -> int:
    """A lock_timeout value in ms, parsed by the server the way it parses lock_timeout."""
    with conn.transaction():
        _set_local(conn, "lock_timeout", setting)
        return int(conn.execute(
            "select setting from pg_catalog.pg_settings where name = 'lock_timeout'"
        ).fetchone()[0])


class RunLock:
    """MIGRATION_LOCK, held for a whole run.

    Held by an open transaction on a second connection: a transaction pooler
    keeps a transaction on one server connection, and closing (or losing) the
    connection ends the transaction and releases the lock. The transaction
    writes nothing. A waiting runner waits for the lock 100 ms at a time and
    pauses 0.2-0.6 s between, outside any transaction: behind a transaction
    pooler a waiter holds a server connection a fifth of the time on average
    (a third at most), so that waiters do not keep the running runner from
    the one its next step needs (six runners over four server connections
    took 40 s with one-second waits back to back, 3 s with these). Each
    slice that times out is an ERROR in the server's log ("canceling
    statement due to lock timeout"), about two a second per waiter.
    """

    def __init__(self, conn: psycopg.Connection, lock_wait: str) -> None:
        self.lock_wait = lock_wait
        self.holder = psycopg.connect(conn.info.dsn, password=conn.info.password or None,
                                      fallback_application_name="awa-sql migrate lock")

    def acquire(self) -> None:
        holder = self.holder
        wait_ms = _milliseconds(holder, self.lock_wait)
        deadline = time.monotonic() + wait_ms / 1000 if wait_ms else None
        while True:
            remaining_ms = WAIT_SLICE_MS if deadline is None else int(
                (deadline - time.monotonic()) * 1000)
            _set_local(holder, "lock_timeout", f"{max(1, min(WAIT_SLICE_MS, remaining_ms))}ms")
            try:
                holder.execute("select pg_catalog.pg_advisory_xact_lock(%s, %s)",
                               MIGRATION_LOCK)
                return
            except psycopg.errors.LockNotAvailable as err:
                holder.rollback()
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeoutError(_lock_wait_message(
                        err, "another awa migrate is running", self.lock_wait)) from err
                pause = random.uniform(*WAIT_PAUSE_S)  # noqa: S311 - a jitter, not a secret
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                time.sleep(pause)

    @contextmanager
    def released(self) -> Iterator[None]:
        """Without the run lock for a while: CREATE INDEX CONCURRENTLY waits
        for every open transaction, this one included. The step lock and the
        re-read keep another runner from applying the same step meanwhile."""
        self.holder.rollback()
        try:
            yield
        finally:
            self.acquire()

    def close(self) -> None:
        self.holder.close()


@contextmanager
def run_lock(conn: psycopg.Connection, lock_wait: str) -> Iterator[RunLock]:
    lock = RunLock(conn, lock_wait)
    try:
        lock.acquire()
        yield lock
    finally:
        lock.close()


def migrate(
    conn: psycopg.Connection,
    roles: Roles,
    *,
    create_roles: bool = False,
    dry_run: bool = False,
    lock_timeout: str = DEFAULT_LOCK_TIMEOUT,
    lock_wait: str = DEFAULT_LOCK_WAIT,
    log: Callable[[str], None] = print,
    migrations: list[Migration] | None = None,
    layer: list[LayerFile] | None = None,
) -> Plan:
    """Bring the database up to this package. ``conn`` must be in autocommit mode."""
    if not conn.autocommit:
        raise ValueError("migrate() needs an autocommit connection")

    def replan() -> Plan:
        try:
            # Inside a step's transaction this is a savepoint of it.
            state = read_state_in_transaction(conn, roles, lock_timeout)
        except psycopg.errors.LockNotAvailable as err:
            raise LockTimeoutError(
                _lock_wait_message(err, "reading the migration records", lock_timeout)
            ) from err
        return build_plan(state, roles, create_roles=create_roles, migrations=migrations,
                          layer=layer)

    with run_lock(conn, lock_wait) as lock:
        plan = replan()
        for warning in plan.warnings:
            log(f"warning: {warning}")
        for message in plan.security:
            log(f"security: {message}; the function layer's step applies its grants "
                "again and takes back the others")
        plan.raise_problems()
        if dry_run or plan.up_to_date:
            return plan
        apply_plan(conn, plan, lock_timeout, log, lock_wait=lock_wait, replan=replan,
                   run_lock=lock)
        return plan


def _guard_sql(applied: list[int], contract: str | None) -> str:
    """Raises unless the database's applied migrations and recorded layer
    contract are those the script's plan expects before this step: a script
    rendered earlier, run after another runner (a newer awa-sql) moved the
    database on, stops where the runner would refuse (exit 4) instead of
    taking it back."""
    expected = ",".join(str(v) for v in applied)
    return f"""do $guard$
declare
    applied text := '';
    contract text := '';
    tables pg_catalog.name[];
begin
    -- From the catalog: to_regclass fails in a schema this login may not
    -- use yet (one made for it before the bootstrap grants it the owner).
    tables := array(select c.relname from pg_catalog.pg_class c
                      join pg_catalog.pg_namespace n
                        on n.oid operator(pg_catalog.=) c.relnamespace
                     where n.nspname operator(pg_catalog.=) 'awa');
    if 'schema_migrations' operator(pg_catalog.=) any (tables) then
        execute 'select pg_catalog.string_agg(version::text, '','' order by version)'
                ' from awa.schema_migrations' into applied;
    end if;
    if 'schema_functions' operator(pg_catalog.=) any (tables) then
        execute 'select pg_catalog.string_agg(distinct contract_version, '','')'
                ' from awa.schema_functions' into contract;
    end if;
    applied := coalesce(applied, '');
    contract := coalesce(contract, '');
    if applied operator(pg_catalog.<>) {_lit(expected)}
       or contract operator(pg_catalog.<>) {_lit(contract or "")} then
        raise exception 'awa: this script was rendered for another state of the database; '
            'it changed since (applied migrations %, function layer contract %; the script '
            'expects %, %): nothing of this step was applied. Render it again with awa '
            'migrate --sql, or run awa migrate.',
            coalesce(nullif(applied, ''), 'none'),
            coalesce(nullif(contract, ''), 'none'),
            coalesce(nullif({_lit(expected)}, ''), 'none'),
            coalesce(nullif({_lit(contract or "")}, ''), 'none');
    end if;
end
$guard$;
"""


def _step_script(step: Step, lock_timeout: str, lock_wait: str, guard: str) -> str:
    if not step.transactional:
        return (
            "-- Outside a transaction: needs a direct connection, not a transaction pooler.\n"
            f"set search_path = {SEARCH_PATH};\n"
            f"set lock_timeout = {_lit(lock_timeout)};\n"
            + guard
            + "\n".join(step.statements) + "\n"
            "reset search_path;\nreset lock_timeout;\n"
        )
    return (
        "begin;\n"
        f"set local search_path = {SEARCH_PATH};\n"
        f"set local lock_timeout = {_lit(lock_wait)};\n"
        "select pg_catalog.pg_advisory_xact_lock({}, {});\n".format(*MIGRATION_LOCK)
        + f"set local lock_timeout = {_lit(lock_timeout)};\n"
        + guard
        + f"{step.sql}commit;\n"
    )


def _script_views_note() -> str:
    """awa migrate runs such a migration again itself (_apply_migration); a
    script cannot catch the error, so its reader is told what to do."""
    return (
        "-- A migration step that stops with SQLSTATE 2BP01 (\"cannot drop ... because other\n"
        "-- objects depend on it\") naming a view of schema awa, an earlier function layer's\n"
        "-- view that reads what the migration changes: drop the function layer's views,\n"
        "-- render the script again and run it; its last step makes them again (awa migrate\n"
        "-- does this itself). In psql, as the migrating login:\n"
        + "".join(f"--   {line}\n" for line in f"{_drop_views_sql()} \\gexec".splitlines())
    )


def render_sql(plan: Plan, lock_timeout: str = DEFAULT_LOCK_TIMEOUT,
               lock_wait: str = DEFAULT_LOCK_WAIT) -> str:
    """One psql script that performs ``plan`` exactly as ``apply_plan`` would.

    Each step's transaction waits for a running ``awa migrate`` and sets what
    it needs with SET LOCAL, so the script runs through a transaction pooler
    too (unless it has a no-transaction step). Each step first checks that
    the applied migrations and the layer's contract version are what the
    plan expects before it (``_guard_sql``), so a script run twice, or after
    another runner moved the database on, stops at that step and applies
    nothing of it.
    """
    out = [
        f"-- awa-sql {plan.package_version}: migration script\n",
        "-- Run with: psql -X -v ON_ERROR_STOP=1 -f this.sql\n",
    ]
    if any(s.kind == "migration" and s.transactional for s in plan.steps):
        out.append(_script_views_note())
    out.append("\\set ON_ERROR_STOP on\n")
    applied = sorted(a.version for a in plan.applied)
    contract = plan.layer_contract
    for step in plan.steps:
        out.append(f"\n-- step: {step.label}\n")
        out.append(_step_script(step, lock_timeout, lock_wait, _guard_sql(applied, contract)))
        if step.version is not None:
            applied = sorted([*applied, step.version])
        elif step.kind == "layer":
            contract = plan.package_version
    return "".join(out)


def plan_for(conn: psycopg.Connection | None, roles: Roles, create_roles: bool) -> Plan:
    """The plan for a live database, or for an empty one when ``conn`` is None."""
    if conn is None:
        return build_plan(DatabaseState(offline=True), roles, create_roles=create_roles)
    return build_plan(read_state_in_transaction(conn, roles), roles, create_roles=create_roles)
