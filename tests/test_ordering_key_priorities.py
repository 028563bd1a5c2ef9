"""One lane per ordering key at one priority, on real PostgreSQL 17 and 18: a
lane is per (queue, priority, shard), so one key's jobs at two priorities
are in two lanes, and a claim, priority first, runs the key's later job at a
higher priority before its earlier one at a lower (docs/concepts.md,
docs/sql-api.md "Ordering key"). At one priority the key keeps FIFO order.
"""

from __future__ import annotations

import pytest

from tests.support.jobs import enqueue


@pytest.mark.parametrize("shards", [1, 4])
def test_one_keys_later_job_at_a_higher_priority_is_claimed_first(db, logins, shards):
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('keyed', %s)", [shards])
    with db.connect(logins.producer) as p:
        low = enqueue(p, "keyed", priority=3, ordering_key=b"account-7")
        high = enqueue(p, "keyed", priority=1, ordering_key=b"account-7")
        same_a = enqueue(p, "keyed", priority=2, ordering_key=b"account-8")
        same_b = enqueue(p, "keyed", priority=2, ordering_key=b"account-8")
    with db.connect() as su:
        lanes = dict(su.execute("select job_id, lane_id from awa.ready").fetchall())
    assert lanes[low[0]] != lanes[high[0]]  # one key, two priorities: two lanes
    assert lanes[same_a[0]] == lanes[same_b[0]]  # one key, one priority: one lane
    with db.connect(logins.worker) as w:
        order = w.execute("select job_id, priority"
                          " from awa.claim(array['keyed'], 10, 'w')").fetchall()
    assert order == [(high[0], 1), (same_a[0], 2), (same_b[0], 2), (low[0], 3)]
