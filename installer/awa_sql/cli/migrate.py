"""``awa migrate`` and ``awa status``: install, upgrade, and the deploy gate."""

from __future__ import annotations

import argparse
import json
import re
import sys

from awa_sql import migrate as runner
from awa_sql.cli.common import add_connection, add_roles, err, roles_from
from awa_sql.connect import connect
from awa_sql.roles import DESCRIPTIONS, Roles
from awa_sql.version import __version__


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("migrate", help="install or upgrade schema awa",
                       description="Install or upgrade schema awa in one database.")
    add_connection(m)
    add_roles(m)
    m.add_argument("--create-roles", action="store_true",
                   help="create missing roles as NOLOGIN (needs CREATEROLE)")
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    mode.add_argument("--sql", action="store_true",
                      help="print one psql script that performs the plan, change nothing")
    m.add_argument("--offline", action="store_true",
                   help="with --sql: plan for an empty database without connecting")
    m.add_argument("--lock-timeout", default=runner.DEFAULT_LOCK_TIMEOUT, type=lock_duration,
                   help="longest wait for any one lock inside a migration (default %(default)s)")
    m.add_argument("--lock-wait", default=runner.DEFAULT_LOCK_WAIT, type=lock_duration,
                   help="longest wait for another running awa migrate (default %(default)s; "
                   "0 waits for ever)")
    m.set_defaults(func=cmd_migrate)

    s = sub.add_parser("status", help="applied, pending and drifted migrations",
                       description="Show applied, pending and drifted migrations.")
    add_connection(s)
    add_roles(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--check", action="store_true",
                   help="deploy gate: exit 0 when up to date, 1 when anything is pending, "
                   "3 on drift, 4 when the database is newer, 6 on role problems (an "
                   "object of another owner included), 7 when it could not ask (connection "
                   "or permission failure), 10 when grants differ from what the layer sets "
                   "(awa migrate applies them again)")
    s.set_defaults(func=cmd_status, needs="awa_owner, as the login that runs awa migrate "
                   "does")


# A lock_timeout value as PostgreSQL reads it: a number of ms, or with a unit.
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s|min|h|d)?\s*")
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_LOCK_MS = 2_147_483_647  # lock_timeout's maximum
_RANGE = "0 to 2147483647ms (about 24 days)"


def lock_duration(text: str) -> str:
    """``--lock-timeout`` and ``--lock-wait``, checked before anything
    connects (a bad one is exit 2, and a --sql script would carry it)."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: a number with a unit of us, ms, s, min, h or d "
            f"(500ms, 5s, 2min), {_RANGE}")
    ms = float(match[1]) * _UNIT_MS[match[2] or "ms"]
    if ms > MAX_LOCK_MS:
        raise argparse.ArgumentTypeError(f"duration {text!r} is out of range: {_RANGE}")
    if 0 < ms <= 0.5:
        # PostgreSQL rounds it to the nearest ms (half to even): 0, which
        # waits for ever, the opposite of a limit.
        raise argparse.ArgumentTypeError(
            f"duration {text!r} is 0.5ms or less, which PostgreSQL rounds to 0 (no limit): "
            f"{_RANGE}, 0 for no limit")
    return text


def cmd_migrate(args: argparse.Namespace) -> int:
    roles = roles_from(args)
    if args.offline and not args.sql:
        err("--offline only makes sense with --sql")
        return runner.EXIT_USAGE
    if args.sql:
        if args.offline:
            plan = runner.plan_for(None, roles, args.create_roles)
        else:
            with connect(args.dsn, autocommit=True) as conn:
                plan = runner.plan_for(conn, roles, args.create_roles)
        plan.raise_problems()
        sys.stdout.write(runner.render_sql(plan, args.lock_timeout, args.lock_wait))
        return 0
    with connect(args.dsn, autocommit=True) as conn:
        plan = runner.migrate(
            conn, roles, create_roles=args.create_roles, dry_run=args.dry_run,
            lock_timeout=args.lock_timeout, lock_wait=args.lock_wait,
            log=lambda line: print(line, flush=True),
        )
    if plan.up_to_date:
        print(f"awa-sql {__version__}: database is up to date")
    elif args.dry_run:
        print(f"awa-sql {__version__}: plan ({len(plan.steps)} steps; nothing changed)")
        for step in plan.steps:
            print(f"  {step.label}")
        for change in plan.layer_changes:
            print(f"    {change}")
        if plan.security:
            print("    grants, to apply again")
    else:
        print(f"awa-sql {__version__}: migrated ({len(plan.steps)} steps)")
    return 0


def _status_document(plan: runner.Plan, roles: Roles, state: runner.DatabaseState) -> dict:
    return {
        "package_version": plan.package_version,
        "database_contract_version": state.layer_contract,
        "up_to_date": plan.up_to_date,
        "roles": {cap: {"name": name, "may": DESCRIPTIONS[cap]}
                  for cap, name in roles.as_dict().items()},
        "missing_roles": plan.missing_roles,
        "applied": [
            {"version": a.version, "name": a.name, "checksum": a.checksum,
             "contract_version": a.contract_version, "applied_at": a.applied_at,
             "applied_by": a.applied_by, "execution_ms": a.execution_ms}
            for a in plan.applied
        ],
        "pending": [{"version": m.version, "name": m.name, "checksum": m.checksum}
                    for m in plan.pending],
        "drifted": [{"version": m.version, "name": m.name, "database_checksum": a.checksum,
                     "file_checksum": m.checksum} for m, a in plan.drifted],
        "unknown": [{"version": a.version, "name": a.name,
                     "contract_version": a.contract_version} for a in plan.unknown],
        # False when schema awa is installed but this login may not read its
        # records (it cannot act as the owner role): applied and pending are
        # then unknown, not empty.
        "records_read": state.records_read or not state.installed,
        "function_layer_installed": bool(state.layer),
        "function_layer_changes": plan.layer_changes,
        "security": plan.security,
        "problems": [str(p) for p in plan.problems],
        "warnings": plan.warnings,
    }


def _print_status(doc: dict) -> None:
    if not doc["records_read"]:
        print(f"awa-sql {doc['package_version']}; database installed, but this login may not "
              "read its migration records")
        for p in doc["problems"]:
            print(f"problem: {p}")
        return
    print(f"awa-sql {doc['package_version']}; "
          f"database contract {doc['database_contract_version'] or 'not installed'}")
    print("applied:" if doc["applied"] else "applied: none")
    for a in doc["applied"]:
        print(f"  {a['version']:04d}_{a['name']:<28} {a['applied_at']}  by {a['applied_by']}")
    print("pending:" if doc["pending"] else "pending: none")
    for m in doc["pending"]:
        print(f"  {m['version']:04d}_{m['name']}")
    if doc["drifted"]:
        print("drifted:")
        for d in doc["drifted"]:
            print(f"  {d['version']:04d}_{d['name']}  database {d['database_checksum'][:12]}"
                  f"  file {d['file_checksum'][:12]}")
    changes = doc["function_layer_changes"]
    if not doc["function_layer_installed"]:
        print("function layer: not installed")
    else:
        print("function layer: " + ("; ".join(changes) if changes else
                                    "files up to date, grants not" if doc["security"] else
                                    "up to date"))
    for s in doc["security"]:
        print(f"security: {s}")
    if doc["security"]:
        print("  run 'awa migrate': it applies schema awa's and the function layer's grants "
              "again")
    for p in doc["problems"]:
        print(f"problem: {p}")
    for w in doc["warnings"]:
        print(f"warning: {w}")


def cmd_status(args: argparse.Namespace) -> int:
    roles = roles_from(args)
    with connect(args.dsn, autocommit=True) as conn:
        state = runner.read_state_in_transaction(conn, roles)
    plan = runner.build_plan(state, roles)
    doc = _status_document(plan, roles, state)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        _print_status(doc)
    if not args.check:
        return 0
    if plan.problems:
        return plan.problems[0].exit_code
    if plan.security:
        return runner.EXIT_SECURITY
    return runner.EXIT_PENDING if plan.steps else runner.EXIT_OK
