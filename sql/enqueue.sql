-- enqueue.sql: single-row and batch enqueue, and promotion of due jobs.
--
-- Every path chooses lanes the same way (awa._take_lane, sql/lanes.sql),
-- reads awa.queue_meta at each statement (a change of S applies at the
-- change's commit), and holds each lane's lock from before its sequence
-- advances until commit, so lane_seq order is commit order within a lane.
--
-- Every path checks rows with awa._job_ok (sql/queues.sql). Jobs are
-- written by awa._insert_jobs, the general insert (the batch path,
-- promotion, and COPY's general mover through the batch path), and by fast
-- paths that repeat it for one input shape, each compared with it by
-- tests/test_path_differential.py: awa.enqueue (one row), awa.enqueue_batch
-- (one lane range) and COPY's set-based movers (sql/copy.sql).

-- Function: awa.enqueue(queue, kind, args, priority, ordering_key, run_at, max_attempts,
--                       unique_key, unique_window)
-- Enqueues one job. Role: awa_producer. A job with a max run time of its
-- own goes through awa.enqueue_batch (one element is a batch): an argument
-- here would cost every call its test on the fast path (ADR 026). A job
-- with a unique key goes the general way, which takes the key before any
-- lane (awa._take_unique_keys, ADR 027): while another job of the logical
-- queue holds it, nothing is inserted and the holder is returned.
-- Returns: awa.enqueued (job_id, queue, priority, enqueue_shard, lane_seq,
--   duplicate); enqueue_shard and lane_seq are null when run_at is in the
--   future or for a duplicate.
-- Errors: 22004 null queue or kind; 22023 bad queue name, priority,
--   max_attempts, unique_key or unique_window, an ordering_key over
--   1024 bytes (awa._ordering_key_ok, sql/routing.sql), or a run_at not
--   before 9999-12-31 UTC (awa._run_at_ok).
-- A fast path (docs/fast-paths.md) of awa._insert_jobs for one row, in
-- two labelled blocks: sticky (its test: awa._sticky_ok, sql/lanes.sql)
-- and in_turn within it; the rest is the block general. The common case (a known
-- plain queue, a valid unkeyed job due now, no lane memo in this
-- transaction, the sticky lane free) is one index lookup that reads the
-- sticky lane, one condition and the insert. PL/pgSQL sets up each
-- expression it evaluates again in every transaction, and every function
-- call in it costs an EXECUTE check and a lookup there: that set-up, not the
-- work, was most of this function's cost, so the common case has few
-- statements and few calls (docs/benchmarks.md). When only the sticky lane
-- was missing (another producer holds it), the call does what
-- awa._take_lane does for that case: the lanes read again and tried in
-- turn, else a wait for the sticky lane, and a memo (ADR 021). Anything
-- else goes the general way: the full check, S and the lanes read again,
-- routing (a new queue, a partitioned or striped name), awa.scheduled for a
-- job for later, and awa._take_lane (tests/test_path_differential.py
-- compares the ways, with lanes held by another transaction).
-- Calls: awa._check_job, awa._check_ordering_key, awa._check_run_at, awa._check_unique,
--   awa._default_args, awa._ensure_queue, awa._first_attempt, awa._in_turn, awa._insert_jobs,
--   awa._job_ok, awa._key_shard, awa._lane_memo_name, awa._lane_wait_total, awa._lock_class_lane,
--   awa._mark_unique_jobs, awa._ordering_key_ok, awa._route_queue, awa._run_at_ok, awa._sticky,
--   awa._sticky_ok, awa._take_lane, awa._take_unique_keys, awa._unique_ok
-- Writes: awa.ready, awa.scheduled
create or replace function awa.enqueue(
    queue text,
    kind text,
    args jsonb default '{}',
    priority smallint default 2,
    ordering_key bytea default null,
    run_at timestamptz default null,
    max_attempts integer default 25,
    unique_key bytea default null,
    unique_window interval default null
)
returns awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q_id integer;
    shards integer;
    shard integer;
    lane integer;
    seq regclass;
    lane_ids integer[];
    lane_seqs regclass[];
    routed text;  -- the partition or stripe a routed name went to
    new_seq bigint;
    new_job bigint;
    took boolean;  -- in turn: whether the try-lock took the lane
    memo text;
    started timestamptz;
    holder_q integer;  -- a unique key's holder's queue
begin
    -- Three ways, each a labelled block (docs/fast-paths.md): sticky, then
    -- in_turn when the sticky lane is taken, both leaving with `exit
    -- general` once they hold a lane; else the general way. Each exit
    -- test is one expression (every expression costs every call its
    -- set-up): the common case evaluates no more than before the blocks.
    <<general>>
    begin
        <<sticky>>
        begin
            exit sticky when ordering_key is not null or unique_key is not null
                          or unique_window is not null;
            -- S itself is not read here: only the other ways use it, and each
            -- reads it again (an integer variable set from a smallint column
            -- costs a cast set up per transaction).
            select m.queue_id, awa._sticky(m.enqueue_shards),
                   m.lane_ids[enqueue.priority][awa._sticky(m.enqueue_shards)],
                   m.lane_seqs[enqueue.priority][awa._sticky(m.enqueue_shards)]
              into q_id, shard, lane, seq
              from awa.queue_meta as m
             where m.queue = enqueue.queue and m.stripes = 1 and m.partitions = 1;
            exit sticky when not found
                          or not awa._sticky_ok(queue, kind, priority, max_attempts, run_at);
            -- A priority out of range finds no lane, and
            -- pg_try_advisory_xact_lock of null is null: not taken.
            exit general when pg_try_advisory_xact_lock(awa._lock_class_lane(), lane);

            <<in_turn>>
            begin
                -- The sticky lane is taken: what awa._take_lane does for an
                -- unkeyed row with no memo. The first free lane in turn (S and
                -- the lanes read again), else a wait for the sticky lane; and a
                -- memo for the lane. Everything but the wait's total is done
                -- before the wait: other producers wait while this one holds
                -- the lane. A missing lane (a bug) goes the general way, which
                -- names it.
                select m.enqueue_shards, m.lane_ids, m.lane_seqs
                  into shards, lane_ids, lane_seqs
                  from awa.queue_meta as m
                 where m.queue_id = q_id;
                for i in 0 .. shards - 1 loop
                    shard := awa._in_turn(shards, i);
                    took := pg_try_advisory_xact_lock(
                        awa._lock_class_lane(), lane_ids[priority][shard]
                    );
                    exit when took;
                end loop;
                if not took then
                    shard := awa._sticky(shards);
                end if;
                lane := lane_ids[priority][shard];
                seq := lane_seqs[priority][shard];
                exit in_turn when lane is null;
                memo := set_config(awa._lane_memo_name(q_id, priority), shard::text, true)
                        || set_config('awa.lane_memo', 'on', true);
                if not took then
                    started := clock_timestamp();
                    perform pg_advisory_xact_lock(awa._lock_class_lane(), lane);
                    memo := set_config(
                        'awa.lane_lock_wait_us', awa._lane_wait_total(started, clock_timestamp()),
                        true
                    );
                end if;
                exit general;
            end in_turn;
        end sticky;

        -- The general way.
        if not (awa._job_ok(queue, kind, priority, max_attempts)
                and awa._ordering_key_ok(ordering_key)) then
            perform awa._check_job(queue, kind, priority, max_attempts);
            perform awa._check_ordering_key(ordering_key);
        end if;
        -- S again, with the lanes (whole arrays are cheap to read, not to
        -- subscript: the fast way reads its one lane in SQL).
        select m.queue_id, m.enqueue_shards, m.lane_ids, m.lane_seqs
          into q_id, shards, lane_ids, lane_seqs
          from awa.queue_meta as m
         where m.queue = enqueue.queue and m.stripes = 1 and m.partitions = 1;
        -- One test for the rarer ways (each statement costs every call that
        -- evaluates it): a routed name, a job for later, a unique key.
        if not found or (run_at is not null and run_at > now()) or unique_key is not null
           or unique_window is not null then
            -- Here, not with the checks above: a run_at past the bound is in the
            -- future, and a test there would cost every keyed call.
            if not awa._run_at_ok(run_at) then
                perform awa._check_run_at('run_at', run_at);
            end if;
            -- Before a queue is created: its ids are not given back.
            if not awa._unique_ok(unique_key, unique_window) then
                perform awa._check_unique(unique_key, unique_window);
            end if;
            if not found or (run_at is not null and run_at > now()) then
                -- A stripe's own name ('q#1') never gets here: awa._job_ok refuses '#'.
                select m.queue_id, m.enqueue_shards, m.lane_ids, m.lane_seqs, m.queue
                  into q_id, shards, lane_ids, lane_seqs, routed
                  from awa._route_queue(awa._ensure_queue(queue), ordering_key) as m;
            end if;
            if unique_key is not null or unique_window is not null then
                -- The key before any lane, as every path takes it (sql/unique.sql):
                -- held by another job, this call is its duplicate; else the job,
                -- with the id it took the key for, goes the general insert's way
                -- (into a lane, or awa.scheduled for later).
                new_job := nextval('awa.job_id_seq');
                select d.job_id, d.queue_id, d.priority into new_seq, holder_q, shard
                  from awa._take_unique_keys(
                      array[unique_key], array[new_job], array[q_id],
                      array[enqueue.priority], array[unique_window]
                  ) as d;
                if found then
                    -- The holder's queue read by a statement of its own: this
                    -- one's snapshot predates a holder it waited for, whose
                    -- queue (a partition made in its transaction) it cannot see.
                    select m.queue into memo from awa.queue_meta as m where m.queue_id = holder_q;
                    -- new_seq, memo, shard: the holder's job id, queue and priority
                    return row(new_seq, memo, shard, null, null, true)::awa.enqueued;
                end if;
                new_seq := null;
                shard := null;
                if run_at is null or run_at <= now() then
                    shard := awa._take_lane(
                        lane_ids, q_id, priority, shards,
                        awa._key_shard(ordering_key, shards), 0
                    );
                    new_seq := nextval(lane_seqs[priority][shard]);
                end if;
                perform awa._mark_unique_jobs(array[q_id], array[unique_key]);
                perform awa._insert_jobs(
                    array[lane_ids[priority][shard]], array[new_seq], array[q_id],
                    array[enqueue.priority], array[enqueue.kind], array[enqueue.args],
                    array[enqueue.ordering_key], array[enqueue.max_attempts],
                    array[enqueue.run_at], array[new_job]
                );
                return row(
                    new_job, coalesce(routed, enqueue.queue), enqueue.priority, shard,
                    new_seq, false
                )::awa.enqueued;
            end if;
            if run_at is not null and run_at > now() then
                new_job := nextval('awa.job_id_seq');
                insert into awa.scheduled (
                    job_id, queue_id, priority, kind, args, ordering_key, attempt,
                    max_attempts, enqueued_at, run_at, last_error, max_run_time
                ) values (
                    new_job, q_id, enqueue.priority, enqueue.kind,
                    coalesce(enqueue.args, awa._default_args()), enqueue.ordering_key,
                    awa._first_attempt(), enqueue.max_attempts, now(), enqueue.run_at,
                    null, null
                );
                return row(
                    new_job, coalesce(routed, enqueue.queue), enqueue.priority, null, null,
                    false
                )::awa.enqueued;
            end if;
        end if;
        shard := awa._take_lane(
            lane_ids, q_id, priority, shards, awa._key_shard(ordering_key, shards), 0
        );
        lane := lane_ids[priority][shard];
        seq := lane_seqs[priority][shard];
    end general;
    insert into awa.ready (
        lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
        max_attempts, enqueued_at, ready_at, last_error, max_run_time
    ) values (
        lane, nextval(seq), nextval('awa.job_id_seq'), q_id, enqueue.priority, enqueue.kind,
        coalesce(enqueue.args, awa._default_args()), enqueue.ordering_key,
        awa._first_attempt(), enqueue.max_attempts, now(), clock_timestamp(), null, null
    )
    returning awa.ready.lane_seq, awa.ready.job_id into new_seq, new_job;
    return row(
        new_job, coalesce(routed, enqueue.queue), enqueue.priority, shard, new_seq, false
    )::awa.enqueued;
end;
$$;

-- Function: awa._lock_lanes(queue_ids, priorities, key_shards, reserve) returns each row's lane
-- Takes the lanes for the rows of a multi-row call and gives each row its
-- lane, shard and lane_seq. A row is (queue_ids[i], priorities[i] (null:
-- awa._default_priority()), key_shards[i]); key_shards[i] is the keyed shard, or null for an
-- unkeyed row; a row whose queue id is null (not due) gets nulls. Groups the
-- rows, hands the groups to awa._lock_lane_groups, which locks the lanes
-- and reserves one sequence range per lane, and numbers each lane's rows
-- in row order. With reserve false it takes the lanes only (null seqs):
-- COPY's mover holds a whole load's lanes before its first pass. The
-- arrays are read by unnest: a subscript into a flat array with nulls (a
-- record's field, a function's result) walks it from the start.
-- Calls: awa._default_priority, awa._lock_lane_groups
-- Writes: nothing
create or replace function awa._lock_lanes(
    queue_ids integer[],
    priorities smallint[],
    key_shards smallint[],
    reserve boolean default true,
    out lanes integer[],
    out shards smallint[],
    out seqs bigint[]
)
language sql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
    with groups as (
        select l.*
          from (
              select array_agg(u.qid) as qids, array_agg(u.p) as ps, array_agg(u.ks) as kss,
                     array_agg(u.n) as ns
                from (
                    select r.qid, coalesce(r.p, awa._default_priority()) as p,
                           coalesce(r.ks, -1)::smallint as ks, count(*) as n
                      from unnest(queue_ids, priorities, key_shards) as r (qid, p, ks)
                     where r.qid is not null
                     group by 1, 2, 3
                ) as u
          ) as g
         cross join lateral awa._lock_lane_groups(
             coalesce(g.qids, '{}'), coalesce(g.ps, '{}'), coalesce(g.kss, '{}'),
             case when reserve then coalesce(g.ns, '{}') end
         ) as l
    )
    select array_agg(r.lane order by r.i), array_agg(r.shard order by r.i),
           array_agg(r.seq order by r.i)
      from (
          select u.i, x.lane, x.shard,
                 x.base + row_number() over (partition by x.lane order by u.i) - 1 as seq
            from unnest(queue_ids, priorities, key_shards) with ordinality as u (qid, p, ks, i)
           cross join groups as g
            left join unnest(g.g_qid, g.g_p, g.g_ks, g.g_lane, g.g_shard, g.g_base)
                      as x (qid, p, ks, lane, shard, base)
              on x.qid = u.qid
             and x.p = coalesce(u.p, awa._default_priority())
             and x.ks = coalesce(u.ks, -1)
      ) as r
$$;

-- Function: awa._insert_jobs(lanes, seqs, queue_ids, priorities, kinds, args, ordering_keys,
--                            max_attempts, run_ats, job_ids, attempts, enqueued_ats,
--                            last_errors, max_run_times) returns setof bigint
-- Writes one job per element i: into lane lanes[i] at lane_seq seqs[i],
-- ready now, or, where lanes[i] is null, into awa.scheduled to run at
-- run_ats[i]. A null element takes its default (awa._default_priority,
-- _default_args, _default_max_attempts), and no max run time of its own
-- (stored in seconds, awa._in_seconds); a new job id, awa._first_attempt
-- and enqueued now, unless the
-- job is moved (awa.promote_due passes job_ids, attempts, enqueued_ats and
-- last_errors). An element whose kind is null is written nowhere (a
-- duplicate of a unique key, awa._enqueue_rows). A row written into a lane
-- with a job id it already had is recorded in awa.ready_late too, the one
-- place such rows are written (ADR 029). Returns the job ids in
-- element order. The arrays come checked and one element per job, indexed
-- from 1; the caller holds the lanes and reserved the sequence values.
-- Calls: awa._default_args, awa._default_max_attempts, awa._default_priority, awa._first_attempt,
--   awa._in_seconds
-- Writes: awa.ready, awa.ready_late, awa.scheduled
create or replace function awa._insert_jobs(
    lanes integer[],
    seqs bigint[],
    queue_ids integer[],
    priorities smallint[],
    kinds text[],
    args jsonb[],
    ordering_keys bytea[],
    max_attempts integer[],
    run_ats timestamptz[],
    job_ids bigint[] default null,
    attempts integer[] default null,
    enqueued_ats timestamptz[] default null,
    last_errors text[] default null,
    max_run_times interval[] default null
)
returns setof bigint
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call.
set plan_cache_mode = force_generic_plan
as $$
begin
    return query
    with rows as (
        select i, coalesce(job_ids[i], nextval('awa.job_id_seq')) as job_id,
               coalesce(priorities[i], awa._default_priority()) as p,
               coalesce(args[i], awa._default_args()) as a,
               coalesce(attempts[i], awa._first_attempt()) as attempt,
               coalesce(max_attempts[i], awa._default_max_attempts()) as m,
               coalesce(enqueued_ats[i], now()) as enqueued_at,
               awa._in_seconds(max_run_times[i]) as run_time
          from generate_series(1, cardinality(kinds)) as i
    ),
    to_ready as (
        insert into awa.ready (
            lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key, attempt,
            max_attempts, enqueued_at, ready_at, last_error, max_run_time
        )
        select lanes[r.i], seqs[r.i], r.job_id, queue_ids[r.i], r.p, kinds[r.i], r.a,
               ordering_keys[r.i], r.attempt, r.m, r.enqueued_at, clock_timestamp(),
               last_errors[r.i], r.run_time
          from rows as r
         where lanes[r.i] is not null and kinds[r.i] is not null
         -- Each lane's rows side by side in the heap: a claim reads a lane's
         -- next rows from few pages.
         order by lanes[r.i], seqs[r.i]
    ),
    to_scheduled as (
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at, last_error, max_run_time
        )
        select r.job_id, queue_ids[r.i], r.p, kinds[r.i], r.a, ordering_keys[r.i], r.attempt,
               r.m, r.enqueued_at, run_ats[r.i], last_errors[r.i], r.run_time
          from rows as r
         where lanes[r.i] is null and kinds[r.i] is not null
    )
    select r.job_id from rows as r order by r.i;
    if job_ids is not null then
        -- Rows entering a lane with an id they already had (ADR 029): with
        -- the highest id handed out so far, which every later row of the
        -- lane's own ids will be above (the caller holds the lanes).
        insert into awa.ready_late (job_id, queue_id, lane_id, lane_seq, stamp)
        select job_ids[i], queue_ids[i], lanes[i], seqs[i],
               pg_sequence_last_value('awa.job_id_seq')
          from generate_series(1, cardinality(kinds)) as i
         where job_ids[i] is not null and lanes[i] is not null and kinds[i] is not null;
    end if;
end;
$$;

-- Function: awa._row_ok(queue, kind, priority, max_attempts, max_run_time, ordering_key,
--                       unique_key, unique_window, run_at) returns boolean
-- The row check of a multi-row enqueue (batch, COPY): awa._job_ok with a
-- null priority or max_attempts defaulted, and the row's max run time,
-- ordering key, unique key and window, and run_at. Inlined.
-- Calls: awa._default_max_attempts, awa._default_priority, awa._job_ok, awa._max_run_time_ok,
--   awa._ordering_key_ok, awa._run_at_ok, awa._unique_ok
-- Writes: nothing
create or replace function awa._row_ok(
    queue text,
    kind text,
    priority smallint,
    max_attempts integer,
    max_run_time interval,
    ordering_key bytea,
    unique_key bytea,
    unique_window interval,
    run_at timestamptz
)
returns boolean
language sql
immutable parallel safe
as $$
    select awa._job_ok(
               queue, kind, coalesce(priority, awa._default_priority()),
               coalesce(max_attempts, awa._default_max_attempts())
           )
       and awa._max_run_time_ok(max_run_time) and awa._ordering_key_ok(ordering_key)
       and awa._unique_ok(unique_key, unique_window) and awa._run_at_ok(run_at)
$$;

-- Function: awa._check_row(queue, kind, priority, max_attempts, max_run_time, ordering_key,
--                          unique_key, unique_window, run_at, row_label, row_n) returns void
-- Raises the error for a row of a multi-row enqueue that awa._row_ok
-- refuses, naming it as "<row_label> <row_n> (1-based): <the check's
-- message>", with the check's SQLSTATE.
-- Calls: awa._check_job, awa._check_ordering_key, awa._check_run_at, awa._check_unique,
--   awa._default_max_attempts, awa._default_priority
-- Writes: nothing
create or replace function awa._check_row(
    queue text,
    kind text,
    priority smallint,
    max_attempts integer,
    max_run_time interval,
    ordering_key bytea,
    unique_key bytea,
    unique_window interval,
    run_at timestamptz,
    row_label text,
    row_n bigint
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._check_job(
        queue, kind, coalesce(priority, awa._default_priority()),
        coalesce(max_attempts, awa._default_max_attempts()), max_run_time
    );
    perform awa._check_ordering_key(ordering_key);
    perform awa._check_unique(unique_key, unique_window);
    perform awa._check_run_at('run_at', run_at);
exception when others then
    raise exception '% % (1-based): %', row_label, row_n, sqlerrm
        using errcode = sqlstate;
end;
$$;

-- Function: awa._route_rows(queues text[], ordering_keys bytea[]) returns each row's queue
-- The queue each row of a multi-row call goes to. Unknown queues are
-- created, in name order so that concurrent calls agree; a row for a
-- partitioned or striped queue goes to its partition, then its stripe (by
-- key, else this backend's sticky one), created when missing. Returns each
-- row's physical queue name, its queue id, and its keyed shard under that
-- queue's current S (null for an unkeyed row), all read in one statement:
-- a queue dropped since its name was found (ADR 044) is looked for again,
-- and created (ADR 049). The rows come checked (awa._row_ok). The one home
-- of the routing of awa._enqueue_rows and of COPY's prologue for keyed
-- loads (awa._move_staged_in_batches).
-- Calls: awa._ensure_queues, awa._key_shard, awa._partition_of, awa._partition_target,
--   awa._stripe_of, awa._stripe_target
-- Writes: nothing
create or replace function awa._route_rows(
    queues text[],
    ordering_keys bytea[],
    out routed text[],
    out queue_ids integer[],
    out key_shards smallint[]
)
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    unknown text[];
begin
    -- Until every row's queue is found: a queue dropped after the names were
    -- read (its row renamed, ADR 044) is no queue of the name any more, and
    -- is created again, as for any enqueue after a drop.
    loop
        select array_agg(distinct u.q order by u.q) into unknown
          from unnest(queues) as u (q)
         where not exists (select from awa.queue_meta as m where m.queue = u.q);
        if unknown is not null then
            perform awa._ensure_queues(unknown);
        end if;

        -- Partitioned and striped queues: each row goes to its partition, then
        -- its stripe (by key, else this backend's sticky one); created when missing.
        routed := queues;
        if exists (
            select from awa.queue_meta as m
             where m.queue = any(queues) and (m.stripes > 1 or m.partitions > 1)
        ) then
            -- awa._route_queue's steps, set-based: each row's partition, each
            -- partition the call reaches looked up (or created) once, each row's
            -- stripe of it, each stripe once. A lookup per row was most of the
            -- cost of routing a row (tests/test_partitions.py compares the two).
            routed := array(
                with by_row as materialized (
                    select u.i, u.q, u.k, awa._partition_of(m.partitions, u.k) as p
                      from unnest(queues, ordering_keys) with ordinality as u (q, k, i)
                      join awa.queue_meta as m on m.queue = u.q
                ),
                by_partition as materialized (
                    select t.q, t.p, (t.target).queue as target_queue,
                           (t.target).stripes as target_stripes, t.target
                      from (
                          select d.q, d.p, awa._partition_target(m, d.p) as target
                            from (select distinct b.q, b.p from by_row as b) as d
                            join awa.queue_meta as m on m.queue = d.q
                           order by d.q, d.p
                      ) as t
                ),
                by_stripe as materialized (
                    select b.i, t.target_queue, awa._stripe_of(t.target_stripes, b.k) as s
                      from by_row as b
                      join by_partition as t on t.q = b.q and t.p = b.p
                ),
                stripes as materialized (
                    select d.target_queue, d.s,
                           (awa._stripe_target(
                               (select t.target from by_partition as t
                                 where t.target_queue = d.target_queue limit 1),
                               d.s
                           )).queue as physical
                      from (select distinct b.target_queue, b.s from by_stripe as b) as d
                     order by d.target_queue, d.s
                )
                select s.physical
                  from by_stripe as b
                  join stripes as s on s.target_queue = b.target_queue and s.s = b.s
                 order by b.i
            );
        end if;

        -- Per row: the queue id, and the keyed shard under the queue's current S.
        select array_agg(m.queue_id order by i),
               array_agg(
                   case when ordering_keys[i] is not null
                        then awa._key_shard(ordering_keys[i], m.enqueue_shards) end
                   order by i
               )
          into queue_ids, key_shards
          from generate_series(1, n) as i
          left join (
              select x.queue, x.queue_id, x.enqueue_shards
                from awa.queue_meta as x
               where x.queue = any(routed)
          ) as m on m.queue = routed[i];
        exit when n = 0 or array_position(queue_ids, null) is null;
    end loop;
end;
$$;

-- Function: awa._due_queue_ids(queue_ids integer[], run_ats timestamptz[]) returns integer[]
-- The queue id of each row of a multi-row call that is due now (run_ats
-- null, or its element null or not after now()), null for a row for later,
-- which takes no lane and waits in awa.scheduled: the lanes a call locks.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._due_queue_ids(queue_ids integer[], run_ats timestamptz[])
returns integer[]
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select case when run_ats is null then queue_ids else array(
            select case when u.run_at is null or u.run_at <= now() then u.queue_id end
              from unnest(queue_ids, run_ats) with ordinality as u (queue_id, run_at, i)
             order by u.i
        ) end
$$;

-- Function: awa._enqueue_rows(queues, kinds, args, priorities, ordering_keys, run_ats,
--                             max_attempts, max_run_times, unique_keys, unique_windows,
--                             row_label, row_offset, job_ids)
-- The general multi-row enqueue, behind awa.enqueue_batch and COPY
-- ingestion. A bad row is named as "<row_label>
-- <index + row_offset>". The arrays come checked: queues and kinds not
-- null, every array one element per job, indexed from 1 (awa.enqueue_batch
-- checks them; COPY builds them). Rows with a unique key take it
-- (awa._take_unique_keys) before any lane is locked; a row whose key
-- another job holds is written nowhere and returned as that job, with
-- duplicate true. job_ids, when given, says the caller took the keys
-- before any lane (COPY's mover does for a load of several passes): the
-- job id each keyed row took its key for, null for a duplicate, which is
-- then returned with duplicate true and a null job id (the holder is the
-- caller's to know); the call takes no key. routed, routed_queue_ids and
-- routed_key_shards, when given, are the rows' routing (awa._route_rows)
-- and say the caller checked them (awa._row_ok): COPY's mover routes a
-- load of several passes once, before its first pass, and holds its
-- lanes (the call's lane locks are then its own again).
-- Calls: awa._check_row, awa._default_priority, awa._due_queue_ids, awa._insert_jobs,
--   awa._lock_lanes, awa._mark_unique_jobs, awa._null_at, awa._route_rows, awa._row_ok,
--   awa._take_unique_keys
-- Writes: nothing
create or replace function awa._enqueue_rows(
    queues text[],
    kinds text[],
    args jsonb[],
    priorities smallint[],
    ordering_keys bytea[],
    run_ats timestamptz[],
    max_attempts integer[],
    max_run_times interval[],
    unique_keys bytea[],
    unique_windows interval[],
    row_label text,
    row_offset bigint,
    job_ids bigint[] default null,
    routed text[] default null,
    routed_queue_ids integer[] default null,
    routed_key_shards smallint[] default null
)
returns setof awa.enqueued
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call; generic plans are
-- right for these queries whatever the batch size.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    bad integer;
    queue_ids integer[];
    key_shards smallint[];
    taken record;
    dup_i integer[];
    dup_job bigint[];
    dup_qid integer[];
    dup_p smallint[];
    -- By row: whether it is a duplicate, and its key's holder (null when
    -- the caller took the keys).
    dup_at boolean[];
    holder_job bigint[];
    holder_qid integer[];
    holder_p smallint[];
    t_shards smallint[];
    t_seqs bigint[];
begin
    if n = 0 then
        return;
    end if;

    if routed_queue_ids is not null then
        queues := routed;
        queue_ids := routed_queue_ids;
        key_shards := routed_key_shards;
    else
        select min(i) into bad
          from generate_series(1, n) as i
         where not awa._row_ok(
             queues[i], kinds[i], priorities[i], max_attempts[i], max_run_times[i],
             ordering_keys[i], unique_keys[i], unique_windows[i], run_ats[i]
         );
        if bad is not null then
            perform awa._check_row(
                queues[bad], kinds[bad], priorities[bad], max_attempts[bad],
                max_run_times[bad], ordering_keys[bad], unique_keys[bad], unique_windows[bad],
                run_ats[bad], row_label, bad + row_offset
            );
        end if;

        select r.routed, r.queue_ids, r.key_shards into queues, queue_ids, key_shards
          from awa._route_rows(queues, ordering_keys) as r;
    end if;

    -- Unique keys first, in one order for every caller (awa._take_unique_keys),
    -- unless the caller took them (job_ids given; a keyed row without an id
    -- is a duplicate). A duplicate takes no lane (its queue id goes null)
    -- and no row (its kind goes null, which awa._insert_jobs skips).
    if job_ids is not null then
        dup_i := array(
            select u.i from unnest(unique_keys, job_ids) with ordinality as u (k, j, i)
             where u.k is not null and u.j is null
             order by u.i
        );
    elsif cardinality(array_remove(unique_keys, null)) > 0 then
        job_ids := array(select nextval('awa.job_id_seq') from generate_series(1, n));
        select array_agg(d.i), array_agg(d.job_id), array_agg(d.queue_id),
               array_agg(d.priority)
          into dup_i, dup_job, dup_qid, dup_p
          from awa._take_unique_keys(
              unique_keys, job_ids, queue_ids, priorities, unique_windows
          ) as d;
    end if;
    if cardinality(dup_i) > 0 then
        queue_ids := awa._null_at(queue_ids, dup_i);
        kinds := awa._null_at(kinds, dup_i);
        dup_at := array_fill(false, array[n]);
        holder_job := array_fill(null::bigint, array[n]);
        holder_qid := array_fill(null::integer, array[n]);
        holder_p := array_fill(null::smallint, array[n]);
        for k in 1 .. cardinality(dup_i) loop
            dup_at[dup_i[k]] := true;
            holder_job[dup_i[k]] := dup_job[k];
            holder_qid[dup_i[k]] := dup_qid[k];
            holder_p[dup_i[k]] := dup_p[k];
        end loop;
    end if;

    -- The lanes of the rows due now; a row for later waits in awa.scheduled.
    select * into taken
      from awa._lock_lanes(awa._due_queue_ids(queue_ids, run_ats), priorities, key_shards);
    -- In variables, which PL/pgSQL holds expanded: a subscript into a
    -- record's array with nulls (a duplicate's or a later row's) walks it
    -- from the start.
    t_shards := taken.shards;
    t_seqs := taken.seqs;
    if job_ids is not null then
        -- The keyed rows' queues, once their lanes are held.
        perform awa._mark_unique_jobs(queue_ids, unique_keys);
    end if;
    -- Each row beside its key's holder, if it is a duplicate, by position
    -- (rows from): a join on the row number was planned as a nested loop
    -- for some sessions, the square of the call's size.
    return query
    select case when j.dup then j.holder_job else j.job_id end,
           coalesce(h.queue, queues[j.i]),
           coalesce(j.holder_p, priorities[j.i], awa._default_priority()),
           t_shards[j.i], t_seqs[j.i], coalesce(j.dup, false)
      from rows from (
          awa._insert_jobs(
              taken.lanes, taken.seqs, queue_ids, priorities, kinds, args, ordering_keys,
              max_attempts, run_ats, job_ids, max_run_times => max_run_times
          ),
          unnest(dup_at), unnest(holder_job), unnest(holder_qid), unnest(holder_p)
      ) with ordinality as j (job_id, dup, holder_job, holder_qid, holder_p, i)
      left join awa.queue_meta as h on h.queue_id = j.holder_qid
     order by j.i;
end;
$$;

-- Function: awa.enqueue_batch(queues, kinds, args, priorities, ordering_keys, run_ats,
--                             max_attempts, max_run_times, unique_keys, unique_windows)
-- Enqueues many jobs in one call from typed parallel arrays, one element per
-- job. queues and kinds are required; the other arrays may be null (all
-- defaults) and a null element takes the default (for max_run_times: the
-- queue's max run time; for unique_keys: no key). Role: awa_producer.
-- Returns: one awa.enqueued row per input, in input order; an element
--   whose unique key another job holds (an earlier element of the same
--   call included) is inserted nowhere and returned as that job, with
--   duplicate true.
-- Errors: 22023 arrays of different lengths (naming them), an array with a
--   second dimension or not indexed from 1 (naming it), bad elements (naming
--   the 1-based index); 22004 null queue or kind elements.
-- A fast path (docs/fast-paths.md) of awa._enqueue_rows for one lane range:
-- valid, unkeyed rows due now for one plain queue at one priority.
-- Calls: awa._default_args, awa._default_max_attempts, awa._default_priority, awa._enqueue_rows,
--   awa._first_attempt, awa._has_lane_memo, awa._lock_class_lane, awa._lock_lane_groups,
--   awa._one_range_ok, awa._sticky
-- Writes: awa.ready
create or replace function awa.enqueue_batch(
    queues text[],
    kinds text[],
    args jsonb[] default null,
    priorities smallint[] default null,
    ordering_keys bytea[] default null,
    run_ats timestamptz[] default null,
    max_attempts integer[] default null,
    max_run_times interval[] default null,
    unique_keys bytea[] default null,
    unique_windows interval[] default null
)
returns setof awa.enqueued
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := coalesce(cardinality(queues), 0);
    p smallint := coalesce(priorities[1], awa._default_priority());
    attempts integer := coalesce(max_attempts[1], awa._default_max_attempts());
    names text[];
    dims text[] := array[
        array_dims(queues), array_dims(kinds), array_dims(args), array_dims(priorities),
        array_dims(ordering_keys), array_dims(run_ats), array_dims(max_attempts),
        array_dims(max_run_times), array_dims(unique_keys), array_dims(unique_windows)
    ];
    lens integer[];
    q_id integer;
    shard smallint;
    lane integer;
    seq regclass;
    base bigint;
begin
    if queues is null or kinds is null then
        raise exception '% must not be null',
            case when queues is null then 'queues' else 'kinds' end
            using errcode = '22004';
    end if;
    -- Rows are read by position 1 .. n: a subscript from another base, a
    -- second dimension or a missing element would pair the wrong elements.
    -- Every array given is [1:n] (one test: the loop's two per array cost a
    -- batch of 100 about 0.7k instructions per job); else the loop says which.
    -- An empty array has no dims (null, as a null array has): as many null
    -- dims as null arrays, or one is empty, a length to check like any other.
    if not array_remove(dims, null) <@ array['[1:' || n || ']']
       or num_nulls(variadic dims) <> num_nulls(
           queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts,
           max_run_times, unique_keys, unique_windows
       ) then
        names := array['queues', 'kinds', 'args', 'priorities', 'ordering_keys', 'run_ats',
                       'max_attempts', 'max_run_times', 'unique_keys', 'unique_windows'];
        lens := array[
            n, cardinality(kinds), cardinality(args), cardinality(priorities),
            cardinality(ordering_keys), cardinality(run_ats), cardinality(max_attempts),
            cardinality(max_run_times), cardinality(unique_keys), cardinality(unique_windows)
        ];
        for i in 1 .. 10 loop
            if left(dims[i], 3) <> '[1:' or strpos(dims[i], '][') > 0 then
                raise exception 'array % must be one-dimensional and indexed from 1, got %',
                    names[i], dims[i]
                    using errcode = '22023';
            end if;
            if lens[i] <> n then
                raise exception 'array % has % elements but queues has %', names[i], lens[i], n
                    using errcode = '22023',
                          hint = 'Every array holds one element per job, in the same order.';
            end if;
        end loop;
    end if;
    -- The common call, one lane range (awa._one_range_ok, sql/lanes.sql:
    -- every row valid, unkeyed and due now, for one plain queue at one
    -- priority). Any other call, and every error, takes awa._enqueue_rows.
    if awa._one_range_ok(
        n, queues, kinds, priorities, max_attempts, ordering_keys, run_ats, max_run_times,
        unique_keys, unique_windows, p, attempts
    ) then
        select m.queue_id, awa._sticky(m.enqueue_shards),
               m.lane_ids[p][awa._sticky(m.enqueue_shards)],
               m.lane_seqs[p][awa._sticky(m.enqueue_shards)]
          into q_id, shard, lane, seq
          from awa.queue_meta as m
         where m.queue = queues[1] and m.stripes = 1 and m.partitions = 1;
        if found then
            -- The sticky lane with no memo, as awa._take_lane would take
            -- it (sql/lanes.sql); else the group goes to awa._lock_lane_groups.
            if not awa._has_lane_memo()
               and pg_try_advisory_xact_lock(awa._lock_class_lane(), lane) then
                -- The range base .. base + n - 1, reserved in one expression.
                base := setval(seq, nextval(seq) + n - 1) - n + 1;
            else
                select l.g_lane[1], l.g_shard[1], l.g_base[1] into lane, shard, base
                  from awa._lock_lane_groups(
                      array[q_id], array[p], array[-1::smallint], array[n::bigint]
                  ) as l;
            end if;
            -- awa._insert_jobs for one lane range, written out: building its
            -- arrays and calling it cost this path about a fifth more server
            -- CPU (docs/benchmarks.md, "One home per SQL rule").
            -- The rows come back in input order without a sort: the executor
            -- inserts each row as the unnest yields it (array order) and
            -- returns it at once. PostgreSQL does not document that order;
            -- tests/test_path_differential.py checks it on every major we
            -- support (ADR 020).
            return query
            insert into awa.ready (
                lane_id, lane_seq, job_id, queue_id, priority, kind, args, ordering_key,
                attempt, max_attempts, enqueued_at, ready_at, last_error, max_run_time
            )
            select lane, base + u.i - 1, nextval('awa.job_id_seq'),
                   q_id, p, u.k, coalesce(u.a, awa._default_args()), null,
                   awa._first_attempt(), attempts, now(), clock_timestamp(), null, null
              from unnest(kinds, args) with ordinality as u (k, a, i)
            returning awa.ready.job_id, queues[1], p, shard, awa.ready.lane_seq, false;
            return;
        end if;
    end if;
    return query
    select * from awa._enqueue_rows(
        queues, kinds, args, priorities, ordering_keys, run_ats, max_attempts, max_run_times,
        unique_keys, unique_windows, 'batch element', 0
    );
end;
$$;

-- Function: awa._pass_bytes() returns bigint
-- The most bytes of job payload (awa._job_bytes) that one call of a
-- maintenance pass that moves jobs (awa.promote_due, awa.rescue_expired)
-- copies before its last job: it stops there and leaves the rest to its
-- next call. Every move copies a job's args; here about 40 to 70 ms a
-- megabyte. A pass that runs past its statement timeout (10 s in awa
-- maintain) is rolled back and tries the same jobs again: without the
-- bound, ten due jobs of 20 MB each made every promote time out, and no
-- queue's due jobs moved. 16 MB: a call of small jobs still takes its
-- max_jobs. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._pass_bytes()
returns bigint
language sql
immutable parallel safe
as $$
    select 16777216::pg_catalog.int8
$$;

-- Function: awa._job_bytes(kind text, args jsonb, other text) returns bigint
-- The stored size (compressed, if it is) of a job's unbounded columns: its
-- kind, its args and one more text (the last error, the worker). Reads no
-- TOAST data. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._job_bytes(kind text, args jsonb, other text)
returns bigint
language sql
stable parallel safe
as $$
    select coalesce(pg_catalog.pg_column_size(kind), 0)::pg_catalog.int8
           operator(pg_catalog.+) coalesce(pg_catalog.pg_column_size(args), 0)
           operator(pg_catalog.+) coalesce(pg_catalog.pg_column_size(other), 0)
$$;

-- Function: awa._lane_holders() returns text[]
-- The lane locks of this database that other transactions hold now, each
-- as '<lane_id>:<holder's virtual transaction>' (pg_locks: no privilege
-- needed, nothing a caller can set). Two reads of it apart name the
-- transactions that held a lane all along (awa._lanes_held_since). A
-- key of the lane class that is no lane id (negative, read as an oid above
-- 2^31) is not read.
-- Calls: awa._lock_class_lane
-- Writes: nothing
create or replace function awa._lane_holders()
returns text[]
language sql
volatile
set search_path = pg_catalog, pg_temp
as $$
    -- ':' is in neither part (a virtual transaction is 'n/n').
    select coalesce(pg_catalog.array_agg(l.objid::pg_catalog.text operator(pg_catalog.||) ':'
                                         operator(pg_catalog.||) l.virtualtransaction), '{}')
      from pg_catalog.pg_locks as l
     where l.locktype operator(pg_catalog.=) 'advisory'
       and l.database operator(pg_catalog.=) (
           select d.oid from pg_catalog.pg_database as d
            where d.datname operator(pg_catalog.=) pg_catalog.current_database()
       )
       and l.classid operator(pg_catalog.=) awa._lock_class_lane()::pg_catalog.oid
       and l.objsubid operator(pg_catalog.=) 2
       and l.objid::pg_catalog.int8 operator(pg_catalog.<=) 2147483647
       and l.granted
       and l.pid is distinct from pg_catalog.pg_backend_pid()
$$;

-- Function: awa._lanes_held_since(before text[]) returns integer[]
-- The lanes that one transaction held at `before` (awa._lane_holders) and
-- holds now: a prepared one too. Not a session-level lock (no awa call
-- takes one), whose holder's virtual transaction changes with each of its
-- transactions: a session's transactions that come and go on a busy lane
-- look alike.
-- Calls: awa._lane_holders
-- Writes: nothing
create or replace function awa._lanes_held_since(before text[])
returns integer[]
language sql
volatile
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(pg_catalog.array_agg(pg_catalog.split_part(h.holder, ':', 1)::integer),
                    '{}')
      from pg_catalog.unnest(awa._lane_holders()) as h (holder)
     where h.holder operator(pg_catalog.=) any (before)
$$;

-- Function: awa.promote_due(max_jobs integer default 10000) returns integer
-- Moves scheduled jobs whose run_at has passed into lanes, routed under the
-- queue's current S (a keyed job goes back to its key's shard), oldest
-- first, up to max_jobs and awa._pass_bytes() of payload (at least one
-- job). Role: awa_maintenance. Returns how many jobs it moved. One call at
-- a time, under the leader lock of awa maintain's promote pass
-- ('pass.promote', migration 0041), which that pass holds already: a call
-- while another runs returns 0 at once. Two calls side by side, skipping
-- each other's rows, put a key's later job into its lane before the
-- earlier one the other call held while it waited for a lane.
-- It waits for its lanes in line with the producers, 200 ms at most for a
-- lane (it holds the lanes below meanwhile), having read which
-- transactions hold lanes. Past that it reads them again: the rows that
-- would go to a lane one transaction held all along (a producer's
-- transaction left open) are chosen out, an unkeyed row's only when all S
-- lanes of its priority are, and it
-- waits again, up to a second a lane, for the rest (a busy lane's queue of
-- short transactions). So one open transaction delays its own lane's jobs,
-- not every queue's. A second timeout leaves everything to the next call
-- (ADR 053).
-- Calls: awa._check_limit, awa._insert_jobs, awa._job_bytes, awa._key_shard, awa._lane_holders,
--   awa._lanes_held_since, awa._lock_lanes, awa._note_run, awa._pass_bytes, awa._try_leader
-- Writes: awa.scheduled
create or replace function awa.promote_due(max_jobs integer default 10000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call; generic plans are
-- right for these queries whatever the batch size.
set plan_cache_mode = force_generic_plan
-- Due rows are looked up by key; never scan awa.scheduled or awa.ready.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    due record;
    taken record;
    holders text[];
    stuck integer[] := '{}';
    prior text := current_setting('lock_timeout');
begin
    perform awa._check_limit('max_jobs', max_jobs);
    if not awa._try_leader('pass.promote') then
        return 0;
    end if;
    perform awa._note_run('promote');
    for attempt in 1 .. 2 loop
        select array_agg(d.job_id order by d.run_at, d.job_id) as job_ids,
               array_agg(d.queue_id order by d.run_at, d.job_id) as queue_ids,
               array_agg(d.priority order by d.run_at, d.job_id) as priorities,
               array_agg(d.key_shard order by d.run_at, d.job_id) as key_shards,
               array_agg(d.kind order by d.run_at, d.job_id) as kinds,
               array_agg(d.args order by d.run_at, d.job_id) as args,
               array_agg(d.ordering_key order by d.run_at, d.job_id) as ordering_keys,
               array_agg(d.attempt order by d.run_at, d.job_id) as attempts,
               array_agg(d.max_attempts order by d.run_at, d.job_id) as max_attempts,
               array_agg(d.enqueued_at order by d.run_at, d.job_id) as enqueued_ats,
               array_agg(d.last_error order by d.run_at, d.job_id) as last_errors,
               array_agg(d.max_run_time order by d.run_at, d.job_id) as max_run_times
          into due
          from (
              -- The due jobs locked, then those whose payload before them is
              -- under the bound (a window cannot run beside FOR UPDATE).
              select w.*
                from (
                    select s.*, sum(s.bytes) over (order by s.run_at, s.job_id) - s.bytes
                           as bytes_before
                      from (
                          select s.*, awa._job_bytes(s.kind, s.args, s.last_error) as bytes,
                                 k.key_shard
                            from awa.scheduled as s
                            join awa.queue_meta as m on m.queue_id = s.queue_id
                           cross join lateral (
                               select case when s.ordering_key is not null
                                           then awa._key_shard(s.ordering_key, m.enqueue_shards)
                                      end as key_shard
                           ) as k
                           where s.run_at <= now()
                             -- Not to a stuck lane: a keyed row's own; an unkeyed
                             -- row's when all S lanes of its priority are.
                             and (stuck = '{}' or not (
                                 case when k.key_shard is null
                                      then m.lane_ids[s.priority:s.priority][0:m.enqueue_shards - 1]
                                           <@ stuck
                                      else m.lane_ids[s.priority][k.key_shard] = any (stuck) end
                             ))
                           order by s.run_at, s.job_id
                           limit max_jobs
                             for update of s skip locked
                      ) as s
                ) as w
               where w.bytes_before < awa._pass_bytes()
          ) as d;
        if due.job_ids is null then
            return 0;
        end if;
        if attempt = 1 then
            holders := awa._lane_holders();
        end if;
        begin
            perform set_config('lock_timeout', case attempt when 1 then '200ms' else '1s' end,
                               true);
            select * into taken
              from awa._lock_lanes(due.queue_ids, due.priorities, due.key_shards);
            perform set_config('lock_timeout', prior, true);
            exit;
        exception when lock_not_available then
            -- Rolled back: the lanes this try took, and its lock_timeout.
            if attempt = 2 then
                return 0;
            end if;
            stuck := awa._lanes_held_since(holders);
        end;
    end loop;
    perform count(*) from awa._insert_jobs(
        taken.lanes, taken.seqs, due.queue_ids, due.priorities, due.kinds, due.args,
        due.ordering_keys, due.max_attempts, null, due.job_ids, due.attempts, due.enqueued_ats,
        due.last_errors, due.max_run_times
    );
    delete from awa.scheduled as s where s.job_id = any(due.job_ids);
    return cardinality(due.job_ids);
end;
$$;

select awa._grant_execute(
    'awa.enqueue(text, text, jsonb, smallint, bytea, timestamptz, integer, bytea, interval)',
    'producer'
);
select awa._grant_execute('awa._lock_lanes(integer[], smallint[], smallint[], boolean)');
select awa._grant_execute('awa._lane_holders()');
select awa._grant_execute('awa._lanes_held_since(text[])');
select awa._grant_execute(
    'awa._insert_jobs(integer[], bigint[], integer[], smallint[], text[], jsonb[], bytea[],'
    ' integer[], timestamptz[], bigint[], integer[], timestamptz[], text[], interval[])'
);
select awa._grant_execute(
    'awa._row_ok(text, text, smallint, integer, interval, bytea, bytea, interval,'
    ' timestamp with time zone)'
);
select awa._grant_execute(
    'awa._check_row(text, text, smallint, integer, interval, bytea, bytea, interval,'
    ' timestamp with time zone, text, bigint)'
);
select awa._grant_execute('awa._route_rows(text[], bytea[])');
select awa._grant_execute(
    'awa._enqueue_rows(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[],'
    ' interval[], bytea[], interval[], text, bigint, bigint[], text[], integer[], smallint[])'
);
select awa._grant_execute('awa._due_queue_ids(integer[], timestamptz[])');
select awa._grant_execute(
    'awa.enqueue_batch(text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[],'
    ' interval[], bytea[], interval[])',
    'producer'
);
select awa._grant_execute('awa.promote_due(integer)', 'maintenance');
select awa._grant_execute('awa._pass_bytes()');
select awa._grant_execute('awa._job_bytes(text, jsonb, text)');
