-- enqueue.sql: single-row and batch enqueue, and promotion of due jobs.
--
-- Every path routes the same way (awa._acquire_lane / awa._insert_ready),
-- reads awa.queue_meta at each statement (a change of S applies at the
-- change's commit), and holds each lane's lock from before its sequence
-- advances until commit, so lane_seq order is commit order within a lane.

-- Function: awa._check_job(kind text, priority smallint, max_attempts integer) returns void
create or replace function awa._check_job(
    kind text, priority smallint, max_attempts integer
)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if kind is null then
        raise exception 'kind must not be null'
            using errcode = '22004';
    end if;
    perform awa._check_priority(priority);
    if max_attempts is null or max_attempts not between 1 and 1000 then
        raise exception 'max_attempts must be between 1 and 1000, got %',
            coalesce(max_attempts::text, 'null')
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa.enqueue(queue, kind, args, priority, ordering_key, run_at, max_attempts)
-- Enqueues one job. Role: awa_producer.
-- Returns: awa.enqueued (job_id, queue, priority, enqueue_shard, lane_seq);
--   enqueue_shard and lane_seq are null when run_at is in the future.
-- Errors: 22004 null queue or kind; 22023 bad queue name, priority or max_attempts.
create or replace function awa.enqueue(
    queue text,
    kind text,
    args jsonb default '{}',
    priority smallint default 2,
    ordering_key bytea default null,
    run_at timestamptz default null,
    max_attempts integer default 25
)
returns awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
    lane awa.lanes;
    new_job bigint;
    new_seq bigint;
begin
    perform awa._check_job(kind, priority, max_attempts);
    meta := awa._ensure_queue(queue);
    if run_at is not null and run_at > now() then
        new_job := nextval('awa.job_id_seq');
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        ) values (
            new_job, meta.queue_id, enqueue.priority, enqueue.kind,
            coalesce(enqueue.args, '{}'), enqueue.ordering_key, 0, enqueue.max_attempts,
            now(), enqueue.run_at
        );
        return row(new_job, meta.queue, enqueue.priority, null, null)::awa.enqueued;
    end if;
    lane := awa._acquire_lane(meta.queue_id, meta.enqueue_shards, priority, ordering_key);
    new_seq := nextval(lane.seq);
    new_job := nextval('awa.job_id_seq');
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    ) values (
        lane.lane_id, new_seq, new_job, meta.queue_id, enqueue.priority, enqueue.kind,
        coalesce(enqueue.args, '{}'), enqueue.ordering_key, 0, enqueue.max_attempts,
        now(), clock_timestamp()
    );
    return row(new_job, meta.queue, enqueue.priority, lane.shard, new_seq)::awa.enqueued;
end;
$$;

-- Function: awa._route_rows(queue_ids, shards, priorities, ordering_keys) returns integer[]
-- The lane of every row of a multi-row call, with every lane's lock held.
-- Keyed rows go by hash; each unkeyed (queue, priority) group uses one lane:
-- one this transaction holds already, or one a keyed row of the call takes,
-- or a free one, tried without waiting. Waiting happens only in ascending
-- lane id, so two calls can never deadlock each other.
create or replace function awa._route_rows(
    queue_ids integer[], shards integer[], priorities smallint[], ordering_keys bytea[]
)
returns integer[]
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    lane_of integer[];
    keyed integer[];
    max_held integer := 0;
    grp record;
    chosen integer;
    held text;
    candidates integer[];
    start integer;
    lane_id integer;
begin
    -- Keyed rows: the lane of their shard.
    lane_of := array(
        select l.lane_id
          from unnest(queue_ids, shards, priorities, ordering_keys)
               with ordinality as r (queue_id, shards, priority, ordering_key, idx)
          left join awa.lanes as l
            on r.ordering_key is not null
           and l.queue_id = r.queue_id
           and l.priority = r.priority
           and l.shard = awa.shard_for_ordering_key(r.ordering_key, r.shards)
         order by r.idx
    );
    keyed := array(select distinct k from unnest(lane_of) as k where k is not null order by k);
    foreach lane_id in array keyed loop
        perform pg_advisory_xact_lock(1635213644, lane_id);
        max_held := lane_id;
    end loop;

    -- Unkeyed groups.
    for grp in
        select distinct r.queue_id, r.shards, r.priority
          from unnest(queue_ids, shards, priorities, ordering_keys)
               as r (queue_id, shards, priority, ordering_key)
         where r.ordering_key is null
         order by r.queue_id, r.priority
    loop
        chosen := nullif(
            current_setting(awa._held_lane_setting(grp.queue_id, grp.priority), true), ''
        )::integer;
        if chosen is null then
            select min(l.lane_id) into chosen
              from awa.lanes as l
             where l.lane_id = any(keyed)
               and l.queue_id = grp.queue_id
               and l.priority = grp.priority;
        end if;
        if chosen is null then
            candidates := array(
                select l.lane_id from awa.lanes as l
                 where l.queue_id = grp.queue_id
                   and l.priority = grp.priority
                   and l.shard < grp.shards
                 order by l.shard
            );
            start := pg_backend_pid() % cardinality(candidates);
            for i in 0 .. cardinality(candidates) - 1 loop
                if pg_try_advisory_xact_lock(
                    1635213644, candidates[(start + i) % cardinality(candidates) + 1]
                ) then
                    chosen := candidates[(start + i) % cardinality(candidates) + 1];
                    exit;
                end if;
            end loop;
            if chosen is null then
                -- All busy: wait on the first lane above everything held, so waits
                -- stay in ascending order; the sticky lane only if there is none.
                for i in 0 .. cardinality(candidates) - 1 loop
                    if candidates[(start + i) % cardinality(candidates) + 1] > max_held then
                        chosen := candidates[(start + i) % cardinality(candidates) + 1];
                        exit;
                    end if;
                end loop;
                chosen := coalesce(chosen, candidates[start + 1]);
                perform pg_advisory_xact_lock(1635213644, chosen);
            end if;
            max_held := greatest(max_held, chosen);
        end if;
        if chosen is null then
            raise exception 'no lane for queue id % priority %', grp.queue_id, grp.priority
                using errcode = 'AW003';
        end if;
        perform set_config(
            awa._held_lane_setting(grp.queue_id, grp.priority), chosen::text, true
        );
        lane_of := array(
            select case
                when r.ordering_key is null and r.queue_id = grp.queue_id
                    and r.priority = grp.priority then chosen
                else r.lane_id
            end
              from unnest(queue_ids, priorities, ordering_keys, lane_of)
                   with ordinality as r (queue_id, priority, ordering_key, lane_id, idx)
             order by r.idx
        );
    end loop;
    return lane_of;
end;
$$;

-- Function: awa._number(lane_of integer[]) returns bigint[]
-- The lane_seq of every element: one sequence range per lane, numbered in
-- element order. Safe because only the holder of a lane's lock advances its
-- sequence. Null lanes get null.
create or replace function awa._number(lane_of integer[])
returns bigint[]
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    grp record;
    first_value bigint;
    lane_ids integer[] := '{}';
    firsts bigint[] := '{}';
begin
    for grp in
        select u.lane_id as id, count(*) as n, min(l.seq::oid)::regclass as seq
          from unnest(lane_of) as u (lane_id)
          join awa.lanes as l on l.lane_id = u.lane_id
         group by u.lane_id
         order by u.lane_id
    loop
        first_value := nextval(grp.seq);
        if grp.n > 1 then
            perform setval(grp.seq, first_value + grp.n - 1);
        end if;
        lane_ids := lane_ids || grp.id;
        firsts := firsts || first_value;
    end loop;
    return array(
        select f.first_seq + row_number() over (partition by u.lane_id order by u.i) - 1
          from unnest(lane_of) with ordinality as u (lane_id, i)
          left join unnest(lane_ids, firsts) as f (lane_id, first_seq)
            on f.lane_id = u.lane_id
         order by u.i
    );
end;
$$;

-- Function: awa.enqueue_batch(queues, kinds, args, priorities, ordering_keys, run_ats,
--                             max_attempts)
-- Enqueues many jobs in one call from typed parallel arrays, one element per
-- job. queues and kinds are required; the other arrays may be null (all
-- defaults) and a null element takes the default. Role: awa_producer.
-- Returns: one awa.enqueued row per input, in input order.
-- Errors: 22023 arrays of different lengths (naming them), bad elements
--   (naming the index); 22004 null queue or kind elements.
create or replace function awa.enqueue_batch(
    queues text[],
    kinds text[],
    args jsonb[] default null,
    priorities smallint[] default null,
    ordering_keys bytea[] default null,
    run_ats timestamptz[] default null,
    max_attempts integer[] default null
)
returns setof awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    bad record;
    queue_ids integer[];
    shard_counts integer[];
    prios smallint[];
    lane_of integer[];
    seqs bigint[];
    q text;
begin
    if queues is null or kinds is null then
        raise exception '% must not be null',
            case when queues is null then 'queues' else 'kinds' end
            using errcode = '22004';
    end if;
    for bad in
        select a.name, a.len
          from (values
              ('kinds', cardinality(kinds)),
              ('args', cardinality(args)),
              ('priorities', cardinality(priorities)),
              ('ordering_keys', cardinality(ordering_keys)),
              ('run_ats', cardinality(run_ats)),
              ('max_attempts', cardinality(max_attempts))
          ) as a (name, len)
         where a.len is not null and a.len <> n
    loop
        raise exception 'array % has % elements but queues has %', bad.name, bad.len, n
            using errcode = '22023',
                  hint = 'Every array holds one element per job, in the same order.';
    end loop;
    if n = 0 then
        return;
    end if;
    if array_ndims(queues) > 1 then
        raise exception 'queues must be a one-dimensional array' using errcode = '22023';
    end if;

    prios := array(
        select coalesce(p, 2::smallint)
          from unnest(queues, priorities) with ordinality as u (q, p, i)
         order by i
    );
    for bad in
        select u.i, u.q, u.k, u.p, u.m
          from unnest(queues, kinds, prios, max_attempts) with ordinality as u (q, k, p, m, i)
         where u.q is null or u.k is null or u.p not between 1 and 4
            or octet_length(u.q) not between 1 and 200 or strpos(u.q, '#') > 0
            or coalesce(u.m, 25) not between 1 and 1000
         order by u.i
         limit 1
    loop
        begin
            perform awa._check_queue_name(bad.q);
            perform awa._check_job(bad.k, bad.p, coalesce(bad.m, 25));
        exception when others then
            raise exception 'element % (1-based) of the batch: %', bad.i, sqlerrm
                using errcode = sqlstate;
        end;
    end loop;

    -- Create unknown queues in name order, so concurrent calls agree.
    for q in select distinct u.q from unnest(queues) as u (q) order by 1 loop
        perform awa._ensure_queue(q);
    end loop;
    select array_agg(m.queue_id order by u.i), array_agg(m.enqueue_shards::integer order by u.i)
      into queue_ids, shard_counts
      from unnest(queues) with ordinality as u (q, i)
      join awa.queue_meta as m on m.queue = u.q;

    -- Rows due now get a lane; future rows wait in awa.scheduled.
    lane_of := awa._route_rows(
        array(
            select case when t is null or t <= now() then qid end
              from unnest(queue_ids, run_ats) with ordinality as u (qid, t, i)
             order by i
        ),
        shard_counts, prios, ordering_keys
    );

    seqs := awa._number(lane_of);

    return query
    with rows as (
        select
            u.i, u.q, u.qid, u.k, coalesce(u.a, '{}') as a, u.p, u.key,
            coalesce(u.m, 25) as m, u.t, u.lane, u.seq,
            nextval('awa.job_id_seq') as job_id
          from unnest(
              queues, queue_ids, kinds, args, prios, ordering_keys, max_attempts, run_ats,
              lane_of, seqs
          ) with ordinality as u (q, qid, k, a, p, key, m, t, lane, seq, i)
    ),
    to_ready as (
        insert into awa.ready (
            lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
            max_attempts, enqueued_at, ready_at
        )
        select r.lane, r.seq, r.job_id, r.qid, r.p, r.k, r.a, r.key, 0, r.m, now(),
               clock_timestamp()
          from rows as r
         where r.lane is not null
         order by r.lane, r.seq
    ),
    to_scheduled as (
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        )
        select r.job_id, r.qid, r.p, r.k, r.a, r.key, 0, r.m, now(), r.t
          from rows as r
         where r.lane is null
    )
    select r.job_id, r.q, r.p, l.shard, r.seq
      from rows as r
      left join awa.lanes as l on l.lane_id = r.lane
     order by r.i;
end;
$$;

-- Function: awa.promote_due(max_jobs integer default 10000) returns integer
-- Moves scheduled jobs whose run_at has passed into lanes, routed under the
-- queue's current S (a keyed job goes back to its key's shard). Role:
-- awa_maintenance. Returns how many jobs it moved. Concurrent callers skip
-- each other's rows.
create or replace function awa.promote_due(max_jobs integer default 10000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    job_ids bigint[];
    queue_ids integer[];
    shard_counts integer[];
    prios smallint[];
    ordering_keys bytea[];
    lane_of integer[];
    seqs bigint[];
begin
    if max_jobs is null or max_jobs < 0 then
        raise exception 'max_jobs must be 0 or more, got %', coalesce(max_jobs::text, 'null')
            using errcode = '22023';
    end if;
    select array_agg(d.job_id order by d.run_at, d.job_id),
           array_agg(d.queue_id order by d.run_at, d.job_id),
           array_agg(m.enqueue_shards::integer order by d.run_at, d.job_id),
           array_agg(d.priority order by d.run_at, d.job_id),
           array_agg(d.ordering_key order by d.run_at, d.job_id)
      into job_ids, queue_ids, shard_counts, prios, ordering_keys
      from (
          select s.job_id, s.queue_id, s.priority, s.ordering_key, s.run_at
            from awa.scheduled as s
           where s.run_at <= now()
           order by s.run_at, s.job_id
           limit max_jobs
             for update skip locked
      ) as d
      join awa.queue_meta as m on m.queue_id = d.queue_id;
    if job_ids is null then
        return 0;
    end if;
    lane_of := awa._route_rows(queue_ids, shard_counts, prios, ordering_keys);
    seqs := awa._number(lane_of);
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at, last_error
    )
    select u.lane, u.seq, s.job_id, s.queue_id, s.priority, s.kind, s.args, s.ordering_key,
           s.attempt, s.max_attempts, s.enqueued_at, clock_timestamp(), s.last_error
      from unnest(job_ids, lane_of, seqs) as u (job_id, lane, seq)
      join awa.scheduled as s on s.job_id = u.job_id
     order by u.lane, u.seq;
    delete from awa.scheduled as s where s.job_id = any(job_ids);
    return cardinality(job_ids);
end;
$$;

select awa._grant_execute('awa._check_job(text, smallint, integer)');
select awa._grant_execute(
    'awa.enqueue(text, text, jsonb, smallint, bytea, timestamptz, integer)', 'producer'
);
select awa._grant_execute('awa._route_rows(integer[], integer[], smallint[], bytea[])');
select awa._grant_execute('awa._number(integer[])');
select awa._grant_execute(
    'awa.enqueue_batch(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[])',
    'producer'
);
select awa._grant_execute('awa.promote_due(integer)', 'maintenance');
