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

-- Function: awa._enqueue_slow(queue, kind, args, priority, ordering_key, run_at, max_attempts)
-- awa.enqueue for a queue seen for the first time, a keyed row when S > 1,
-- or a job scheduled in the future. Runs inside awa.enqueue's definer frame.
create or replace function awa._enqueue_slow(
    queue text,
    kind text,
    args jsonb,
    priority smallint,
    ordering_key bytea,
    run_at timestamptz,
    max_attempts integer
)
returns awa.enqueued
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
    lane awa.lanes;
    new_job bigint;
    new_seq bigint;
begin
    meta := awa._ensure_queue(queue);
    if run_at is not null and run_at > now() then
        new_job := nextval('awa.job_id_seq');
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        ) values (
            new_job, meta.queue_id, _enqueue_slow.priority, _enqueue_slow.kind,
            coalesce(_enqueue_slow.args, '{}'), _enqueue_slow.ordering_key, 0,
            _enqueue_slow.max_attempts, now(), _enqueue_slow.run_at
        );
        return row(new_job, meta.queue, _enqueue_slow.priority, null, null)::awa.enqueued;
    end if;
    lane := awa._acquire_lane(meta.queue_id, meta.enqueue_shards, priority, ordering_key);
    new_seq := nextval(lane.seq);
    new_job := nextval('awa.job_id_seq');
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    ) values (
        lane.lane_id, new_seq, new_job, meta.queue_id, _enqueue_slow.priority,
        _enqueue_slow.kind, coalesce(_enqueue_slow.args, '{}'), _enqueue_slow.ordering_key, 0,
        _enqueue_slow.max_attempts, now(), clock_timestamp()
    );
    return row(new_job, meta.queue, _enqueue_slow.priority, lane.shard, new_seq)::awa.enqueued;
end;
$$;

-- Function: awa.enqueue(queue, kind, args, priority, ordering_key, run_at, max_attempts)
-- Enqueues one job. Role: awa_producer.
-- Returns: awa.enqueued (job_id, queue, priority, enqueue_shard, lane_seq);
--   enqueue_shard and lane_seq are null when run_at is in the future.
-- Errors: 22004 null queue or kind; 22023 bad queue name, priority or max_attempts.
-- The common case (a known queue, unkeyed or S = 1, due now) runs in one
-- frame with one lookup; everything else goes through awa._enqueue_slow.
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
    q_id integer;
    shards integer;
    lane_id integer;
    lane_seq_class regclass;
    lane_shard integer;
    held text;
    got_lock boolean;
    new_seq bigint;
    new_job bigint;
    candidate record;
begin
    if kind is null or priority is null or priority not between 1 and 4
        or max_attempts is null or max_attempts not between 1 and 1000 then
        perform awa._check_job(kind, priority, max_attempts);
    end if;
    -- One statement for the common case: the queue's S, the lane this
    -- transaction already holds (if any), else this backend's sticky lane,
    -- tried without waiting.
    select m.queue_id, m.enqueue_shards, l.lane_id, l.seq, l.shard, h.held,
           h.held is not null or pg_try_advisory_xact_lock(1635213644, l.lane_id)
      into q_id, shards, lane_id, lane_seq_class, lane_shard, held, got_lock
      from awa.queue_meta as m
     cross join lateral (
         select nullif(current_setting('awa.lane_' || m.queue_id || '_' || enqueue.priority,
                                       true), '')::integer as held
     ) as h
      join awa.lanes as l
        on l.queue_id = m.queue_id
       and l.priority = enqueue.priority
       and (
           (h.held is not null and l.lane_id = h.held)
           or (h.held is null and l.shard = pg_backend_pid() % m.enqueue_shards)
       )
     where m.queue = enqueue.queue
       and (enqueue.ordering_key is null or m.enqueue_shards = 1)
       and (enqueue.run_at is null or enqueue.run_at <= now());
    if not found then
        return awa._enqueue_slow(queue, kind, args, priority, ordering_key, run_at, max_attempts);
    end if;
    if not got_lock then
        -- The sticky lane is busy: any free lane, else wait for the sticky one.
        for candidate in
            select l.lane_id, l.seq, l.shard
              from awa.lanes as l
             where l.queue_id = q_id and l.priority = enqueue.priority
               and l.shard < shards and l.shard <> lane_shard
             order by (l.shard - lane_shard + shards) % shards
        loop
            if pg_try_advisory_xact_lock(1635213644, candidate.lane_id) then
                lane_id := candidate.lane_id;
                lane_seq_class := candidate.seq;
                lane_shard := candidate.shard;
                got_lock := true;
                exit;
            end if;
        end loop;
        if not got_lock then
            perform pg_advisory_xact_lock(1635213644, lane_id);
        end if;
    end if;
    if held is null then
        held := set_config('awa.lane_' || q_id || '_' || priority, lane_id::text, true);
    end if;
    new_seq := nextval(lane_seq_class);
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    ) values (
        lane_id, new_seq, nextval('awa.job_id_seq'), q_id, enqueue.priority, enqueue.kind,
        coalesce(enqueue.args, '{}'), enqueue.ordering_key, 0, enqueue.max_attempts,
        now(), clock_timestamp()
    )
    returning awa.ready.job_id into new_job;
    return row(new_job, enqueue.queue, enqueue.priority, lane_shard, new_seq)::awa.enqueued;
end;
$$;

-- Function: awa._place_rows(queue_ids, priorities, ordering_keys, out lane_of, out seq_of)
-- The lane and lane_seq of every row of a multi-row call (null where
-- queue_ids is null: rows that are not due), with every lane's lock held.
-- Keyed rows go by hash under the queue's current S and their lanes are
-- locked in ascending lane id. Each unkeyed (queue, priority) group takes
-- one lane: the one this transaction already holds for it (a keyed group of
-- this call included), else a free one tried without waiting, else it waits
-- only on a lane above every lane it holds, so calls never deadlock each
-- other. Each lane reserves one sequence range, numbered in input order.
create or replace function awa._place_rows(
    queue_ids integer[],
    priorities smallint[],
    ordering_keys bytea[],
    out lane_of integer[],
    out seq_of bigint[],
    out shard_of smallint[]
)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    key_shards smallint[];
    grp record;
    cand record;
    chosen integer;
    lane_seq_class regclass;
    lane_shard smallint;
    fallback integer;
    sticky integer;
    base bigint;
    max_held integer := 0;
    g_qid integer[] := '{}';
    g_p smallint[] := '{}';
    g_key_shard smallint[] := '{}';
    g_lane integer[] := '{}';
    g_shard smallint[] := '{}';
    g_base bigint[] := '{}';
begin
    -- The shard of every keyed row under its queue's current S.
    if ordering_keys is null or array_length(array_remove(ordering_keys, null), 1) is null then
        key_shards := array_fill(null::smallint, array[cardinality(queue_ids)]);
    else
        key_shards := array(
            select case when u.k is not null and u.qid is not null
                        then awa.shard_for_ordering_key(u.k, m.enqueue_shards) end
              from unnest(queue_ids, ordering_keys) with ordinality as u (qid, k, i)
              left join (
                  select x.queue_id, x.enqueue_shards
                    from awa.queue_meta as x
                   where x.queue_id = any(queue_ids)
              ) as m on m.queue_id = u.qid
             order by u.i
        );
    end if;
    for grp in
        select u.qid, u.p, u.ks, m.enqueue_shards as shards, l.lane_id, l.seq, u.n
          from (
              select x.qid, x.p, x.ks, count(*) as n
                from unnest(queue_ids, priorities, key_shards) as x (qid, p, ks)
               where x.qid is not null
               group by x.qid, x.p, x.ks
          ) as u
          join awa.queue_meta as m on m.queue_id = u.qid
          left join awa.lanes as l
            on l.queue_id = u.qid and l.priority = u.p and l.shard = u.ks
         -- keyed groups first, in ascending lane id; then unkeyed groups
         order by u.ks is null, l.lane_id, u.qid, u.p
    loop
        if grp.ks is not null then
            chosen := grp.lane_id;
            lane_seq_class := grp.seq;
            lane_shard := grp.ks;
            perform pg_advisory_xact_lock(1635213644, chosen);
        else
            fallback := null;
            sticky := null;
            chosen := nullif(
                current_setting('awa.lane_' || grp.qid || '_' || grp.p, true), ''
            )::integer;
            if chosen is null then
                -- Sticky lane (pid mod S) first, then the next ones, without waiting.
                for cand in
                    select l.lane_id,
                           (l.shard - pg_backend_pid() % grp.shards + grp.shards)
                           % grp.shards as turn
                      from awa.lanes as l
                     where l.queue_id = grp.qid and l.priority = grp.p
                       and l.shard < grp.shards
                     order by turn
                loop
                    if pg_try_advisory_xact_lock(1635213644, cand.lane_id) then
                        chosen := cand.lane_id;
                        exit;
                    end if;
                    -- All busy: wait on the first lane above everything held.
                    if fallback is null and cand.lane_id > max_held then
                        fallback := cand.lane_id;
                    end if;
                    sticky := coalesce(sticky, cand.lane_id);
                end loop;
                if chosen is null then
                    chosen := coalesce(fallback, sticky);
                    perform pg_advisory_xact_lock(1635213644, chosen);
                end if;
            end if;
            select l.seq, l.shard into lane_seq_class, lane_shard
              from awa.lanes as l where l.lane_id = chosen;
        end if;
        if chosen is null then
            raise exception 'lane missing for queue id % priority % shard %',
                grp.qid, grp.p, grp.ks
                using errcode = 'AW003';
        end if;
        max_held := greatest(max_held, chosen);
        perform set_config('awa.lane_' || grp.qid || '_' || grp.p, chosen::text, true);
        base := nextval(lane_seq_class);
        if grp.n > 1 then
            perform setval(lane_seq_class, base + grp.n - 1);
        end if;
        g_qid := g_qid || grp.qid;
        g_p := g_p || grp.p;
        g_key_shard := g_key_shard || grp.ks;
        g_lane := g_lane || chosen;
        g_shard := g_shard || lane_shard;
        g_base := g_base || base;
    end loop;
    select array_agg(g.lane order by r.i),
           array_agg(g.base + r.rank - 1 order by r.i),
           array_agg(g.shard order by r.i)
      into lane_of, seq_of, shard_of
      from (
          select u.i, u.qid, u.p, u.ks,
                 row_number() over (partition by u.qid, u.p, u.ks order by u.i) as rank
            from unnest(queue_ids, priorities, key_shards) with ordinality as u (qid, p, ks, i)
      ) as r
      left join unnest(g_qid, g_p, g_key_shard, g_lane, g_shard, g_base)
                as g (qid, p, ks, lane, shard, base)
        on g.qid = r.qid and g.p = r.p and g.ks is not distinct from r.ks;
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
    prios smallint[];
    lane_of integer[];
    seqs bigint[];
    shards smallint[];
    job_ids bigint[];
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
    for q in
        select distinct u.q from unnest(queues) as u (q)
         where not exists (select from awa.queue_meta as m where m.queue = u.q)
         order by 1
    loop
        perform awa._ensure_queue(q);
    end loop;
    queue_ids := array(
        select m.queue_id
          from unnest(queues) with ordinality as u (q, i)
          join (
              select x.queue, x.queue_id from awa.queue_meta as x where x.queue = any(queues)
          ) as m on m.queue = u.q
         order by u.i
    );
    -- Rows due now get a lane; future rows wait in awa.scheduled.
    select p.lane_of, p.seq_of, p.shard_of into lane_of, seqs, shards
      from awa._place_rows(
          case when run_ats is null then queue_ids else array(
              select case when u.t is null or u.t <= now() then u.qid end
                from unnest(queue_ids, run_ats) with ordinality as u (qid, t, i)
               order by u.i
          ) end,
          prios, ordering_keys
      ) as p;
    job_ids := array(select nextval('awa.job_id_seq') from generate_series(1, n));

    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at
    )
    select u.lane, u.seq, u.job_id, u.qid, u.p, u.k, coalesce(u.a, '{}'), u.key, 0,
           coalesce(u.m, 25), now(), clock_timestamp()
      from unnest(
          lane_of, seqs, job_ids, queue_ids, prios, kinds, args, ordering_keys, max_attempts
      ) as u (lane, seq, job_id, qid, p, k, a, key, m)
     where u.lane is not null;
    if run_ats is not null then
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at
        )
        select u.job_id, u.qid, u.p, u.k, coalesce(u.a, '{}'), u.key, 0, coalesce(u.m, 25),
               now(), u.t
          from unnest(
              lane_of, job_ids, queue_ids, prios, kinds, args, ordering_keys, max_attempts,
              run_ats
          ) as u (lane, job_id, qid, p, k, a, key, m, t)
         where u.lane is null;
    end if;
    return query
    select u.job_id, u.q, u.p, u.shard, u.seq
      from unnest(job_ids, queues, prios, shards, seqs) as u (job_id, q, p, shard, seq);
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
           array_agg(d.priority order by d.run_at, d.job_id),
           array_agg(d.ordering_key order by d.run_at, d.job_id)
      into job_ids, queue_ids, prios, ordering_keys
      from (
          select s.job_id, s.queue_id, s.priority, s.ordering_key, s.run_at
            from awa.scheduled as s
           where s.run_at <= now()
           order by s.run_at, s.job_id
           limit max_jobs
             for update skip locked
      ) as d;
    if job_ids is null then
        return 0;
    end if;
    select p.lane_of, p.seq_of into lane_of, seqs
      from awa._place_rows(queue_ids, prios, ordering_keys) as p;
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
    'awa._enqueue_slow(text, text, jsonb, smallint, bytea, timestamptz, integer)'
);
select awa._grant_execute(
    'awa.enqueue(text, text, jsonb, smallint, bytea, timestamptz, integer)', 'producer'
);
select awa._grant_execute('awa._place_rows(integer[], smallint[], bytea[])');
select awa._grant_execute(
    'awa.enqueue_batch(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[])',
    'producer'
);
select awa._grant_execute('awa.promote_due(integer)', 'maintenance');
