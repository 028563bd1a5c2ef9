-- autoscale.sql: the enqueue-shard auto-scaler (ADR 008).
--
-- A queue opts in with awa.set_shard_mode (shadow: decide and log; auto:
-- act). awa.autoscale_tick, called every few seconds by one or many
-- processes, samples lane contention and takes at most one x2 or /2 step
-- per queue (a raise may take up to three doublings when the demand calls
-- for them), always through awa._set_enqueue_shards, and logs every
-- decision to awa.autoscale_decisions, runs of identical holds folded.
--
-- Locks: the leader lock 'autoscale' (awa._try_leader), the tick's.

-- Function: awa._autoscale_policy(queue_id integer)
-- The queue's effective thresholds: its awa.autoscale_policy row over the
-- defaults documented in docs/configuration.md.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._autoscale_policy(
    queue_id integer,
    out grow_window interval,
    out grow_wait_share numeric,
    out grow_waiters numeric,
    out shrink_window interval,
    out shrink_wait_share numeric,
    out cooldown interval,
    out min_samples integer
)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(p.grow_window, interval '30 seconds'),
           coalesce(p.grow_wait_share, 0.5),
           coalesce(p.grow_waiters, 0.5),
           coalesce(p.shrink_window, interval '5 minutes'),
           coalesce(p.shrink_wait_share, 0.02),
           coalesce(p.cooldown, interval '60 seconds'),
           coalesce(p.min_samples, 3)
      from (select) as d
      left join awa.autoscale_policy as p on p.queue_id = _autoscale_policy.queue_id
$$;

select awa._grant_execute('awa._autoscale_policy(integer)');

-- Function: awa._check_logical(anchor awa.queue_meta, what text) returns void
-- Raises 22023 when `anchor` is a partition or stripe: a setting the
-- auto-scaler reads from the logical queue (its mode, its policy) is set
-- on that queue, which its partitions and stripes follow.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_logical(anchor awa.queue_meta, what text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if anchor.root_queue is not null then
        raise exception 'queue % is a partition or stripe of %; set the % on %',
            quote_literal(anchor.queue), quote_literal(anchor.root_queue), what,
            quote_literal(anchor.root_queue)
            using errcode = '22023';
    end if;
end;
$$;

select awa._grant_execute('awa._check_logical(awa.queue_meta, text)');

-- Function: awa.set_shard_mode(queue text, mode text, max_shards integer default null)
-- manual (the default: S changes only by awa.set_enqueue_shards), shadow
-- (the auto-scaler decides and logs, changes nothing) or auto (it acts,
-- within 1..max_shards). Shadow and auto need max_shards, given here or
-- stored before; opting in records who accepted partitioned FIFO and when.
-- Covers the queue's partitions and stripes. Role: awa_operator.
-- Returns (logical_queue, shard_mode, max_enqueue_shards).
-- Errors: 42704 unknown queue; 22004 null mode, or no max_shards for
--   shadow/auto; 22023 unknown mode, max_shards outside 1..64, or a
--   partition or stripe named instead of its logical queue; 25006 standby.
-- Calls: awa._check_logical, awa._check_range, awa._lock_family, awa._require_primary
-- Writes: awa.queue_meta
create or replace function awa.set_shard_mode(
    queue text, mode text, max_shards integer default null
)
returns table (logical_queue text, shard_mode text, max_enqueue_shards smallint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
    new_max integer;
    family integer[];
begin
    if mode is null then
        raise exception 'mode must not be null' using errcode = '22004';
    end if;
    if mode not in ('manual', 'shadow', 'auto') then
        raise exception 'mode must be one of manual, shadow, auto; got %', quote_literal(mode)
            using errcode = '22023';
    end if;
    if set_shard_mode.max_shards is not null then
        perform awa._check_range('max_shards', set_shard_mode.max_shards, 64);
    end if;
    perform awa._require_primary('change the shard mode');
    family := awa._lock_family(set_shard_mode.queue);
    select m.* into strict anchor from awa.queue_meta as m where m.queue = set_shard_mode.queue;
    perform awa._check_logical(anchor, 'mode');
    new_max := coalesce(set_shard_mode.max_shards, anchor.max_shards);
    if mode <> 'manual' and new_max is null then
        raise exception 'max_shards is required for mode %', mode
            using errcode = '22004',
                  hint = 'The auto-scaler never raises S above max_shards.';
    end if;
    update awa.queue_meta as m
       set shard_mode = set_shard_mode.mode,
           max_shards = new_max,
           shard_mode_changed_at = case
               when m.shard_mode <> set_shard_mode.mode then pg_catalog.now()
               else m.shard_mode_changed_at
           end,
           partitioned_fifo_accepted_by = case
               when set_shard_mode.mode <> 'manual' then session_user
               else m.partitioned_fifo_accepted_by
           end,
           partitioned_fifo_accepted_at = case
               when set_shard_mode.mode <> 'manual' then pg_catalog.now()
               else m.partitioned_fifo_accepted_at
           end
     where m.queue_id = any(family);
    return query
    select m.queue, m.shard_mode, m.max_shards
      from awa.queue_meta as m
     where m.queue_id = anchor.queue_id;
end;
$$;

select awa._grant_execute('awa.set_shard_mode(text, text, integer)', 'operator');

-- A partition or stripe made after its root's awa.set_shard_mode by an
-- earlier layer kept the defaults (manual, no max_shards), so its ready
-- depth and lag went unsampled: it takes its root's mode now, as
-- awa._ensure_linked gives a new one. Touches no row once they agree.
update awa.queue_meta as m
   set shard_mode = r.shard_mode,
       max_shards = r.max_shards,
       shard_mode_changed_at = r.shard_mode_changed_at,
       partitioned_fifo_accepted_by = r.partitioned_fifo_accepted_by,
       partitioned_fifo_accepted_at = r.partitioned_fifo_accepted_at
  from awa.queue_meta as r
 -- Each family read once, by its root's name (awa._queue_ids).
 cross join lateral unnest(awa._queue_ids(r.queue)) as f (queue_id)
 where r.root_queue is null
   and r.dropped_name is null
   and (r.partitions > 1 or r.stripes > 1)
   and m.queue_id = f.queue_id
   and (m.shard_mode, m.max_shards) is distinct from (r.shard_mode, r.max_shards);

-- Function: awa.set_autoscale_policy(queue text, ...)
-- Replaces the queue's auto-scaler thresholds; an argument left null takes
-- the default. They cover the queue's partitions and stripes: the
-- controller reads the logical queue's. Role: awa_operator. Errors: 42704
-- unknown queue; 22023 a partition or stripe named instead of its logical
-- queue (its policy was stored and never read), or a value out of range
-- (windows > 0 and at most 1 hour, the samples kept; cooldown 0 to 1 day;
-- shares in 0..1; grow_waiters finite, >= 0; min_samples in 1..10000).
-- Intervals are read and stored in seconds (awa._in_seconds), so a window
-- is the one checked whatever the month.
-- Calls: awa._check_logical, awa._in_seconds, awa._queue
-- Writes: awa.autoscale_policy
create or replace function awa.set_autoscale_policy(
    queue text,
    grow_window interval default null,
    grow_wait_share numeric default null,
    grow_waiters numeric default null,
    shrink_window interval default null,
    shrink_wait_share numeric default null,
    cooldown interval default null,
    min_samples integer default null
)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
    bad text;
begin
    anchor := awa._queue(set_autoscale_policy.queue);
    perform awa._check_logical(anchor, 'policy');
    -- The first argument out of range, in the order of the arguments (a null
    -- keeps the default); awa.sample_lane_contention keeps one hour of
    -- samples, so no window is longer. NaN is above every number, so the
    -- bounds refuse it.
    bad := case
        when not pg_catalog.date_part('epoch', grow_window) > 0
             or pg_catalog.date_part('epoch', grow_window) > 3600 then
            pg_catalog.format('grow_window must be above 0 and at most 1 hour, got %s',
                              grow_window)
        when grow_wait_share not between 0 and 1 then
            pg_catalog.format('grow_wait_share must be between 0 and 1, got %s',
                              grow_wait_share)
        when not (grow_waiters >= 0 and grow_waiters < 'Infinity') then
            pg_catalog.format('grow_waiters must be a finite number of at least 0, got %s',
                              grow_waiters)
        when not pg_catalog.date_part('epoch', shrink_window) > 0
             or pg_catalog.date_part('epoch', shrink_window) > 3600 then
            pg_catalog.format('shrink_window must be above 0 and at most 1 hour, got %s',
                              shrink_window)
        when shrink_wait_share not between 0 and 1 then
            pg_catalog.format('shrink_wait_share must be between 0 and 1, got %s',
                              shrink_wait_share)
        when not pg_catalog.date_part('epoch', cooldown) between 0 and 86400 then
            pg_catalog.format('cooldown must be between 0 and 1 day, got %s', cooldown)
        when min_samples not between 1 and 10000 then
            pg_catalog.format('min_samples must be between 1 and 10000, got %s', min_samples)
    end;
    if bad is not null then
        raise exception 'autoscale policy for queue %: %', quote_literal(queue), bad
            using errcode = '22023';
    end if;
    insert into awa.autoscale_policy as p (
        queue_id, grow_window, grow_wait_share, grow_waiters, shrink_window,
        shrink_wait_share, cooldown, min_samples
    ) values (
        anchor.queue_id, awa._in_seconds(grow_window), grow_wait_share, grow_waiters,
        awa._in_seconds(shrink_window), shrink_wait_share, awa._in_seconds(cooldown),
        min_samples
    )
    on conflict (queue_id) do update
        set grow_window = excluded.grow_window,
            grow_wait_share = excluded.grow_wait_share,
            grow_waiters = excluded.grow_waiters,
            shrink_window = excluded.shrink_window,
            shrink_wait_share = excluded.shrink_wait_share,
            cooldown = excluded.cooldown,
            min_samples = excluded.min_samples;
end;
$$;

select awa._grant_execute(
    'awa.set_autoscale_policy(text, interval, numeric, numeric, interval, numeric, interval,'
    ' integer)',
    'operator'
);

-- Function: awa._autoscale_signal(anchor awa.queue_meta, since timestamptz)
-- The contention signal of a queue with all its partitions and stripes over
-- the samples taken after `since` at each physical queue's current S (a
-- sample of no recorded S, from before migration 0040, counts too): how
-- many samples, mean backends waiting per held lane, the share of samples
-- with any waiter, enqueues per second, the most lanes held at once in one
-- priority, the demand: lanes held plus backends waiting for one in the
-- busiest priority (S lanes are per priority), per physical queue, on
-- average; and the waited demand: the same over only the physical queues
-- and samples where a backend waited (null if none did). A sample of no
-- busiest priority's demand (before migration 0042, or written by an
-- earlier layer) gives its lanes held plus waiters over every priority,
-- as every sample did before. A change of S is stamped with its
-- transaction's start: the samples taken between that and its commit read
-- the old S, and are left out by it.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._autoscale_signal(
    anchor awa.queue_meta,
    since timestamptz,
    out samples integer,
    out mean_waiters numeric,
    out wait_share numeric,
    out enqueue_rate numeric,
    out busiest_held integer,
    out demand numeric,
    out waited_demand numeric
)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    with per_instant as (
        select s.sampled_at,
               sum(s.waiters) as waiters,
               sum(s.lanes_held) as held,
               sum(s.enqueued) as enqueued,
               max(s.busiest_priority_held) as busiest,
               count(*) as physical,
               sum(coalesce(s.busiest_priority_demand, s.lanes_held + s.waiters)) as demand,
               sum(coalesce(s.busiest_priority_demand, s.lanes_held + s.waiters))
                   filter (where s.waiters > 0) as waited_demand,
               count(*) filter (where s.waiters > 0) as waited
          from awa.contention_samples as s
          join awa.queue_meta as m on m.queue_id = s.queue_id
         where (m.queue_id = (anchor).queue_id or m.root_queue = (anchor).queue)
           and s.sampled_at > since
           and (s.enqueue_shards is null or s.enqueue_shards = m.enqueue_shards)
         group by s.sampled_at
    )
    select count(*)::integer,
           round(avg(p.waiters::numeric / greatest(p.held, 1)), 3),
           round(avg((p.waiters > 0)::integer::numeric), 3),
           -- the enqueue counter is in the ticks' samples only
           round((max(p.enqueued) - min(p.enqueued))::numeric
                 / nullif(extract(epoch from max(p.sampled_at) filter (where p.enqueued is not null)
                          - min(p.sampled_at) filter (where p.enqueued is not null)), 0), 1),
           max(p.busiest)::integer,
           round(avg(p.demand::numeric / p.physical), 2),
           round(sum(p.waited_demand)::numeric / nullif(sum(p.waited), 0), 2)
      from per_instant as p
$$;

select awa._grant_execute('awa._autoscale_signal(awa.queue_meta, timestamptz)');

-- Function: awa._autoscale_decide(anchor awa.queue_meta, at timestamptz)
-- One decision for one queue in shadow or auto mode, logged; in auto mode a
-- raise or lower is made here through awa._set_enqueue_shards. The rules,
-- in order: hold in the cooldown after a step; hold while lanes >= S that
-- claims walk still hold ready rows (a lower is complete only when they
-- drained; a probe of each such lane from its claim hint,
-- awa._shards_in_use, not a count of what it holds); lower towards
-- max_shards when S is above it; when waits were a meaningful share over
-- the grow window: hold if, where a backend waited, the lanes held plus
-- the backends waiting in the busiest priority were at most S (the waited
-- demand: S lanes are per priority, and an unkeyed producer waits only
-- when all S lanes of its priority are held, so these are producers of one
-- ordering key, or behind one long lane holder, which more lanes cannot
-- relieve; raising remapped every key for nothing, up to max_shards), else
-- raise to the S the demand calls for (see below); lower /2 when waits
-- were negligible over the whole shrink window and the busiest priority
-- never held more than S/2 lanes at once; else hold. Every window counts
-- only the samples taken at the current S.
--
-- The raise: the smallest S x 2^k (k >= 1) that gives every producer seen
-- at a sample in the busiest priority (lanes held plus backends waiting,
-- the grow window's mean) a lane of its own, at most max_step doublings in
-- one decision and never above max_shards. A raise of more than one
-- doubling says so in its reason. A step is taken under the queue's rows,
-- read again there: a drop, or a change of S, mode or max_shards committed
-- since the tick read the queue, makes it a step not taken.
--
-- The log folds: a hold with the same reason_code, mode and S as the
-- queue's latest row adds to that row (repeats, last_decided_at, the latest
-- signal and reason) instead of a new one, until its repeats fill an
-- int4 (2,147,483,647 ticks: 340 years at one every 5 s). Steps, and holds
-- for a new reason, are rows of their own. The row returned carries this tick's time
-- as decided_at (a folded row's first tick stays in the log). Every
-- decision adds one to its queue and action in awa.autoscale_decision_counts,
-- which the metrics read instead of counting the log.
--
-- The reason renders times and windows in one form whoever calls (ISO, in
-- UTC; intervals as postgres writes them): the caller's DateStyle,
-- TimeZone and IntervalStyle made the log read '06/12/2026 13:31:08 UTC'
-- for 23:31:08 UTC the day before, under a zone '<UTC>-14'.
-- Calls: awa._autoscale_policy, awa._autoscale_signal, awa._set_enqueue_shards, awa._shards_in_use,
--   awa._try_leader, awa._walked_shards
-- Writes: awa.autoscale_decision_counts, awa.autoscale_decisions
create or replace function awa._autoscale_decide(anchor awa.queue_meta, at timestamptz)
returns awa.autoscale_decisions
language plpgsql
set search_path = pg_catalog, pg_temp
set timezone = 'UTC'
set datestyle = 'ISO, YMD'
set intervalstyle = 'postgres'
as $$
declare
    -- Doublings one raise may take; configuration.md documents it.
    max_step constant integer := 3;
    policy record;
    grow record;
    shrink record;
    last_step timestamptz;
    in_cooldown boolean;
    -- The highest shard >= S that still holds ready rows, if any.
    draining integer;
    s integer := anchor.enqueue_shards;
    proposed integer;
    needed integer;
    verdict text;
    code text;
    why text;
    decision awa.autoscale_decisions;
begin
    policy := awa._autoscale_policy(anchor.queue_id);
    -- A shadow step changes nothing, so its cooldown runs from its own log.
    select greatest(
        (select max(c.changed_at) from awa.shard_changes as c where c.queue = anchor.queue),
        (select max(d.decided_at) from awa.autoscale_decisions as d
          where d.queue = anchor.queue and anchor.shard_mode = 'shadow'
            and d.action in ('would_raise', 'would_lower'))
    ) into last_step;
    grow := awa._autoscale_signal(
        anchor, greatest(at - policy.grow_window, last_step, '-infinity'));
    shrink := awa._autoscale_signal(
        anchor, greatest(at - policy.shrink_window, last_step, '-infinity'));
    in_cooldown := last_step is not null and at < last_step + policy.cooldown;
    if not in_cooldown then
        -- Whether lanes >= S hold a ready row, probed from each lane's claim
        -- hint: a read from a lane's start walked every row claimed or
        -- cancelled there that a held snapshot kept, at every tick.
        select max(u.shards) - 1 into draining
          from awa.queue_meta as m
         cross join lateral (
             select awa._shards_in_use(m.queue_id, m.enqueue_shards,
                                       awa._walked_shards(m.lane_shards, m.enqueue_shards))
                        as shards
         ) as u
         where (m.queue_id = anchor.queue_id or m.root_queue = anchor.queue)
           and u.shards > m.enqueue_shards;
    end if;
    proposed := s;
    if in_cooldown then
        code := 'cooldown';
        why := pg_catalog.format('cooldown: last step at %s, next allowed after %s',
                                 last_step, last_step + policy.cooldown);
    elsif draining is not null then
        code := 'draining';
        why := pg_catalog.format(
            'lanes >= S = %s still hold ready rows (up to shard %s); no step until they drain',
            s, draining);
    elsif s > anchor.max_shards then
        code := 'above_max';
        proposed := greatest(s / 2, anchor.max_shards);
        why := pg_catalog.format('S = %s is above max_shards = %s', s, anchor.max_shards);
    elsif grow.samples >= policy.min_samples
        and grow.wait_share >= policy.grow_wait_share
        and grow.mean_waiters >= policy.grow_waiters then
        if grow.waited_demand <= s then
            code := 'demand_within_s';
            why := pg_catalog.format(
                'lane waits in a share %s of %s samples, %s waiters per held lane, but where '
                'a backend waited the lanes held + waiters in the busiest priority were %s '
                'per physical queue, at most S = %s: more lanes would not relieve them '
                '(producers of one ordering key, or behind one long lane holder)',
                grow.wait_share, grow.samples, grow.mean_waiters, grow.waited_demand, s);
        elsif s >= anchor.max_shards then
            code := 'at_max';
            why := pg_catalog.format(
                'lane waits in %s of %s samples (%s waiters per held lane, demand %s) but S '
                'is at max_shards = %s', grow.wait_share, grow.samples, grow.mean_waiters,
                grow.demand, anchor.max_shards);
        else
            code := 'grow';
            needed := s * 2;
            while needed < grow.demand loop  -- the demand counts backends: bounded
                needed := needed * 2;
            end loop;
            proposed := least(needed, s << max_step, anchor.max_shards);
            why := pg_catalog.format(
                'lane waits in a share %s of %s samples over %s, %s waiters per held lane '
                '(thresholds %s and %s)', grow.wait_share, grow.samples, policy.grow_window,
                grow.mean_waiters, policy.grow_wait_share, policy.grow_waiters);
            if proposed > s * 2 then
                why := why || pg_catalog.format(
                    '; demand %s (lanes held + waiters in the busiest priority per sample) '
                    'calls for S = %s: %s -> %s in one step (at most %s doublings, '
                    'max_shards %s)', grow.demand,
                    needed, s, proposed, max_step, anchor.max_shards);
            end if;
        end if;
    elsif s > 1
        and (last_step is null or last_step <= at - policy.shrink_window)
        and shrink.samples >= policy.min_samples
        and shrink.wait_share <= policy.shrink_wait_share
        and shrink.busiest_held <= s / 2 then
        code := 'shrink';
        proposed := s / 2;
        why := pg_catalog.format(
            'lane waits in a share %s of %s samples over %s (threshold %s) and at most %s '
            'lanes held at once in a priority', shrink.wait_share, shrink.samples,
            policy.shrink_window, policy.shrink_wait_share, shrink.busiest_held);
    elsif grow.samples < policy.min_samples then
        code := 'few_samples';
        why := pg_catalog.format('%s samples at S = %s since %s; %s needed', grow.samples, s,
                                 greatest(at - policy.grow_window, last_step),
                                 policy.min_samples);
    else
        code := 'steady';
        why := pg_catalog.format(
            'steady: lane waits in a share %s of %s samples, %s waiters per held lane, '
            'at most %s lanes held at once in a priority over %s',
            coalesce(grow.wait_share, 0), grow.samples, coalesce(grow.mean_waiters, 0),
            coalesce(shrink.busiest_held, 0), policy.grow_window);
    end if;
    verdict := case
        when proposed > s and anchor.shard_mode = 'auto' then 'raised'
        when proposed < s and anchor.shard_mode = 'auto' then 'lowered'
        when proposed > s then 'would_raise'
        when proposed < s then 'would_lower'
        else 'held'
    end;
    -- A step takes the queue's rows (its partitions' and stripes' too), then
    -- the provisioning lock: the order of every change of S and of
    -- awa.drop_queue. Taking the lock first and then waiting for a row that
    -- an operator's transaction held deadlocked with its next change of S or
    -- drop, and held every queue creation meanwhile. Whoever holds either
    -- may hold it until its transaction ends: waiting for a long one would
    -- hold this tick, and awa maintain's loop behind it, until the statement
    -- timeout. So both are taken now or not at all: a step it cannot take is
    -- logged as one it would take, and the next tick decides again. The
    -- rows are locked as every change of S locks them (no key update): an
    -- enqueue of a job for later holds a key share until it commits, and a
    -- queue that schedules jobs all the time always has one in flight.
    if verdict in ('raised', 'lowered') then
        begin
            perform from awa.queue_meta as m
             where m.queue_id = anchor.queue_id or m.root_queue = anchor.queue
                or m.logical_queue = anchor.queue
               for no key update nowait;
            -- Read again under the lock: a drop or a change of S, mode or max
            -- that committed since the tick read the row makes this step
            -- another one (a raise past a max just lowered).
            if not exists (
                select from awa.queue_meta as m
                 where m.queue_id = anchor.queue_id and m.queue = anchor.queue
                   and m.dropped_xact is null and m.enqueue_shards = anchor.enqueue_shards
                   and m.shard_mode = 'auto' and m.max_shards = anchor.max_shards
            ) then
                why := why || '; not taken: the queue was dropped or its S, mode or'
                       || ' max_shards changed since this tick read it; the next tick'
                       || ' decides again';
                verdict := 'not taken';
            end if;
        exception when lock_not_available then
            why := why || '; not taken: another transaction holds the queue (it changes its'
                   || ' settings or S, or drops it); the next tick decides again';
            verdict := 'not taken';
        end;
        if verdict <> 'not taken' and not awa._try_leader('provisioning') then
            why := why || '; not taken: another transaction holds the provisioning lock'
                   || ' (it creates a queue or changes S); the next tick decides again';
            verdict := 'not taken';
        end if;
        if verdict = 'not taken' then
            verdict := case when proposed > s then 'would_raise' else 'would_lower' end;
        end if;
    end if;
    if verdict in ('raised', 'lowered') then
        perform awa._set_enqueue_shards(anchor.queue, proposed, 'auto');
    end if;
    if verdict = 'held' then
        update awa.autoscale_decisions as d
           set repeats = d.repeats + 1,
               last_decided_at = at,
               samples = grow.samples,
               mean_waiters = grow.mean_waiters,
               wait_share = grow.wait_share,
               enqueue_rate = grow.enqueue_rate,
               busiest_held = shrink.busiest_held,
               reason = why
         where d.decision_id = (
                   select x.decision_id from awa.autoscale_decisions as x
                    where x.queue = anchor.queue
                    order by x.decided_at desc, x.decision_id desc
                    limit 1)
           and d.action = 'held'
           and d.mode = anchor.shard_mode
           and d.current_shards = s
           and d.reason_code = code
           -- A row whose count is full (int4) stays as it is: the hold goes on
           -- in a row of its own. Incremented, it failed every tick after.
           and d.repeats < 2147483647
        returning d.decision_id, d.queue, at, d.mode, d.samples, d.mean_waiters, d.wait_share,
                  d.enqueue_rate, d.busiest_held, d.current_shards, d.proposed_shards,
                  d.action, d.reason, d.reason_code, d.repeats, d.last_decided_at
             into decision;
    end if;
    if decision.decision_id is null then
        insert into awa.autoscale_decisions (
            queue, decided_at, last_decided_at, mode, samples, mean_waiters, wait_share,
            enqueue_rate, busiest_held, current_shards, proposed_shards, action, reason_code,
            reason
        ) values (
            anchor.queue, at, at, anchor.shard_mode, grow.samples, grow.mean_waiters,
            grow.wait_share, grow.enqueue_rate, shrink.busiest_held, s, proposed, verdict, code,
            why
        )
        returning * into decision;
    end if;
    insert into awa.autoscale_decision_counts as c (queue, action, decisions)
    values (anchor.queue, verdict, 1)
    on conflict (queue, action) do update set decisions = c.decisions + 1;
    return decision;
end;
$$;

select awa._grant_execute('awa._autoscale_decide(awa.queue_meta, timestamptz)');

-- Function: awa.autoscale_tick() returns setof awa.autoscale_decisions
-- One controller tick: takes a contention sample and counts the lanes
-- (awa._count_lanes: every queue's enqueue counter, and the ready depth and
-- oldest ready job of the queues in shadow or auto mode), then one decision
-- for every queue in shadow or auto mode (a dropped one aside: ADR 044),
-- and prunes decisions whose last tick is older than 24 hours and the
-- decision counts of names no queue has any more (a queue dropped: they
-- were its metrics' counters, exported for good once it was gone).
-- Safe to call from many processes at once: the caller that gets the leader
-- lock decides, the others return no rows. Run it every 5 seconds (`awa
-- storage autoscale run`, pg_cron, or any scheduler). Role:
-- awa_maintenance. Errors: 25006 on a standby.
-- Calls: awa._autoscale_decide, awa._count_lanes, awa._note_run, awa._require_primary,
--   awa._sample_lane_contention, awa._try_leader
-- Writes: awa.autoscale_decision_counts, awa.autoscale_decisions
create or replace function awa.autoscale_tick()
returns setof awa.autoscale_decisions
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
    decision awa.autoscale_decisions;
    -- The sample is stamped with the transaction's start, which is also the
    -- changed_at of a step this tick makes: windows that start at a step
    -- never count the sample that led to it.
    at timestamptz := pg_catalog.now();
begin
    perform awa._require_primary('run the auto-scaler');
    -- Recorded once the leader lock is had, as every pass (a held lock
    -- must show as a task that does not run).
    if not awa._try_leader('autoscale') then
        return;
    end if;
    perform awa._note_run('autoscale');
    perform awa._sample_lane_contention(at);
    perform awa._count_lanes(at);
    at := pg_catalog.clock_timestamp();
    for anchor in
        select m.* from awa.queue_meta as m
         where m.shard_mode <> 'manual' and m.root_queue is null
           -- A dropped queue (awa.drop_queue) is no one's to scale.
           and m.dropped_xact is null
         order by m.queue_id
    loop
        decision := awa._autoscale_decide(anchor, at);
        return next decision;
    end loop;
    -- Rows another transaction holds (a drop renaming a queue's history)
    -- are left to a later tick: waited for, the drop, waiting in turn for
    -- a count this tick holds, closed a cycle (40P01).
    delete from awa.autoscale_decisions as d
     where d.ctid = any(array(
         select x.ctid from awa.autoscale_decisions as x
          where x.last_decided_at < at - interval '24 hours'
            for update skip locked
     ));
    -- A probe of queue_meta's index on the name per row of counts (five at
    -- most per queue ever scaled), not a read of every queue at every tick.
    delete from awa.autoscale_decision_counts as c
     where (select m.queue_id from awa.queue_meta as m where m.queue = c.queue) is null;
end;
$$;

select awa._grant_execute('awa.autoscale_tick()', 'maintenance');

select awa._grant_select('awa.autoscale_decisions', 'reader', 'operator');
select awa._grant_select('awa.autoscale_policy', 'reader', 'operator');

-- View: awa.autoscale_policies, per queue with a policy: its name and the
-- overrides awa.set_autoscale_policy stored (null: the default). The table
-- names a queue by its id, which the reader roles cannot resolve
-- (awa.queue_meta is not theirs to read).
create view awa._new_autoscale_policies as
select
    m.queue,
    p.grow_window,
    p.grow_wait_share,
    p.grow_waiters,
    p.shrink_window,
    p.shrink_wait_share,
    p.cooldown,
    p.min_samples
from awa.autoscale_policy as p
inner join awa.queue_meta as m on p.queue_id = m.queue_id;

select awa._ensure_view('awa.autoscale_policies', 'awa._new_autoscale_policies');

comment on view awa.autoscale_policies is
'Per queue with an auto-scaler policy: the overrides awa.set_autoscale_policy stored '
'(null: the default in force).';

select awa._grant_select('awa.autoscale_policies', 'reader', 'operator');
select awa._grant_select('awa.autoscale_decision_counts', 'reader', 'operator');
