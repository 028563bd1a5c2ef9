-- runtimes.sql: runtime snapshots and the lane evidence of shard changes.

-- Function: awa._record_change_lanes() returns trigger
-- After a row lands in awa.shard_changes: record where each lane of that
-- queue stands, in the same transaction as the change.
-- Calls: nothing
-- Writes: awa.shard_change_lanes
create or replace function awa._record_change_lanes()
returns trigger
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into awa.shard_change_lanes (change_id, lane_id, shard, seq_at_change)
    select new.change_id, l.lane_id, l.shard, coalesce(pg_sequence_last_value(l.seq), 0)
      from awa.lanes as l
     inner join awa.queue_meta as m on l.queue_id = m.queue_id
     where m.queue = new.queue;
    return null;
end;
$$;

select awa._grant_execute('awa._record_change_lanes()');

select awa._ensure_trigger(
    'awa.shard_changes', 'shard_changes_record_lanes',
    'CREATE TRIGGER shard_changes_record_lanes AFTER INSERT ON awa.shard_changes'
    ' FOR EACH ROW EXECUTE FUNCTION awa._record_change_lanes()'
);

-- Function: awa._shards_at(queue text, at timestamptz) returns smallint
-- The S a physical queue had at a moment, from its change history: what
-- the last change made up to then set, else what the first change after it
-- started from, else the queue's S. Planned for each call's queue: a plan
-- for any queue reads the primary key from the newest change down, which
-- for a queue changed rarely among busy ones is every change since its
-- own; planned for this queue, it reads the index on (queue, change_id).
-- PL/pgSQL: PostgreSQL 17 plans a SQL function's statements for any
-- parameters, whatever plan_cache_mode says.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._shards_at(queue text, at timestamptz)
returns smallint
language plpgsql
stable
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
begin
    return coalesce(
        (select c.new_shards from awa.shard_changes as c
          where c.queue = _shards_at.queue and c.changed_at <= _shards_at.at
          order by c.change_id desc limit 1),
        (select c.old_shards from awa.shard_changes as c
          where c.queue = _shards_at.queue and c.changed_at > _shards_at.at
          order by c.change_id limit 1),
        (select m.enqueue_shards from awa.queue_meta as m where m.queue = _shards_at.queue)
    );
end;
$$;

select awa._grant_execute('awa._shards_at(text, timestamptz)');

-- Function: awa.publish_runtime(instance_id uuid, kind text, host text, pid integer,
--   version text, in_flight integer, activity jsonb) returns integer
-- A runtime's snapshot, every 10 s. activity is a JSON array of
-- {"queue": name, "activity": "enqueue" | "claim" | "poll", "age_seconds": n}:
-- how long ago the runtime last did that there, by its own clock, so that
-- the database's clock dates it and finds the S it used. enqueue and claim
-- name a physical queue; poll (a worker's claim call, with or without a
-- job; workers only) the name it claims by, recorded for each physical
-- queue that name covers (awa._names_cover: a logical name, its partitions
-- and stripes, paused or not; a name no queue has yet, itself), the latest
-- poll of each. At most 1,000 rows a snapshot: enqueues and claims first,
-- then polls until the cap. Only the login that
-- created a row may refresh it, also when two logins create one id at once.
-- A kind is a capability, which awa.runtime_overview and the admin page
-- show: a worker's snapshot comes from a login holding the worker role, a
-- producer's from one holding the producer role (a producer's login could
-- otherwise pass for a worker claiming from a queue).
-- Removes stale rows (30 s without a snapshot) but those another publish
-- holds, which it is refreshing; returns how many. Roles: awa_producer, awa_worker.
-- Errors: 22023 bad kind, pid, in_flight, text length or activity, a
--   poll from a producer, or a kind other than the runtime's; 22004 nulls;
--   42501 the instance belongs to another login, or the login does not
--   hold the kind's role; 53400 a new instance of a login that has 1,000
--   live ones.
-- Calls: awa._check_capability, awa._names_cover, awa._shards_at
-- Writes: awa.runtime_queues, awa.runtimes
create or replace function awa.publish_runtime(
    instance_id uuid, kind text, host text, pid integer, version text,
    in_flight integer, activity jsonb
)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    owner_login text;
    known_kind text;
    removed integer;
begin
    if instance_id is null or kind is null or host is null or pid is null
       or version is null or in_flight is null or activity is null then
        raise exception 'publish_runtime arguments must not be null' using errcode = '22004';
    end if;
    if kind not in ('producer', 'worker') then
        raise exception 'kind must be producer or worker, got %', quote_literal(kind)
            using errcode = '22023';
    end if;
    if pid < 1 or in_flight < 0 then
        raise exception 'pid must be positive and in_flight not negative, got % and %',
            pid, in_flight using errcode = '22023';
    end if;
    if octet_length(host) > 255 or octet_length(version) > 64 then
        raise exception 'host must be at most 255 bytes and version 64, got % and %',
            octet_length(host), octet_length(version) using errcode = '22023';
    end if;
    -- Each element checked as a whole, a missing key false, not null (a
    -- null let the element through to the insert: 23502). A physical
    -- queue's name is at most 211 bytes: a 200-byte name, '__p32766' and
    -- '#63'.
    if jsonb_typeof(activity) <> 'array' or jsonb_array_length(activity) > 1000 or exists (
        select from jsonb_array_elements(activity) as a (e)
         where not coalesce(
                   jsonb_typeof(a.e) = 'object'
                   and a.e ->> 'activity' in ('enqueue', 'claim', 'poll')
                   and jsonb_typeof(a.e -> 'queue') = 'string'
                   and octet_length(a.e ->> 'queue') between 1 and 211
                   and case when jsonb_typeof(a.e -> 'age_seconds') = 'number'
                            then (a.e -> 'age_seconds')::numeric between 0 and 86400
                       end,
                   false)
    ) then
        raise exception 'activity must be an array of at most 1000 '
            '{"queue": text, "activity": "enqueue"|"claim"|"poll", "age_seconds": 0..86400}'
            using errcode = '22023';
    end if;
    select r.owner_login, r.kind into owner_login, known_kind from awa.runtimes as r
     where r.instance_id = publish_runtime.instance_id for update;
    if owner_login is not null and owner_login <> session_user then
        raise exception 'runtime % belongs to login %', instance_id, owner_login
            using errcode = '42501';
    end if;
    if known_kind is not null and known_kind <> kind then
        raise exception 'runtime % is a %, not a %', instance_id, known_kind, kind
            using errcode = '22023';
    end if;
    perform awa._check_capability('awa.publish_runtime', kind, 'kind ' || kind);
    -- A runtime keeps its id across its snapshots: a login that makes a new
    -- one at every call would fill what every watch reads. Counted, not
    -- locked: logins publishing new ids at once may pass it by as many.
    if owner_login is null and (
        select count(*) from awa.runtimes as r
         where r.owner_login = session_user and r.last_seen >= now() - interval '30 seconds'
    ) >= 1000 then
        raise exception 'login % has 1000 live runtimes, the most one login may have',
            quote_literal(session_user)
            using errcode = '53400',
                  hint = 'Publish each process''s snapshots under one instance id.';
    end if;
    -- The owner again: a login that made the same instance id after the read
    -- above (it waited here for that insert to commit) updates nothing.
    insert into awa.runtimes as r (instance_id, kind, hostname, pid, version, in_flight)
    values (instance_id, kind, host, pid, version, in_flight)
    on conflict on constraint runtimes_pkey do update
       set in_flight = excluded.in_flight, last_seen = pg_catalog.now()
     where r.owner_login = session_user;
    if not found then
        raise exception 'runtime % belongs to another login', instance_id
            using errcode = '42501';
    end if;
    if kind <> 'worker' and exists (
        select from jsonb_array_elements(activity) as a (e) where a.e ->> 'activity' = 'poll'
    ) then
        raise exception 'poll is a worker''s activity, not a %''s', kind
            using errcode = '22023';
    end if;
    delete from awa.runtime_queues as q where q.instance_id = publish_runtime.instance_id;
    insert into awa.runtime_queues (instance_id, queue, activity, last_at, shards)
    with entries as (
        select x.e ->> 'queue' as queue, x.e ->> 'activity' as activity,
               -- To the microsecond first: 1e-400 is a number in range, and
               -- no double precision.
               clock_timestamp()
               - make_interval(secs => round((x.e -> 'age_seconds')::numeric, 6)
                                       ::double precision) as at
          from jsonb_array_elements(activity) as x (e)
    )
    select publish_runtime.instance_id, t.queue, t.activity, t.at,
           awa._shards_at(t.queue, t.at)
      from (
          select e.queue, e.activity, max(e.at) as at
            from (
                (select a.queue, a.activity, a.at from entries as a
                  where a.activity <> 'poll')
                union all
                -- Each name polled once, the latest first, then the physical
                -- queues it covers; the rows end at the cap, however many a
                -- name covers. The cap keeps the rows read first, unsorted so
                -- that a wide name is never expanded whole: an Append reads
                -- its branches in order, and a nested loop its outer rows.
                (select coalesce(m.queue, n.queue), 'poll', n.at
                   from (select a.queue, max(a.at) as at from entries as a
                          where a.activity = 'poll' group by a.queue
                          order by at desc) as n
                   left join lateral (
                       select m.queue from awa.queue_meta as m
                        where awa._names_cover(array[n.queue], m.queue, m.logical_queue,
                                               m.root_queue)
                   ) as m on true)
                limit 1000
            ) as e
           group by e.queue, e.activity
      ) as t;
    -- A stale row another publish holds is being refreshed: passed over. Waiting
    -- for it deadlocked two stale runtimes publishing at once, each holding
    -- its own row and waiting for the other's.
    delete from awa.runtimes as r
     where r.instance_id in (
         select s.instance_id from awa.runtimes as s
          where s.last_seen < now() - interval '30 seconds'
            for update skip locked
     );
    get diagnostics removed = row_count;
    return removed;
end;
$$;

select awa._grant_execute(
    'awa.publish_runtime(uuid, text, text, integer, text, integer, jsonb)',
    'producer', 'worker'
);

-- Function: awa.remove_runtime(instance_id uuid) returns boolean
-- A runtime stopping cleanly removes its snapshot. Roles: awa_producer, awa_worker.
-- Calls: nothing
-- Writes: awa.runtimes
create or replace function awa.remove_runtime(instance_id uuid)
returns boolean
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    with gone as (
        delete from awa.runtimes as r
         where r.instance_id = remove_runtime.instance_id and r.owner_login = session_user
        returning 1
    )
    select exists (select from gone)
$$;

select awa._grant_execute('awa.remove_runtime(uuid)', 'producer', 'worker');

-- Each view below is made as a scratch view (its name after _new_) that
-- awa._ensure_view puts in place only when it differs: CREATE OR REPLACE
-- VIEW would hold every reader of the view off until the layer commits.

-- View: awa.runtime_overview, the live runtimes.
create view awa._new_runtime_overview as
select
    r.instance_id,
    r.kind,
    r.hostname,
    r.pid,
    r.version,
    r.in_flight,
    r.owner_login,
    r.started_at,
    r.last_seen
from awa.runtimes as r
where r.last_seen >= pg_catalog.now() - interval '30 seconds';

select awa._ensure_view('awa.runtime_overview', 'awa._new_runtime_overview');

comment on view awa.runtime_overview is
'Python producers and workers that published a snapshot in the last 30 seconds.';

-- View: awa.runtime_queue_overview, per live runtime and queue.
create view awa._new_runtime_queue_overview as
select
    q.instance_id,
    q.queue,
    q.activity,
    q.last_at,
    q.shards
from awa.runtime_queues as q
inner join awa.runtime_overview as r on q.instance_id = r.instance_id;

select awa._ensure_view('awa.runtime_queue_overview', 'awa._new_runtime_queue_overview');

comment on view awa.runtime_queue_overview is
'Per live runtime and physical queue: its last enqueue, claim or poll there and the S then.';

-- View: awa.shard_change_evidence, per shard change.
create view awa._new_shard_change_evidence as
select
    c.change_id,
    c.queue,
    c.changed_at,
    c.new_shards as shards,
    coalesce(sum(d.delta), 0)::bigint as enqueues_since,
    coalesce(sum(d.delta) filter (where d.shard < c.new_shards), 0)::bigint as below_s,
    coalesce(sum(d.delta) filter (where d.shard >= c.new_shards), 0)::bigint as at_or_above_s,
    coalesce(sum(d.delta) filter (
        where d.shard >= c.old_shards and d.shard < c.new_shards
    ), 0)::bigint as on_new_lanes
from awa.shard_changes as c
left join lateral (
    select
        x.shard,
        greatest(awa._lane_next_seq(x.lane_id) - 1 - x.seq_at_change, 0) as delta
    from awa.shard_change_lanes as x
    where x.change_id = c.change_id
) as d on true
group by c.change_id, c.queue, c.changed_at, c.new_shards, c.old_shards;

select awa._ensure_view('awa.shard_change_evidence', 'awa._new_shard_change_evidence');

comment on view awa.shard_change_evidence is
'Enqueues since each shard change, from the lanes (every producer, any language): on '
'lanes below the new S, at or above it, and on the lanes a raise added. Lane sequences '
'count rolled-back reservations too.';

select awa._grant_select('awa.runtime_overview', 'reader', 'operator');
select awa._grant_select('awa.runtime_queue_overview', 'reader', 'operator');
select awa._grant_select('awa.shard_change_evidence', 'reader', 'operator');
