"""`awa storage ...`: show and change queue storage from a terminal or a script."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from awa_sql import storage
from awa_sql.connect import connect

EXIT_NOT_CONFIRMED = 2


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, numbers right-aligned."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) and rows
               for i in range(len(headers))]

    def line(values):
        padded = (
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def add_parsers(sub: argparse._SubParsersAction, add_connection) -> None:
    storage_parser = sub.add_parser("storage", help="show and change queue storage")
    ss = storage_parser.add_subparsers(dest="storage_command", required=True)

    p = ss.add_parser(
        "set-enqueue-shards", help="change a queue's enqueue shards (S)",
        description="Set S, the enqueue shards of a queue and all its stripes (1..64). "
        "Raising provisions the new lanes in the same transaction; lowering lets the lanes "
        "above the new S drain.")
    add_connection(p)
    p.add_argument("--queue", required=True, help="logical queue name")
    p.add_argument("--shards", required=True, type=int, help="new S, 1..64")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.set_defaults(func=cmd_set_enqueue_shards)

    s = ss.add_parser("show", help="queues, their S and per-lane depth and lag")
    add_connection(s)
    s.add_argument("--queue", help="one logical queue (all its stripes)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_show)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_set_enqueue_shards(args: argparse.Namespace) -> int:
    if not 1 <= args.shards <= 64:
        print(f"awa: --shards must be between 1 and 64, got {args.shards}", file=sys.stderr)
        return 2
    with connect(args.dsn) as conn:
        plan = storage.plan_enqueue_shards(conn, args.queue, args.shards)
        conn.rollback()
        print(table(["physical queue", "current S", "new S", "lanes to create"],
                    [(c.physical_queue, c.old_shards, c.new_shards, c.lanes_created)
                     for c in plan]))
        old = max(c.old_shards for c in plan)
        print()
        print(storage.ordering_consequence(args.queue, old, args.shards))
        if args.dry_run:
            print("dry run: nothing changed")
            return 0
        if not args.yes and not _confirm(f"Set S = {args.shards} for {args.queue}?"):
            print("awa: not changed: pass --yes to change S when not attached to a terminal, "
                  "or answer y", file=sys.stderr)
            return EXIT_NOT_CONFIRMED
        changes = storage.set_enqueue_shards(conn, args.queue, args.shards)
        conn.commit()
    print()
    print(table(["physical queue", "old S", "new S", "lanes created"],
                [(c.physical_queue, c.old_shards, c.new_shards, c.lanes_created)
                 for c in changes]))
    return 0


def _fmt_age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def _state(lane: storage.LaneStatus, shards: int) -> str:
    if lane.shard < shards:
        return "active"
    return "draining" if lane.draining else "retired (>= S, empty)"


def cmd_show(args: argparse.Namespace) -> int:
    with connect(args.dsn) as conn:
        queues = storage.show(conn, args.queue)
    if args.json:
        print(json.dumps({"queues": [q.as_dict() for q in queues]}, indent=2, sort_keys=True))
        return 0
    if not queues:
        print("no queues" if args.queue is None else f"no queue {args.queue!r}")
        return 0 if args.queue is None else 1
    print(table(
        ["queue", "S", "mode", "paused", "stripes", "ready", "running", "scheduled", "failed",
         "oldest ready"],
        [(q.queue, q.enqueue_shards, q.shard_mode, "yes" if q.paused else "no", q.stripes,
          q.ready, q.running, q.scheduled, q.failed, _fmt_age(q.oldest_ready_age_seconds))
         for q in queues]))
    for q in queues:
        print(f"\nlanes of {q.queue} (S = {q.enqueue_shards})")
        print(table(
            ["priority", "shard", "ready", "lag", "next seq", "claim position", "state"],
            [(ln.priority, ln.shard, ln.ready, _fmt_age(ln.lag_seconds), ln.next_seq,
              ln.claim_position, _state(ln, q.enqueue_shards))
             for ln in q.lanes]))
    return 0
