"""The whole API at once (tests/support/chaos.py): producers, workers, an
operator and maintenance over four queues for a few seconds on real
PostgreSQL 17 and 18, then the invariants. A failure names the seed and the
failing caller's last calls; ``python -m tests.support.chaos --seed N``
replays the mix for longer."""

from __future__ import annotations

from tests.support.chaos import Chaos

SEED = 20261206
SECONDS = 12


def test_the_whole_api_at_once_keeps_every_job_once(db, logins):
    report = Chaos(db, logins, SEED, SECONDS).run()
    # The run did what it is for: every kind of call, and the refusals counted.
    calls = report["calls"]
    for op in ("enqueue", "enqueue_batch", "copy", "claim", "complete", "fail", "heartbeat",
               "cancel_job", "retry_job", "set_enqueue_shards", "pass:promote", "pass:rescue"):
        assert calls.get(f"{op} ok", 0) > 0, (op, calls)
    assert report["claims"] > 100, report
