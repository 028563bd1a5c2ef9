"""A live database's state: jobs in every state and queues in every shape, for
the tests that move a database to another server (a dump and restore, a
pg_upgrade) and check that it carries on there."""

from __future__ import annotations

from collections import defaultdict

import psycopg


def populate(conn: psycopg.Connection) -> dict:
    """Jobs in every state, and queues in every shape, as a live database has them."""
    def q(statement, *args):
        cur = conn.execute(statement, args)
        return cur.fetchall() if cur.description else []

    # This cluster is further on than a new one (a restore's target) will be.
    q("create temporary table burn (i integer)")
    q("do $$ begin for i in 1..30000 loop begin insert into burn values (i);"
      " exception when others then null; end; end loop; end $$")
    q("select awa.set_enqueue_shards('ready', 4)")
    for i in range(24):
        q("select awa.enqueue('ready', 'k', priority => %s::smallint, ordering_key => %s)",
          1 + i % 3, f"key{i % 5}".encode())
    q("select awa.enqueue('sched', 'k', run_at => now() + interval '1 day')")
    for _ in range(4):
        q("select awa.enqueue('run', 'k')")
    facts = {
        "long": q("select job_id, run_lease from awa.claim(array['run'], 2, 'w-long',"
                  " interval '1 hour')"),
        "lost": q("select job_id, run_lease from awa.claim(array['run'], 2, 'w-lost',"
                  " interval '1 hour')"),
    }
    q("select awa.enqueue('dead', 'k', max_attempts => 1)")
    q("select awa.fail(job_id, run_lease, 'fatal') from awa.claim(array['dead'], 1, 'w')")
    for _ in range(4):
        q("select awa.enqueue('done', 'k', max_attempts => 2)")
    done = q("select job_id, run_lease from awa.claim(array['done'], 3, 'w')")
    q("select awa.complete(%s, %s)", *done[0])
    q("select awa.fail(%s, %s, 'again later', now() + interval '1 day')", *done[1])
    q("select awa.fail(%s, %s, 'retried by the backoff')", *done[2])
    q("select awa.cancel_job(job_id) from awa.jobs('done', 'ready')")
    q("select awa.enqueue('uniq', 'k', unique_key => 'u1'::bytea)")
    q("select awa.enqueue('paused', 'k')")
    q("select awa.pause_queue('paused')")
    q("select awa.enqueue('auto', 'k')")
    q("select * from awa.set_shard_mode('auto', 'auto', 8)")
    q("select awa.autoscale_tick()")
    q("select awa.enqueue('parts', 'k')")
    q("select * from awa.set_queue_partitions('parts', 2)")
    q("select awa.enqueue('parts', 'k', ordering_key => 'p'::bytea)")
    q("select awa.set_enqueue_shards('lowered', 4)")
    q("select awa.set_enqueue_shards('lowered', 1)")
    q("select awa.enqueue('gone', 'k')")
    q("select awa.cancel_job(job_id) from awa.jobs('gone', 'ready')")
    q("select awa.drop_queue('gone', true)")
    facts["ready"] = {r[0] for r in q("select job_id from awa.jobs('ready', 'ready')")}
    facts["max_id"] = q("select max(job_id) from (select job_id from awa.ready"
                        " union all select job_id from awa.scheduled"
                        " union all select job_id from awa.running"
                        " union all select job_id from awa.finished) as j")[0][0]
    return facts


def fifo(claimed) -> bool:
    """Highest priority first; within each lane, lane_seq order."""
    seen = defaultdict(list)
    for row in claimed:
        seen[row[3], row[4]].append(row[5])
    priorities = [row[3] for row in claimed]
    return priorities == sorted(priorities) and all(s == sorted(s) for s in seen.values())
