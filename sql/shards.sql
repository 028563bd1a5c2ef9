-- shards.sql: reading and changing a queue's enqueue shards (S), and how long
-- the history of its changes is kept.

-- A layer before migration 0032 changes S without recording the change
-- (between that migration and this layer's install, an upgrade runs the
-- layer before it): each queue with lanes to retire counts its last change
-- from this install, whose commit is later than any such change. Only over
-- such a layer, which had no awa.retire_lanes (this file makes it below): a
-- layer that has it records every change, and the update waited for every
-- open transaction that held one of those queues' rows (an operator's
-- pause), at each apply.
do $backfill$
begin
    if pg_catalog.to_regprocedure('awa.retire_lanes()') is null then
        update awa.queue_meta as m
           set shards_changed_xact = pg_catalog.pg_current_xact_id()
         where m.lane_shards operator(pg_catalog.>) m.enqueue_shards;
    end if;
end
$backfill$;

-- Function: awa.enqueue_shards(queue text) returns smallint
-- The queue's current S. Roles: every awa role.
-- Errors: 42704 unknown queue; 22004/22023 bad name.
-- Calls: awa._queue
-- Writes: nothing
create or replace function awa.enqueue_shards(queue text)
returns smallint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select (awa._queue(queue)).enqueue_shards
$$;

-- Function: awa._check_range(what text, value integer, max_value integer)
-- A setting in 1..max_value: 22004 when null, 22023 naming the value and
-- the range otherwise.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_range(what text, value integer, max_value integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if value is null then
        raise exception '% must not be null', what using errcode = '22004';
    end if;
    if value not between 1 and max_value then
        raise exception '% must be between 1 and %, got %', what, max_value, value
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._require_primary(action text)
-- Every change to queue settings happens on the primary: 25006 on a standby.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._require_primary(action text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if pg_is_in_recovery() then
        raise exception 'cannot % on a standby', action
            using errcode = '25006',
                  hint = 'Connect to the primary.';
    end if;
end;
$$;

-- Function: awa._check_layout_change(queue text, what text, value integer, max_value integer)
-- The checks every change of a queue's layout (S, stripes, partitions) makes
-- first: a value in 1..max_value, a primary server, a valid queue name.
-- Calls: awa._check_queue_name, awa._check_range, awa._require_primary
-- Writes: nothing
create or replace function awa._check_layout_change(
    queue text, what text, value integer, max_value integer
)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._check_range(what, value, max_value);
    perform awa._require_primary('change ' || what);
    perform awa._check_queue_name(queue);
end;
$$;

-- Function: awa._set_enqueue_shards(queue text, shards integer, source text)
-- The one code path that changes S, for operators (manual) and the
-- auto-scaler (auto). In one transaction: validate, lock the settings rows
-- of the queue and all its stripes (never a lane lock, so producers are not
-- blocked), provision every priority x shard lane of each when raising, then
-- update S. Producers read S per statement, so none can see the new S
-- before its lanes exist, and every producer sees it at this commit.
-- lanes_created counts the lanes this call made for each physical queue: a
-- new queue's first ones, a new partition's or stripe's, a raise's.
-- Calls: awa._check_layout_change, awa._lock_leader, awa._physical_queues, awa._provision_lanes
-- Writes: awa.queue_meta, awa.shard_changes
create or replace function awa._set_enqueue_shards(queue text, shards integer, source text)
returns table (
    physical_queue text, old_shards smallint, new_shards smallint, lanes_created integer
)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
    created integer;
    last_lane bigint;
begin
    perform awa._check_layout_change(queue, 'enqueue shards', shards, 64);
    -- Lanes are made only under the provisioning lock (awa._physical_queues
    -- takes it too, first): the lane ids given after the last one given
    -- before this call, read under it, are this call's. Counted by xmin
    -- and the transaction's start, they were 0 in a savepoint (its own
    -- xid) and an earlier call's in a repeat.
    perform awa._lock_leader('provisioning');
    select n.last_value - case when n.is_called then 0 else 1 end into strict last_lane
      from awa.lanes_lane_id_seq as n;
    -- In queue_id order (they were locked in lock order: awa._lock_rank).
    for meta in select * from awa._physical_queues(queue) as p order by p.queue_id loop
        physical_queue := meta.queue;
        old_shards := meta.enqueue_shards;
        new_shards := shards;
        -- Lowering creates nothing, but counts the lanes again
        -- (queue_meta.lane_shards, which claims walk).
        -- Under the provisioning lock awa._physical_queues took.
        if shards <> meta.enqueue_shards then
            perform awa._provision_lanes(meta.queue_id, shards);
        end if;
        select count(*)::integer into created
          from awa.lanes as l
         where l.queue_id = meta.queue_id and l.lane_id > last_lane;
        lanes_created := created;
        if shards <> meta.enqueue_shards then
            update awa.queue_meta as m
               set enqueue_shards = shards, shards_changed_xact = pg_current_xact_id()
             where m.queue_id = meta.queue_id;
            insert into awa.shard_changes (
                queue, old_shards, new_shards, lanes_created, source
            ) values (meta.queue, meta.enqueue_shards, shards, created, _set_enqueue_shards.source);
        end if;
        return next;
    end loop;
end;
$$;

-- Function: awa.set_enqueue_shards(queue text, shards integer)
-- Sets S for a queue: 1..64. Raising provisions the new lanes in the same
-- transaction; lowering provisions nothing and lanes >= S keep draining.
-- A repeat is a no-op (lanes_created = 0, no audit row). Role: awa_operator.
-- Returns one row per physical queue: (physical_queue, old_shards,
--   new_shards, lanes_created).
-- Errors: 22004 null shards; 22023 out of range or bad queue name;
--   25006 on a standby.
-- Calls: awa._set_enqueue_shards
-- Writes: nothing
create or replace function awa.set_enqueue_shards(queue text, shards integer)
returns table (
    physical_queue text, old_shards smallint, new_shards smallint, lanes_created integer
)
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select * from awa._set_enqueue_shards(queue, shards, 'manual')
$$;

select awa._grant_execute(
    'awa.enqueue_shards(text)', 'producer', 'worker', 'maintenance', 'operator', 'reader'
);
select awa._grant_execute('awa._check_range(text, integer, integer)');
select awa._grant_execute('awa._require_primary(text)');
select awa._grant_execute('awa._check_layout_change(text, text, integer, integer)');
select awa._grant_execute('awa._set_enqueue_shards(text, integer, text)');
select awa._grant_execute('awa.set_enqueue_shards(text, integer)', 'operator');

-- Function: awa._oldest_snapshot() returns xid8
-- The oldest xmin of a snapshot any other session of this database holds,
-- widened to xid8 from pg_stat_activity.backend_xmin (which every role may
-- read); null when none holds one. A session between statements of a read
-- committed transaction holds none: its next statement reads afresh.
-- Processes of no role (autovacuum's workers) are left out: they enqueue
-- nothing. (Every role sees another's backend_xmin and role, not its
-- backend_type.)
-- Calls: nothing
-- Writes: nothing
create or replace function awa._oldest_snapshot()
returns xid8
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    -- A 32-bit xid is within 2^31 of the caller's next xid (wraparound
    -- protection), below it or, for a snapshot taken since the caller's,
    -- above: widened by that signed distance.
    select min(
               n.next - (((n.next - a.backend_xmin::text::bigint + 2147483648) & 4294967295)
                         - 2147483648)
           )::text::xid8
      from pg_stat_activity as a
     cross join (
         select pg_snapshot_xmax(pg_current_snapshot())::text::bigint as next
     ) as n
     where a.datname = current_database()
       and a.pid <> pg_backend_pid()
       and a.backend_xmin is not null
       and a.usesysid is not null
$$;

-- Function: awa._shards_in_use(queue_id integer, lowest integer, highest integer) returns integer
-- How many shards of the queue, at least `lowest`, a claim must walk to
-- reach every lane of shards lowest .. highest - 1 that holds a row at or
-- above its claim hint (rows below a hint are gone for good, ADR 030):
-- one more than the highest such shard, else `lowest`.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._shards_in_use(queue_id integer, lowest integer, highest integer)
returns integer
language sql
stable
set search_path = pg_catalog, pg_temp
-- Lanes, hints and rows are looked up by key.
set enable_seqscan = off
as $$
    select greatest(lowest, max(l.shard) + 1)
      from awa.lanes as l
     where l.queue_id = _shards_in_use.queue_id
       and l.shard >= lowest and l.shard < highest
       and exists (
           select from awa.ready as r
            where r.lane_id = l.lane_id
              and r.lane_seq >= (select coalesce(max(h.head_seq), 0)
                                   from awa.lane_hints as h
                                  where h.lane_id = l.lane_id)
       )
$$;

-- Function: awa.retire_lanes() returns integer
-- Lowers queue_meta.lane_shards, the shards a claim walks, past the lanes
-- at or above S that no job can be in: after S is lowered, its lanes above
-- drain, and a claim would otherwise walk them, empty, for good (ADR 041).
-- A lane above S can still get a job from a session whose snapshot is
-- older than the change of S (it reads the old S), and may hold one not
-- yet committed (an enqueue holds its lane's lock until it commits). So a
-- physical queue whose claims walk more shards than S is taken only once
-- its last change of S (queue_meta.shards_changed_xact) has committed and
-- no other session of the database holds a snapshot older than it
-- (awa._oldest_snapshot). Its lanes above the highest shard that holds a
-- row (awa._shards_in_use) are then try-locked; if another session holds
-- one, the queue is skipped; else they are read again with a snapshot
-- taken after those locks, and retired if still empty. awa.ready and
-- awa.lane_hints are held (ACCESS SHARE) for the call, so no rewrite by
-- TRUNCATE comes between a snapshot and a read of them. Never waits more
-- than 100 ms for a lock: a queue whose settings row is being changed is
-- skipped, and a call that cannot hold the tables changes nothing; both are
-- left to the next call. Stops after the queue that takes its lane locks
-- past 1,024 in one call. A change of S, or an upgrade, counts every lane
-- again; run this every minute or so (awa maintain does).
-- On a standby: 0 at once (the primary retires lanes).
-- Role: awa_maintenance.
-- Returns: how many physical queues' claims now walk fewer shards.
-- Errors: 25000 the calling transaction is not read committed: its
-- snapshot could miss a job that entered a lane before the call.
-- Calls: awa._before_every_snapshot, awa._check_read_committed, awa._lock_class_lane,
--   awa._note_run, awa._oldest_snapshot, awa._shards_in_use
-- Writes: awa.queue_meta
create or replace function awa.retire_lanes()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    q record;
    busy bigint;
    tried bigint;
    locked bigint := 0;
    keep integer;
    retired integer := 0;
begin
    perform awa._check_read_committed('awa.retire_lanes()');
    -- A standby has no claim hints (awa.lane_hints is unlogged, and may not
    -- be read there: 0A000) and retires nothing: its primary does.
    if pg_is_in_recovery() then
        return 0;
    end if;
    perform awa._note_run('retire_lanes');
    begin
        lock table awa.ready, awa.lane_hints in access share mode;
    exception when lock_not_available then
        return 0;
    end;
    -- The sessions read afresh, in the statement that reads each queue's
    -- last change of S, so after that change committed.
    perform pg_stat_clear_snapshot();
    for q in
        select m.queue_id, m.enqueue_shards, m.lane_shards, m.shards_changed_xact
          from awa.queue_meta as m
         cross join (select awa._oldest_snapshot() as xmin) as o
         where m.lane_shards > m.enqueue_shards
           and awa._before_every_snapshot(m.shards_changed_xact, o.xmin)
         order by m.queue_id
    loop
        exit when locked >= 1024;
        keep := awa._shards_in_use(q.queue_id, q.enqueue_shards, q.lane_shards);
        continue when keep >= q.lane_shards;
        -- Every lane tried (a filter is evaluated for each row).
        select count(*) filter (
                   where not pg_try_advisory_xact_lock(awa._lock_class_lane(), l.lane_id)
               ),
               count(*)
          into busy, tried
          from awa.lanes as l
         where l.queue_id = q.queue_id and l.shard >= keep and l.shard < q.lane_shards;
        locked := locked + tried;
        continue when busy > 0;
        -- A job committed before those locks is seen now.
        continue when awa._shards_in_use(q.queue_id, keep, q.lane_shards) > keep;
        begin
            update awa.queue_meta as m set lane_shards = keep
             where m.queue_id = q.queue_id and m.lane_shards = q.lane_shards
               and m.shards_changed_xact = q.shards_changed_xact;
            retired := retired + case when found then 1 else 0 end;
        exception when lock_not_available then
            null;  -- the queue's settings row is being changed: the next call
        end;
    end loop;
    return retired;
end;
$$;

select awa._grant_execute('awa._oldest_snapshot()');

-- Function: awa._before_every_snapshot(xact xid8, oldest xid8) returns boolean
-- Whether every other session reads what transaction `xact` did: no
-- snapshot older than it is held (`oldest`, awa._oldest_snapshot(), read
-- once by the caller for all its rows; a snapshot whose xmin is above a
-- transaction's id was taken after it ended), and it is not the caller's
-- own, which has not committed. The rule of awa.retire_lanes (a change of
-- S) and awa.finish_drops (a drop, a removal). A transaction id this
-- cluster has not reached yet (at or above the next one to be assigned)
-- was recorded on another cluster, the one a dump was taken from (pg_dump
-- keeps the rows, not the transaction counter): no session here can hold a
-- snapshot from before it, so it counts as before every snapshot. Without
-- this, a change of S or a drop restored from a cluster further on would
-- wait for this cluster's counter to catch up (billions of transactions
-- away, epochs included). pg_upgrade keeps the counter, so there the ids
-- stay this cluster's own. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._before_every_snapshot(xact xid8, oldest xid8)
returns boolean
language sql
stable
as $$
    select (oldest is null or xact operator(pg_catalog.<) oldest
            or xact operator(pg_catalog.>=)
               pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot()))
       and coalesce(
           xact operator(pg_catalog.<>) pg_catalog.pg_current_xact_id_if_assigned(), true
       )
$$;

select awa._grant_execute('awa._before_every_snapshot(xid8, xid8)');
select awa._grant_execute('awa._shards_in_use(integer, integer, integer)');
select awa._grant_execute('awa.retire_lanes()', 'maintenance');

-- Function: awa.set_queue_stripes(queue text, stripes integer)
-- Advanced: stores a logical queue as stripes queue#0 .. queue#(K-1), each
-- an ordinary physical queue with the queue's S. New enqueues spread over
-- the stripes (keyed jobs by their key); claims, pauses and shard changes by
-- the logical name cover every stripe; jobs already in other stripes or in
-- the queue's own lanes keep draining. Not the way to scale a hot queue:
-- raise S first, then partition. Role: awa_operator.
-- Returns one row per physical queue that new enqueues now use.
-- Errors: 22004 null; 22023 out of range (1..64) or bad name; 25006 standby;
--   53400 no room under the queue limit for the new stripes (all checked first).
-- Calls: awa._check_layout_change, awa._check_queue_room, awa._lock_leader,
--   awa._lock_queue_provisioning, awa._physical_queues
-- Writes: awa.queue_meta
create or replace function awa.set_queue_stripes(queue text, stripes integer)
returns table (physical_queue text, enqueue_shards smallint, lanes integer)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
begin
    perform awa._check_layout_change(queue, 'stripes', stripes, 64);
    if set_queue_stripes.stripes > 1 then
        -- A partition's stripes are members of its root's family: the
        -- root's row before the partition's (awa._lock_rank's order), so
        -- that a change of the family's settings (awa._lock_family) waits
        -- for the stripes made here, and finds them. Only here: a change
        -- that makes no member does not wait for the root's row.
        perform awa._lock_leader('provisioning');
        perform
          from awa.queue_meta as r
         where r.queue = (select m.root_queue from awa.queue_meta as m
                           where m.queue = set_queue_stripes.queue)
           for no key update;
    end if;
    anchor := awa._lock_queue_provisioning(queue);
    if set_queue_stripes.stripes > 1 then
        perform awa._check_queue_room(array(
            select set_queue_stripes.queue || '#' || k
              from generate_series(0, set_queue_stripes.stripes - 1) as k
        ));
    end if;
    update awa.queue_meta as m set stripes = set_queue_stripes.stripes
     where m.queue_id = anchor.queue_id;
    perform awa._physical_queues(set_queue_stripes.queue);
    return query
    select p.queue, p.enqueue_shards,
           (select count(*)::integer from awa.lanes as l where l.queue_id = p.queue_id)
      from awa.queue_meta as p
     where (set_queue_stripes.stripes = 1 and p.queue_id = anchor.queue_id)
        or (set_queue_stripes.stripes > 1 and p.queue in (
            select set_queue_stripes.queue || '#' || k
              from generate_series(0, set_queue_stripes.stripes - 1) as k
        ))
     order by p.queue_id;
end;
$$;

select awa._grant_execute('awa.set_queue_stripes(text, integer)', 'operator');

-- Function: awa._check_partition_names(logical text, partitions integer) returns void
-- Raises 22023 when the name of the last of `partitions` partitions of
-- `logical` (logical__p(P-1), the longest) is longer than a queue name may
-- be. Producers enqueue to a partition by its name
-- (awa_sql.PartitionedQueue), operators pause it or change its S by it,
-- and each refused such a name where a claim took it. The limit is
-- awa._queue_name_ok's, its one home; the message finds it there. Stripes
-- need no such check: no call takes a stripe's name (it holds '#'), each
-- reaches them by their queue's name.
-- Calls: awa._queue_name_ok
-- Writes: nothing
create or replace function awa._check_partition_names(logical text, partitions integer)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
declare
    last_name text := logical || '__p' || (partitions - 1);
    limit_bytes integer := octet_length(last_name) - 1;
    digits integer;
begin
    if partitions <= 1 or awa._queue_name_ok(last_name) then
        return;
    end if;
    -- The longest padding of the logical name the rule takes: `logical`
    -- passed it, and padding changes nothing but the length.
    while limit_bytes > octet_length(logical)
          and not awa._queue_name_ok(
              logical || repeat('_', limit_bytes - octet_length(logical))
          ) loop
        limit_bytes := limit_bytes - 1;
    end loop;
    -- The partitions this name takes: P - 1 of `digits` digits at most.
    digits := limit_bytes - octet_length(logical) - length('__p');
    raise exception '% partitions of queue % would name the last one %, % bytes: '
                    'a queue name is at most % bytes',
        partitions, quote_literal(logical), quote_literal(last_name), octet_length(last_name),
        limit_bytes
        using errcode = '22023',
              hint = format('Each partition is a queue named <queue>__p<k>, by which producers '
                            'and operators name it; %s. Use a shorter queue name or fewer '
                            'partitions.',
                            case when digits < 1 then 'this name leaves no room for one'
                                 else format('this name takes at most %s partitions',
                                             least(32767, 10 ^ least(digits, 5))) end);
end;
$$;

select awa._grant_execute('awa._check_partition_names(text, integer)');

-- Function: awa.set_queue_partitions(queue text, partitions integer)
-- Registers a logical queue as carried by P partitions: the queue itself
-- (partition 0) and queue__p1 .. queue__p(P-1), ordinary queues with the
-- logical queue's S. From the commit on, every producer enqueuing to the
-- logical name (awa.enqueue, awa.enqueue_batch, COPY) sends a keyed job to
-- partition partition_hash64(key) mod P with its key as ordering key, and
-- spreads unkeyed jobs. Claims, pauses and shard changes by the logical name
-- cover every partition. Changing P is a repartitioning event: keys move,
-- and per-key order returns once the old partitions drain (ADR 004).
-- Role: awa_operator. Returns one row per partition.
-- Errors: 22004 null; 22023 out of range (1..32767), bad name, or a
--   partition's name longer than a queue name may be
--   (awa._check_partition_names); 25006 standby; 53400 no room under the
--   queue limit for the new partitions (all checked first).
-- Calls: awa._check_layout_change, awa._check_partition_names, awa._check_queue_room,
--   awa._ensure_partition, awa._lock_queue_provisioning, awa.partition_queue_names
-- Writes: awa.queue_meta
create or replace function awa.set_queue_partitions(queue text, partitions integer)
returns table (partition integer, physical_queue text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
begin
    perform awa._check_layout_change(queue, 'partitions', partitions, 32767);
    -- Before the first lock, which creates a missing queue: nothing is made.
    perform awa._check_partition_names(queue, partitions);
    anchor := awa._lock_queue_provisioning(queue);
    if anchor.root_queue is not null then
        raise exception 'queue % is itself a partition or stripe of %',
            quote_literal(queue), quote_literal(anchor.root_queue)
            using errcode = '22023';
    end if;
    perform awa._check_queue_room(
        awa.partition_queue_names(set_queue_partitions.queue, set_queue_partitions.partitions)
    );
    update awa.queue_meta as m set partitions = set_queue_partitions.partitions
     where m.queue_id = anchor.queue_id;
    for k in 1 .. set_queue_partitions.partitions - 1 loop
        perform awa._ensure_partition(set_queue_partitions.queue, k);
    end loop;
    return query
    select n.i::integer - 1, n.name
      from unnest(awa.partition_queue_names(set_queue_partitions.queue,
                                            set_queue_partitions.partitions))
           with ordinality as n (name, i)
     order by n.i;
end;
$$;

select awa._grant_execute('awa.set_queue_partitions(text, integer)', 'operator');

-- Function: awa.prune_shard_changes(older_than interval default '90 days',
--   max_changes integer default 10000) returns bigint
-- Removes up to max_changes changes of S made more than older_than ago,
-- oldest first, with their lanes' rows (awa.shard_change_lanes, by its
-- cascade); never the latest change of a queue that exists, which the
-- auto-scaler's cooldown, the runtimes' evidence and awa._shards_at read.
-- The latest change of a name no queue has any more (a queue dropped and
-- removed, ADR 044) goes too, after the others: kept, it stayed for good,
-- and every call read it again. Changes another transaction holds are
-- skipped. It reads the changes it removes and at most one kept change per
-- queue that exists, whatever the history's length.
-- awa maintain's shard_changes pass calls it with the defaults.
-- Role: awa_maintenance. Returns how many changes it removed.
-- Errors: 22004 older_than null; 22023 older_than under 1 day or
--   max_changes below 0.
-- Calls: awa._check_limit, awa._in_seconds, awa._note_run
-- Writes: awa.shard_changes
create or replace function awa.prune_shard_changes(
    older_than interval default '90 days', max_changes integer default 10000
)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    removed bigint;
    gone bigint;
    -- In seconds, as every duration is applied (awa._in_seconds): by the
    -- calendar of the caller's time zone, '1 day' could be 12 hours.
    cutoff timestamptz;
begin
    if older_than is null then
        raise exception 'older_than must not be null' using errcode = '22004';
    end if;
    if date_part('epoch', older_than) < 86400 then  -- in seconds, as cutoff is
        raise exception 'older_than must be at least 1 day, got %', older_than
            using errcode = '22023',
                  hint = 'The history of changes of S is an audit trail: keep a day at least.';
    end if;
    perform awa._check_limit('max_changes', max_changes);
    perform awa._note_run('shard_changes');
    cutoff := now() - awa._in_seconds(older_than);
    delete from awa.shard_changes as c
     where c.change_id = any(array(
         select x.change_id from awa.shard_changes as x
          where x.changed_at < cutoff
            and exists (select from awa.shard_changes as n
                         where n.queue = x.queue and n.change_id > x.change_id)
          order by x.changed_at
          limit max_changes
            for update skip locked
     ));
    get diagnostics removed = row_count;
    -- A statement of its own: beside the test above in an or, the probe for
    -- a later change is a subplan, planned to stop at its first row, which
    -- walks the primary key down from the change and filters by queue.
    delete from awa.shard_changes as c
     where c.change_id = any(array(
         select x.change_id from awa.shard_changes as x
          where x.changed_at < cutoff
            and not exists (select from awa.queue_meta as m where m.queue = x.queue)
          order by x.changed_at
          limit max_changes - removed
            for update skip locked
     ));
    get diagnostics gone = row_count;
    return removed + gone;
end;
$$;

select awa._grant_execute('awa.prune_shard_changes(interval, integer)', 'maintenance');
