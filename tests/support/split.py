"""How ``make test`` splits one PostgreSQL version's test files between its
workers: by the seconds each file took in a recorded run, so that the
heaviest worker, which the whole suite waits for, carries no more than it must.

The record is ``tests/durations.json`` (seconds per file per version), written
by ``make test-durations``. A file it does not know yet (a new one) weighs its
number of tests times the version's mean seconds per recorded test, so the
split stays balanced between two recordings; re-record when it drifts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "durations.json"


def load(path: Path = RECORD) -> dict[str, dict[str, float]]:
    """``{version id: {file: seconds}}``; empty when there is no record."""
    try:
        return json.loads(path.read_text())["seconds"]
    except FileNotFoundError:
        return {}


def assign(tests: Iterable[tuple[str, str]], parts: int,
           record: dict[str, dict[str, float]]) -> dict[tuple[str, str], int]:
    """``(version id, file)`` -> part in ``range(parts)``, for the pairs of
    ``tests`` (one pair per collected test). Longest processing time first:
    files from the heaviest, each to the lightest part so far; ties broken by
    name, so every worker computes the same split."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for version, path in tests:
        counts[version][path] += 1
    split: dict[tuple[str, str], int] = {}
    for version, files in counts.items():
        known = record.get(version, {})
        recorded = [n for f, n in files.items() if f in known]
        per_test = (sum(known[f] for f in files if f in known) / sum(recorded)
                    if recorded else 1.0)
        weight = {f: known.get(f, n * per_test) for f, n in files.items()}
        load_of = [0.0] * parts
        for f in sorted(files, key=lambda f: (-weight[f], f)):
            part = min(range(parts), key=lambda p: (load_of[p], p))
            split[(version, f)] = part
            load_of[part] += weight[f]
    return split


def write(seconds: dict[str, dict[str, float]], path: Path = RECORD) -> None:
    rounded = {v: {f: round(s, 1) for f, s in sorted(files.items())}
               for v, files in sorted(seconds.items())}
    path.write_text(json.dumps(
        {"about": "Seconds per test file per PostgreSQL version in one run of "
                  "the suite, for tests/support/split.py; make test-durations "
                  "writes it.",
         "seconds": rounded}, indent=1) + "\n")
