-- shards.sql: reading and changing a queue's enqueue shards (S).

-- Function: awa.enqueue_shards(queue text) returns smallint
-- The queue's current S. Roles: every awa role.
-- Errors: 42704 unknown queue; 22004/22023 bad name.
create or replace function awa.enqueue_shards(queue text)
returns smallint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select (awa._queue(queue)).enqueue_shards
$$;

-- Function: awa._set_enqueue_shards(queue text, shards integer, source text)
-- The one code path that changes S, for operators (manual) and the
-- auto-scaler (auto). In one transaction: validate, lock the queue's
-- settings row (never a lane lock, so producers are not blocked),
-- provision every priority x shard lane when raising, then update S.
-- Producers read S per statement, so none can see the new S before its
-- lanes exist, and every producer sees it at this transaction's commit.
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
begin
    if shards is null then
        raise exception 'shards must not be null' using errcode = '22004';
    end if;
    if shards not between 1 and 64 then
        raise exception 'enqueue shards must be between 1 and 64, got %', shards
            using errcode = '22023',
                  hint = 'S = 1 keeps strict FIFO per (queue, priority); more makes it '
                         'partitioned FIFO.';
    end if;
    if pg_is_in_recovery() then
        raise exception 'cannot change enqueue shards on a standby'
            using errcode = '25006',
                  hint = 'Connect to the primary.';
    end if;
    perform awa._check_queue_name(queue);
    meta := awa._ensure_queue(queue);
    select m.* into strict meta
      from awa.queue_meta as m where m.queue_id = meta.queue_id
       for update;
    physical_queue := meta.queue;
    old_shards := meta.enqueue_shards;
    new_shards := shards;
    created := 0;
    if shards > meta.enqueue_shards then
        perform pg_advisory_xact_lock(1635213648, 0);
        created := awa._provision_lanes(meta.queue_id, shards);
    end if;
    lanes_created := created;
    if shards <> meta.enqueue_shards then
        update awa.queue_meta as m set enqueue_shards = shards
         where m.queue_id = meta.queue_id;
        insert into awa.shard_changes (queue, old_shards, new_shards, lanes_created, source)
        values (meta.queue, meta.enqueue_shards, shards, created, _set_enqueue_shards.source);
    end if;
    return next;
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
select awa._grant_execute('awa._set_enqueue_shards(text, integer, text)');
select awa._grant_execute('awa.set_enqueue_shards(text, integer)', 'operator');
