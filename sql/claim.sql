-- claim.sql: claiming jobs and finishing them.
--
-- A claim reads the head of every lane of the requested queues, lanes at or
-- above the current S included (they drain after S is lowered), from where
-- awa.lane_heads says the lane's live rows start: its cost follows the number
-- of lanes, not the rows ever enqueued nor the dead ones vacuum has not yet
-- removed (ADR 012). When they are the lanes of one queue that has only
-- ever had S = 1 (one per priority), it reads them one by one in priority
-- order and stops once it has its jobs (ADR 016, ADR 019).
--
-- Every entry point here pins enable_seqscan = off: awa.ready and awa.running
-- are looked up by key only. awa.running is small and churns, so statistics
-- taken when it was nearly empty would otherwise make a kept plan scan its
-- heap, dead rows and all, until the next vacuum.

-- Function: awa._advance_lane_heads(lanes integer[], seqs bigint[]) returns void
-- Moves each lane's claim hint up to seqs[i], the lane's first row visible to
-- the claim that calls it: every row below it is gone for good (lane_seq
-- order is commit order, and a deleted row never comes back), so any later
-- claim may start there. Skips a hint another claim is writing.
create or replace function awa._advance_lane_heads(lanes integer[], seqs bigint[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    with lockable as (
        select h.lane_id, x.seq
          from awa.lane_heads as h
          join unnest(lanes, seqs) as x (lane_id, seq) on x.lane_id = h.lane_id
           for update of h skip locked
    ),
    moved as (
        update awa.lane_heads as h
           set head_seq = l.seq
          from lockable as l
         where h.lane_id = l.lane_id and h.head_seq < l.seq
    )
    insert into awa.lane_heads (lane_id, head_seq)
    select x.lane_id, x.seq
      from unnest(lanes, seqs) as x (lane_id, seq)
     where not exists (select from awa.lane_heads as h where h.lane_id = x.lane_id)
        on conflict (lane_id) do nothing;
end;
$$;

-- Function: awa._claim_merged(queues, max_jobs, worker, lease)
-- awa.claim's general path, for lanes that share a priority (S > 1, several
-- queues, stripes, partitions): looks up the lanes of the named, unpaused
-- queues and merges their heads in rounds that widen (ADR 012). The
-- arguments are trusted: awa.claim checked them.
-- Returns: setof awa.claimed, by priority then claim order.
create or replace function awa._claim_merged(
    queues text[],
    max_jobs integer,
    worker text,
    lease interval
)
returns setof awa.claimed
language plpgsql
set search_path = pg_catalog, pg_temp
-- As awa.claim's: a claim only ever looks rows up by primary key.
set plan_cache_mode = force_generic_plan
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    need integer := max_jobs;
    -- A round reads width rows of each lane, plus a spare share of 64 rows
    -- (at least 3): concurrent claimers hold the rows at the head until they
    -- commit. Each further round reads four times as many.
    width bigint := max_jobs;
    rounds integer := 0;
    more boolean;
    batch awa.claimed[];
    claimed awa.claimed[] := '{}';
    one awa.claimed;
    hint_lanes integer[];
    hint_seqs bigint[];
    -- Lane i: lane_ids[i] of lane_queues[i] at priorities[i] and shards[i],
    -- read from heads[i] (awa.lane_heads; 0 without a hint).
    lane_ids integer[];
    heads bigint[];
    priorities smallint[];
    shards smallint[];
    lane_queues text[];
begin
    select
        array_agg(x.lane_id), array_agg(x.head_seq), array_agg(x.priority),
        array_agg(x.shard), array_agg(x.queue)
      into lane_ids, heads, priorities, shards, lane_queues
      from (
          -- Lanes of the named queues only, each hint looked up by key: a
          -- generic plan must not scan every lane and hint.
          select l.lane_id, l.priority, l.shard, m.queue, coalesce(h.head_seq, 0) as head_seq
            from awa.queue_meta as m
           cross join lateral (
               select x.lane_id, x.priority, x.shard
                 from awa.lanes as x
                where x.queue_id = m.queue_id
               offset 0
           ) as l
            left join awa.lane_heads as h on h.lane_id = l.lane_id
           where (m.queue = any(queues) or m.logical_queue = any(queues)
                  or m.root_queue = any(queues))
             and not m.paused
      ) as x;
    if lane_ids is null then
        return;
    end if;
    loop
        with lanes as (
            select
                x.lane_id, x.priority, x.shard, x.queue, x.head_seq,
                width + greatest(3, 64 / cardinality(lane_ids)) as take
              from unnest(lane_ids, heads, priorities, shards, lane_queues)
                  as x (lane_id, head_seq, priority, shard, queue)
        ),
        ranked as (
            -- The first `take` rows of every lane in merge order (g). The
            -- running max of ready_at keeps the merge FIFO within a lane
            -- whatever the clock did.
            select
                c.lane_id, c.lane_seq, c.tid, c.head_seq, c.rn, c.take, c.merge_at,
                row_number() over (order by c.priority, c.merge_at, c.lane_id, c.lane_seq) as g
              from (
                  select
                      ln.lane_id, ln.priority, ln.head_seq, ln.take, h.lane_seq, h.tid,
                      max(h.ready_at) over w as merge_at,
                      row_number() over w as rn
                    from lanes as ln
                   cross join lateral (
                       select r.lane_seq, r.ready_at, r.ctid as tid
                         from awa.ready as r
                        where r.lane_id = ln.lane_id and r.lane_seq >= ln.head_seq
                        order by r.lane_seq
                        limit ln.take
                   ) as h
                  window w as (partition by ln.lane_id order by h.lane_seq)
              ) as c
        ),
        bound as (
            -- A lane that showed all the rows it was asked for may have more,
            -- which could rank anywhere after its last shown one: the merge
            -- order is known up to the first such row.
            select min(k.g) as g from ranked as k where k.rn = k.take
        ),
        picked as (
            -- In merge order, so that rows are fetched only until `need` are
            -- locked; by ctid, as the statement's snapshot keeps every row it
            -- saw in place.
            select r.ctid as tid, k.g
              from (
                  select c.lane_id, c.lane_seq, c.tid, c.g
                    from ranked as c
                   where c.g <= coalesce((select b.g from bound as b), c.g)
                   order by c.g
                  offset 0
              ) as k
              join awa.ready as r
                on r.ctid = k.tid and r.lane_id = k.lane_id and r.lane_seq = k.lane_seq
             order by k.g
             limit need
               for update of r skip locked
        ),
        moved as (
            delete from awa.ready as r
             using picked as p
             where r.ctid = p.tid
            returning r.*, p.g
        ),
        started as (
            insert into awa.running (
                job_id, run_lease, lane_id, lane_seq, queue_id, priority, kind, args,
                ordering_key, attempt, max_attempts, enqueued_at, worker, lease_expires_at
            )
            select
                m.job_id, nextval('awa.run_lease_seq'), m.lane_id, m.lane_seq, m.queue_id,
                m.priority, m.kind, m.args, m.ordering_key, m.attempt + 1, m.max_attempts,
                m.enqueued_at, _claim_merged.worker, now() + _claim_merged.lease
              from moved as m
             order by m.g
            returning awa.running.*
        )
        select
            (select b.g is not null from bound as b),
            array(
                select row(
                    s.job_id, s.run_lease, ln.queue, s.priority, ln.shard, s.lane_seq, s.kind,
                    s.args, s.attempt, s.max_attempts, s.ordering_key
                )::awa.claimed
                  from started as s
                  join lanes as ln on ln.lane_id = s.lane_id
                 order by s.priority, s.run_lease
            ),
            -- Lanes whose first visible row is 64 or more past their hint.
            array(select k.lane_id from ranked as k
                   where k.rn = 1 and k.lane_seq >= k.head_seq + 64 order by k.lane_id),
            array(select k.lane_seq from ranked as k
                   where k.rn = 1 and k.lane_seq >= k.head_seq + 64 order by k.lane_id)
          into more, batch, hint_lanes, hint_seqs;
        if cardinality(hint_lanes) > 0 then
            perform awa._advance_lane_heads(hint_lanes, hint_seqs);
        end if;
        rounds := rounds + 1;
        claimed := claimed || batch;
        need := need - cardinality(batch);
        -- Short only because rows were held: look further down the lanes.
        exit when need = 0 or not more;
        width := width * 4;
    end loop;
    if rounds = 1 then
        foreach one in array claimed loop
            return next one;
        end loop;
    else
        return query select * from unnest(claimed) as c order by c.priority, c.run_lease;
    end if;
end;
$$;

-- Function: awa.claim(queues text[], max_jobs integer, worker text, lease interval)
-- Claims up to max_jobs ready jobs from the named queues and all their
-- partitions and stripes: highest priority first, then the job that has been
-- ready longest across lanes, FIFO within each lane. Rows other transactions
-- hold are skipped, never waited for, and the claim looks further down the
-- lanes instead: it returns fewer than max_jobs only when no other claimable
-- row is left. Paused queues yield nothing.
-- When the names resolve to one physical queue that has only shard 0 lanes
-- (it has never had S > 1; the common case), its lanes hold one priority
-- each and that order is lane by lane: the claim locks the first free rows of
-- each lane in priority order and stops once it has max_jobs, in one
-- statement after a one-row queue lookup (ADR 019). Otherwise
-- awa._claim_merged merges the lanes.
-- Role: awa_worker.
-- Returns: setof awa.claimed, by priority then claim order; each job's
-- attempt is counted from 1.
-- Errors: 22023 max_jobs < 0 or lease <= 0; 22004 null queues or worker.
create or replace function awa.claim(
    queues text[],
    max_jobs integer,
    worker text,
    lease interval default '5 minutes'
)
returns setof awa.claimed
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- The queues array would make the planner re-plan every call, and a generic
-- plan may hash-join awa.ready with a sequential scan, whose cost grows with
-- the table's history: a claim only ever looks rows up by primary key.
set plan_cache_mode = force_generic_plan
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    first_queue integer;
    last_queue integer;
    queue_name text;
    -- The lane at priority 1, shard 1: provisioned once the queue has had
    -- S > 1, and with it a lane per priority at every shard below that S.
    wide integer;
    claimed record;
    one awa.claimed;
    stale boolean := false;
    hint_lanes integer[];
    hint_seqs bigint[];
begin
    if queues is null or worker is null then
        raise exception '% must not be null', case when queues is null then 'queues' else 'worker' end
            using errcode = '22004';
    end if;
    if max_jobs is null or max_jobs < 0 then
        raise exception 'max_jobs must be 0 or more, got %', coalesce(max_jobs::text, 'null')
            using errcode = '22023';
    end if;
    if lease is null or lease <= interval '0' then
        raise exception 'lease must be a positive interval, got %', coalesce(lease::text, 'null')
            using errcode = '22023';
    end if;
    -- Aggregates, not the rows: one statement says whether the names resolve
    -- to one physical queue, and which.
    select min(m.queue_id), max(m.queue_id), min(m.queue), max(m.lane_ids[1][1])
      into first_queue, last_queue, queue_name, wide
      from awa.queue_meta as m
     where (m.queue = any(queues) or m.logical_queue = any(queues) or m.root_queue = any(queues))
       and not m.paused
       and max_jobs > 0;
    if first_queue is null then
        return;
    end if;
    if first_queue <> last_queue or wide is not null then
        return query select * from awa._claim_merged(queues, max_jobs, worker, lease);
        return;
    end if;
    -- Every lane of the queue (all at shard 0, so one per priority) in
    -- priority order, each from its hint; the limits stop the scan, and the
    -- locking, once max_jobs rows are locked.
    for claimed in
        with picked as (
            select h.tid, l.shard, coalesce(hd.head_seq, 0) as head_seq
              from awa.lanes as l
              -- By key: a generic plan must not scan every hint.
              left join lateral (
                  select x.head_seq from awa.lane_heads as x where x.lane_id = l.lane_id
                  offset 0
              ) as hd on true
             cross join lateral (
                 select r.ctid as tid
                   from awa.ready as r
                  where r.lane_id = l.lane_id and r.lane_seq >= coalesce(hd.head_seq, 0)
                  order by r.lane_seq
                  limit max_jobs
                    for update of r skip locked
             ) as h
             where l.queue_id = first_queue
             order by l.priority, l.shard
             limit max_jobs
        ),
        moved as (
            delete from awa.ready as r
             using picked as p
             where r.ctid = p.tid
            returning r.*, p.shard, p.head_seq, nextval('awa.run_lease_seq') as run_lease
        ),
        started as (
            insert into awa.running (
                job_id, run_lease, lane_id, lane_seq, queue_id, priority, kind, args,
                ordering_key, attempt, max_attempts, enqueued_at, worker, lease_expires_at
            )
            select
                m.job_id, m.run_lease, m.lane_id, m.lane_seq, m.queue_id, m.priority, m.kind,
                m.args, m.ordering_key, m.attempt + 1, m.max_attempts, m.enqueued_at,
                claim.worker, now() + claim.lease
              from moved as m
        )
        select
            row(
                m.job_id, m.run_lease, queue_name, m.priority, m.shard, m.lane_seq, m.kind,
                m.args, m.attempt + 1, m.max_attempts, m.ordering_key
            )::awa.claimed as job,
            -- 64 or more past its lane's hint: the hint may move.
            m.lane_seq >= m.head_seq + 64 as far
          from moved as m
         order by m.priority, m.lane_seq
    loop
        one := claimed.job;
        return next one;
        stale := stale or claimed.far;
    end loop;
    if stale then
        -- Each lane's first row still visible (held by a claim in flight, or
        -- free) is its new head when 64 or more past the hint.
        select array_agg(l.lane_id order by l.lane_id), array_agg(f.lane_seq order by l.lane_id)
          into hint_lanes, hint_seqs
          from awa.lanes as l
          left join lateral (
              select x.head_seq from awa.lane_heads as x where x.lane_id = l.lane_id
              offset 0
          ) as hd on true
         cross join lateral (
             select r.lane_seq
               from awa.ready as r
              where r.lane_id = l.lane_id and r.lane_seq >= coalesce(hd.head_seq, 0)
              order by r.lane_seq
              limit 1
         ) as f
         where l.queue_id = first_queue and f.lane_seq >= coalesce(hd.head_seq, 0) + 64;
        if hint_lanes is not null then
            perform awa._advance_lane_heads(hint_lanes, hint_seqs);
        end if;
    end if;
end;
$$;

-- Function: awa.complete(job_id bigint, run_lease bigint) returns boolean
-- Marks a running job completed. False, changing nothing, when the lease is
-- stale (the job was rescued and claimed again, or already finished).
-- Role: awa_worker.
create or replace function awa.complete(job_id bigint, run_lease bigint)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    with done as (
        delete from awa.running as r
         where r.job_id = complete.job_id and r.run_lease = complete.run_lease
        returning r.*
    )
    insert into awa.finished (job_id, queue_id, priority, kind, state, attempt, enqueued_at)
    select d.job_id, d.queue_id, d.priority, d.kind, 'completed', d.attempt, d.enqueued_at
      from done as d;
    return found;
end;
$$;

-- Function: awa._retry_or_fail(job awa.running, error text, retry_at timestamptz) returns void
-- After a failed attempt: back to awa.scheduled for a retry (exponential
-- backoff, 2^attempt seconds capped at one hour, unless retry_at says when),
-- or finished as failed once attempt reaches max_attempts.
create or replace function awa._retry_or_fail(
    job awa.running, error text, retry_at timestamptz
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if job.attempt >= job.max_attempts then
        insert into awa.finished (
            job_id, queue_id, priority, kind, state, attempt, enqueued_at, last_error
        ) values (
            job.job_id, job.queue_id, job.priority, job.kind, 'failed', job.attempt,
            job.enqueued_at, error
        );
    else
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at, last_error
        ) values (
            job.job_id, job.queue_id, job.priority, job.kind, job.args, job.ordering_key,
            job.attempt, job.max_attempts, job.enqueued_at,
            coalesce(
                retry_at,
                now() + interval '1 second' * least(power(2, job.attempt), 3600)
            ),
            error
        );
    end if;
end;
$$;

-- Function: awa.fail(job_id bigint, run_lease bigint, error text, retry_at timestamptz)
-- Records a failed attempt: retried later (see awa._retry_or_fail) or failed
-- for good after max_attempts. False, changing nothing, for a stale lease.
-- Role: awa_worker.
create or replace function awa.fail(
    job_id bigint, run_lease bigint, error text, retry_at timestamptz default null
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    job awa.running;
begin
    delete from awa.running as r
     where r.job_id = fail.job_id and r.run_lease = fail.run_lease
    returning r.* into job;
    if not found then
        return false;
    end if;
    perform awa._retry_or_fail(job, error, retry_at);
    return true;
end;
$$;

-- Function: awa.heartbeat(job_id bigint, run_lease bigint, extend interval) returns boolean
-- Extends a running job's lease to now() + extend. False for a stale lease.
-- Role: awa_worker.
create or replace function awa.heartbeat(job_id bigint, run_lease bigint, extend interval)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    if extend is null or extend <= interval '0' then
        raise exception 'extend must be a positive interval, got %',
            coalesce(extend::text, 'null')
            using errcode = '22023';
    end if;
    update awa.running as r
       set heartbeat_at = now(), lease_expires_at = now() + extend
     where r.job_id = heartbeat.job_id and r.run_lease = heartbeat.run_lease;
    return found;
end;
$$;

-- Function: awa.rescue_expired(max_jobs integer default 10000) returns integer
-- Running jobs whose lease expired go back to retry with the attempt
-- counted (or fail after max_attempts). The old run_lease is dead from then
-- on. Role: awa_maintenance. Returns how many jobs it rescued.
create or replace function awa.rescue_expired(max_jobs integer default 10000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    job awa.running;
    rescued integer := 0;
begin
    if max_jobs is null or max_jobs < 0 then
        raise exception 'max_jobs must be 0 or more, got %', coalesce(max_jobs::text, 'null')
            using errcode = '22023';
    end if;
    for job in
        delete from awa.running as r
         where r.job_id in (
             select x.job_id from awa.running as x
              where x.lease_expires_at < now()
              order by x.lease_expires_at
              limit max_jobs
                for update skip locked
         )
        returning r.*
    loop
        perform awa._retry_or_fail(job, 'lease expired', null);
        rescued := rescued + 1;
    end loop;
    return rescued;
end;
$$;

select awa._grant_execute('awa._advance_lane_heads(integer[], bigint[])');
select awa._grant_execute('awa._claim_merged(text[], integer, text, interval)');
select awa._grant_execute('awa.claim(text[], integer, text, interval)', 'worker');
select awa._grant_execute('awa.complete(bigint, bigint)', 'worker');
select awa._grant_execute('awa._retry_or_fail(awa.running, text, timestamptz)');
select awa._grant_execute('awa.fail(bigint, bigint, text, timestamptz)', 'worker');
select awa._grant_execute('awa.heartbeat(bigint, bigint, interval)', 'worker');
select awa._grant_execute('awa.rescue_expired(integer)', 'maintenance');
