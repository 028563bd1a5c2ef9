-- private.sql: helpers the function layer uses while it is applied: the
-- grant helpers every other file calls for its own routines and relations,
-- and the security check the runner calls last (awa._assert_security) and
-- awa status reads (awa._security_violations).
--
-- None of these is granted to any runtime role: they run as the owner inside
-- the migration transaction.
--
-- Advisory lock classes, every one the package takes (two-int4 form,
-- transaction scoped; 'awa' and a letter as a big-endian int4). Each class
-- is named by one function below, and every lock call and pg_locks query
-- uses the function, never the number. Any role can take an advisory lock
-- of any key, so a class may only guard what a role holding it could do
-- anyway (block producers, as a long transaction would):
--   awa._lock_class_lane()          1635213644 'awaL' (class, lane id): a lane, from
--                                   before its sequence advances until commit
--                                   (sql/lanes.sql)
--   awa._lock_class_copy()          1635213635 'awaC' (class, xid): one COPY mover
--                                   per staging transaction (sql/copy.sql); a
--                                   commit moves its own rows without it
--   awa._lock_class_provisioning()  1635213648 'awaP' (class, 0): creating queues
--                                   and lanes before migration 0026; only
--                                   the function layer's apply waits for it
--   awa._lock_class_migrate()       1635213645 'awaM' (class, 0 and 1): awa migrate,
--                                   a run and each step; the runner takes it
--                                   before this schema exists, so it keeps the
--                                   number too (a test compares the two)
--
-- Leader locks: work one caller does at a time (creating queues and lanes,
-- the auto-scaler's tick, the prune, the rotation of awa.running, each pass
-- of awa maintain) takes a row of awa.leader_locks FOR UPDATE instead
-- (awa._lock_leader, awa._try_leader): a row only the owner can lock, so no
-- runtime role can hold one (ADR 037).
--
-- Inlined constants and predicates: the functions below, the row
-- predicates of sql/queues.sql and awa._has_lane_memo of sql/lanes.sql are
-- plain `language sql` with one SELECT of an expression and no SET clause,
-- so the planner inlines them and folds the constants: they cost nothing at
-- run time, where a call with a pinned search_path costs microseconds. Safe
-- without the pin because every operator and function in their bodies is
-- schema-qualified, they read no table, they only ever run inside the
-- owner's pinned functions, and no runtime role may execute them
-- (tests/test_inlined_functions.py checks them).

-- Function: awa._sticky(n integer) returns integer
-- This backend's sticky index among n (0 .. n - 1): where its unkeyed jobs
-- go first, whether the n are lanes, partitions or stripes, so that one
-- producer's unkeyed jobs keep to one of them and producers spread over
-- all. Stable, not immutable: it reads the backend's pid.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._sticky(n integer)
returns integer
language sql
stable parallel safe
as $$
    select pg_catalog.pg_backend_pid() operator(pg_catalog.%) n
$$;

-- Function: awa._spread(pid integer, n integer, level integer) returns integer
-- The sticky index among n of backend `pid` at a level above the lanes:
-- 1 partitions, 2 stripes. Not the lanes' pid % n: a partition of pid % P
-- and a lane of pid % S put every producer of partition p on lane p when
-- P = S, so unkeyed jobs met on a quarter of the lanes at P = S = 4. The
-- high half of the pid times a level's odd constant, modulo 2^32
-- (multiplicative hashing): consecutive pids spread over the n, and every
-- (partition, stripe, lane) cell is reached. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._spread(pid integer, n integer, level integer)
returns integer
language sql
immutable parallel safe
as $$
    select ((pid::bigint operator(pg_catalog.*)
             case when level operator(pg_catalog.=) 1 then 2654435761 else 2246822519 end
             operator(pg_catalog.%) 4294967296 operator(pg_catalog./) 65536)
            operator(pg_catalog.%) n)::integer
$$;

-- Function: awa._in_turn(n integer, i integer) returns integer
-- The index this backend tries i-th among n (i = 0 .. n - 1): its sticky
-- index first, then the next ones, wrapping. Every path that looks for a
-- free lane walks them in this order.
-- Calls: awa._sticky
-- Writes: nothing
create or replace function awa._in_turn(n integer, i integer)
returns integer
language sql
stable parallel safe
as $$
    select (awa._sticky(n) operator(pg_catalog.+) i) operator(pg_catalog.%) n
$$;

-- Function: awa._lock_class_lane() returns integer
-- The advisory lock class of lanes, 'awaL': (class, lane id), held from
-- before the lane's sequence advances until commit.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_class_lane()
returns integer
language sql
immutable parallel safe
as $$
    select 1635213644
$$;

-- Function: awa._lock_leader(name text) returns void
-- Takes the leader lock `name` (a row of awa.leader_locks) until the
-- transaction ends, waiting for it as long as the caller's lock_timeout
-- lets it.
-- Errors: 55000 no such leader lock.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_leader(name text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform from awa.leader_locks as l where l.name = _lock_leader.name for update;
    if not found then
        raise exception 'leader lock % does not exist', quote_literal(name)
            using errcode = '55000';
    end if;
end;
$$;

-- Function: awa._try_leader(name text) returns boolean
-- Takes the leader lock `name` until the transaction ends if no other
-- transaction holds it; false, at once, if one does.
-- Errors: 55000 no such leader lock.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._try_leader(name text)
returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform from awa.leader_locks as l where l.name = _try_leader.name
       for update skip locked;
    if found then
        return true;
    end if;
    if not exists (select from awa.leader_locks as l where l.name = _try_leader.name) then
        raise exception 'leader lock % does not exist', quote_literal(name)
            using errcode = '55000';
    end if;
    return false;
end;
$$;

-- Function: awa._lock_class_provisioning() returns integer
-- The advisory lock class versions before migration 0026 took to create
-- queues and lanes, 'awaP': (class, 0). The function layer waits for it
-- before it counts links (sql/queues.sql), so that a link an earlier layer
-- makes during an upgrade is counted.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_class_provisioning()
returns integer
language sql
immutable parallel safe
as $$
    select 1635213648
$$;

-- Function: awa._lock_class_copy() returns integer
-- The advisory lock class of the COPY movers, 'awaC': (class, xid), one mover
-- per staging transaction.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_class_copy()
returns integer
language sql
immutable parallel safe
as $$
    select 1635213635
$$;

-- Function: awa._lock_class_migrate() returns integer
-- The advisory lock class of awa migrate, 'awaM': (class, 0) a run and
-- (class, 1) each step; the runner keeps the number too.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_class_migrate()
returns integer
language sql
immutable parallel safe
as $$
    select 1635213645
$$;

-- Function: awa._check_read_committed(caller text) returns void
-- Raises 25000, naming the caller, unless the transaction is read
-- committed. A function that empties a table with TRUNCATE under its lock
-- calls it first: each of its statements must read with a snapshot taken
-- after that lock, or it could miss rows committed before it that the
-- TRUNCATE then removes. The isolation level is the caller's to set: it can
-- only make the check refuse.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_read_committed(caller text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception '% needs a read committed transaction, got %',
            caller, current_setting('transaction_isolation')
            using errcode = '25000';
    end if;
end;
$$;

-- Function: awa._check_run_owner(caller text, job_id bigint, run_lease bigint) returns void
-- For a worker call that found no run of its login for its lease: 42501
-- when the lease names a live run another login claimed
-- (awa.running.claimed_by). A lease is a number from a sequence, so a
-- worker could guess another's; the calls act only on their own login's
-- runs, and say so rather than answer as for a stale lease, so that a
-- worker whose claim and complete use two logins learns why.
-- Errors: 42501 the run is another login's.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_run_owner(caller text, job_id bigint, run_lease bigint)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    perform from awa.running as r
     where r.job_id = _check_run_owner.job_id and r.run_lease = _check_run_owner.run_lease
       and r.claimed_by <> session_user;
    if found then
        raise exception '% may not act on job %: its run was claimed by another login than %',
            caller, job_id, quote_literal(session_user)
            using errcode = '42501',
                  hint = 'Complete, fail and heartbeat a job with the login that claimed it.';
    end if;
end;
$$;

-- Function: awa._check_capability(caller text, capability text, what text) returns void
-- For a call granted to several runtime roles whose argument claims one of
-- them (awa.publish_runtime's kind): 42501 unless the login
-- (session_user, as every check of who calls reads it, whatever role the
-- session has set) is a member, directly or not, of the role bound to
-- `capability`. `what` is the claim, for the message.
-- Errors: 42501 the login does not hold the role.
-- Calls: awa._role_for
-- Writes: nothing
create or replace function awa._check_capability(caller text, capability text, what text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    needed name := awa._role_for(capability);
begin
    if not pg_has_role(session_user, needed, 'MEMBER') then
        raise exception '%: % needs role %, which login % does not hold',
            caller, what, quote_ident(needed), quote_literal(session_user)
            using errcode = '42501',
                  hint = pg_catalog.format('Grant %I to the login, or act with one that '
                                           'holds it.', needed);
    end if;
end;
$$;

-- Function: awa._check_no_run(caller text, job_id bigint, run_lease bigint) returns void
-- For a worker call that found no run for its lease (awa.complete, awa.fail,
-- awa.heartbeat): raises 25000 outside read committed. awa.rotate_running
-- carries a slot's live runs into slot 2 and truncates the slot; a snapshot
-- taken before that commit sees neither copy (TRUNCATE is not MVCC-safe),
-- so it cannot tell a stale lease from a run that is still the caller's.
-- False there would let the worker's transaction commit its effects while
-- the rescue runs the job again; the error rolls them back. In read
-- committed each statement reads after the rotation's lock: no run there is
-- a stale lease, and the caller returns false. A null job_id or run_lease
-- is the caller's bug, not a stale lease: 22004.
-- Calls: awa._check_run_owner
-- Writes: nothing
create or replace function awa._check_no_run(caller text, job_id bigint, run_lease bigint)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if job_id is null or run_lease is null then
        raise exception '% must not be null (in %)',
            case when job_id is null then 'job_id' else 'run_lease' end, caller
            using errcode = '22004';
    end if;
    perform awa._check_run_owner(caller, job_id, run_lease);
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception '% found no run of job % with lease % in a % transaction, which cannot '
            'tell a stale lease from a run awa.rotate_running moved after its snapshot',
            caller, job_id, run_lease, current_setting('transaction_isolation')
            using errcode = '25000',
                  hint = 'Call the worker functions in read committed transactions.';
    end if;
end;
$$;

-- Function: awa._role_for(capability text) returns name
-- The role bound to a capability in awa.role_binding.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._role_for(capability text)
returns name
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    bound name;
begin
    select b.role_name into bound
      from awa.role_binding as b
     where b.capability = _role_for.capability;
    if bound is null then
        raise exception 'no role is bound to capability %', capability
            using errcode = 'AW002',
                  hint = 'awa migrate records the role names before the function layer.';
    end if;
    return bound;
end;
$$;

-- Function: awa._grant_execute(routine regprocedure, variadic capabilities text[])
-- Revokes PUBLIC and grants EXECUTE on one routine to the roles bound to the
-- given capabilities (none: only the owner may call it). Each file calls it
-- once for every routine it defines, in one block at its end or after the
-- function; awa._assert_security() refuses a routine that was left out.
-- Calls: awa._role_for
-- Writes: nothing
create or replace function awa._grant_execute(
    routine regprocedure, variadic capabilities text[] default '{}'
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    capability text;
begin
    execute pg_catalog.format('revoke all on function %s from public', routine);
    foreach capability in array capabilities loop
        execute pg_catalog.format(
            'grant execute on function %s to %I', routine, awa._role_for(capability)
        );
    end loop;
end;
$$;

-- Function: awa._check_snapshot_current() returns boolean
-- Raises 40001 when the statement's snapshot is older than a maintenance
-- rewrite of a job table the caller has read (awa.rotate_running,
-- awa.compact_ready, awa.compact_scheduled, awa.prune_finished's carry:
-- each truncates the table and copies back what it keeps). TRUNCATE is not
-- MVCC-safe: a repeatable read or serializable transaction whose snapshot
-- was taken before the rewrite committed reads the rewritten table empty,
-- so a count, a page or a cancel in it would miss every job kept. Such a
-- snapshot sees a version of the table's pg_class row that a later
-- transaction replaced (its xmax set), naming another file than the
-- catalog cache, which the caller's lock on the table brought up to date.
-- In read committed a statement's snapshot is taken once it holds its
-- tables, so no such snapshot exists there: nothing is read (the job
-- tools' usual case costs a setting's read). Otherwise only tables this
-- transaction holds a lock on are looked at (pg_locks, whose read follows
-- the size of the lock table: about 3 ms at 300 connections): no rewrite
-- can commit while the lock is held, and a table not read may be
-- rewritten at any moment, which is not the caller's concern. True
-- otherwise, for a filter of an SQL function's statement (whose start
-- has locked the tables it reads).
-- Errors: 40001 a table read was rewritten after the snapshot.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_snapshot_current()
returns boolean
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    rewritten regclass;
begin
    if pg_catalog.current_setting('transaction_isolation') = 'read committed' then
        return true;  -- each statement's snapshot is newer than its locks
    end if;
    select c.oid::regclass into rewritten
      from pg_catalog.pg_locks as l
      join pg_catalog.pg_class as c on c.oid = l.relation
     where l.locktype = 'relation' and l.pid = pg_catalog.pg_backend_pid() and l.granted
       and c.oid = any(array['awa.ready'::regclass, 'awa.ready_late'::regclass,
                             'awa.scheduled'::regclass]::oid[]
                       || array(select i.inhrelid
                                  from pg_catalog.pg_inherits as i
                                 where i.inhparent in ('awa.running'::regclass,
                                                       'awa.finished'::regclass)))
       and c.xmax <> '0'::xid and c.relfilenode <> pg_catalog.pg_relation_filenode(c.oid)
     limit 1;
    if rewritten is not null then
        raise exception '% was rewritten by maintenance after this transaction''s snapshot '
                        'was taken, which reads it empty', rewritten
            using errcode = '40001',
                  hint = 'Read again in a new transaction; read committed, which takes '
                         'a snapshot per statement, is never refused.';
    end if;
    return true;
end;
$$;

-- Function: awa._grant_select(relation regclass, variadic capabilities text[])
-- Grants SELECT on a view or table to the roles bound to the capabilities.
-- Calls: awa._role_for
-- Writes: nothing
create or replace function awa._grant_select(
    relation regclass, variadic capabilities text[] default '{}'
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    capability text;
begin
    foreach capability in array capabilities loop
        execute pg_catalog.format(
            'grant select on %s to %I', relation, awa._role_for(capability)
        );
    end loop;
end;
$$;

-- Function: awa._grant_insert(relation regclass, columns text[], variadic capabilities text[])
-- Grants INSERT on some columns of a table to the roles bound to the capabilities.
-- Calls: awa._role_for
-- Writes: nothing
create or replace function awa._grant_insert(
    relation regclass, columns text[], variadic capabilities text[]
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    capability text;
begin
    foreach capability in array capabilities loop
        execute pg_catalog.format(
            'grant insert (%s) on %s to %I',
            (select string_agg(pg_catalog.quote_ident(c), ', ') from unnest(columns) as c),
            relation, awa._role_for(capability)
        );
    end loop;
end;
$$;

-- Function: awa._ensure_trigger(on_table regclass, name text, definition text,
--                                always boolean default false)
-- Makes trigger `name` on `on_table` by `definition`, a CREATE [CONSTRAINT]
-- TRIGGER statement written as pg_get_triggerdef prints it, unless the
-- table has that trigger so already, firing as asked: then it changes
-- nothing and takes no lock on the table. CREATE TRIGGER waits for every writer of the
-- table in flight (a COPY load open for minutes) and holds every next one
-- off until the layer commits, DROP TRIGGER its readers too: layer files
-- make their triggers with this, so that a layer applied again on a live
-- queue stops no producer. `always`: the trigger fires whatever the
-- session's session_replication_role (ENABLE ALWAYS TRIGGER), else in
-- origin and local mode only. A trigger of that name that differs, or that does not fire
-- so (ALTER TABLE ... DISABLE TRIGGER, ENABLE REPLICA TRIGGER), is dropped and
-- made again.
-- Errors: 42P17 the trigger made does not print as `definition` (every
-- apply would make it again).
-- Calls: (dynamic)
-- Writes: (dynamic)
create or replace function awa._ensure_trigger(
    on_table regclass, name text, definition text, always boolean default false
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    made text;
    fires "char" := case when always then 'A' else 'O' end;
begin
    -- The second look is at the trigger just made: 42P17 if it still
    -- differs, or every apply would make it again.
    for look in 1 .. 2 loop
        -- pg_get_triggerdef does not print whether the trigger fires: one
        -- disabled (or set to fire on replica only) is made again too.
        made := (select pg_catalog.pg_get_triggerdef(t.oid)
                        || case when t.tgenabled operator(pg_catalog.<>) fires
                                then ' -- not enabled as asked' else '' end
                   from pg_catalog.pg_trigger as t
                  where t.tgrelid = on_table and t.tgname = _ensure_trigger.name);
        exit when made is not distinct from definition;
        if look = 2 then
            raise exception 'trigger % on % prints as %, not as its definition %',
                name, on_table, coalesce(made, 'nothing'), definition
                using errcode = '42P17',
                      hint = 'Write the definition as pg_get_triggerdef prints it.';
        end if;
        if made is not null then
            execute pg_catalog.format('drop trigger %I on %s', name, on_table);
        end if;
        execute definition;
        if always then
            execute pg_catalog.format('alter table %s enable always trigger %I', on_table, name);
        end if;
    end loop;
end;
$$;

-- Function: awa._view_shape(relation regclass) returns text
-- What a view is made of, as one text: its definition as pg_get_viewdef
-- prints it, its options, and its columns' names, types and collations.
-- Two views of the same shape read the same rows under any name.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._view_shape(relation regclass)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select pg_catalog.format(
        'with (%s) columns (%s) as %s',
        pg_catalog.array_to_string(c.reloptions, ', '),
        (select pg_catalog.string_agg(
                    pg_catalog.format('%I %s collate %s', a.attname,
                                      pg_catalog.format_type(a.atttypid, a.atttypmod),
                                      a.attcollation::regcollation),
                    ', ' order by a.attnum)
           from pg_catalog.pg_attribute as a
          where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped),
        pg_catalog.pg_get_viewdef(c.oid)
    )
      from pg_catalog.pg_class as c
     where c.oid = _view_shape.relation and c.relkind = 'v'
$$;

-- Function: awa._ensure_view(target text, scratch regclass)
-- Makes view `target` (a qualified name) as view `scratch` defines it,
-- then drops `scratch`: the layer file makes each view's new definition
-- as a scratch view of a name of its own (the view's name after _new_)
-- and hands both names here. A target of the same shape
-- (awa._view_shape: definition, options, columns) is left as it is and
-- takes no lock but its readers' own: CREATE OR REPLACE VIEW holds the
-- view ACCESS EXCLUSIVE until the layer commits, so every reader of it
-- (the admin page, the metrics scrape) waited for the apply, and a
-- transaction left open that had read it made the apply wait. A target
-- missing or of another shape is made by CREATE OR REPLACE VIEW with the
-- scratch's options and printed definition: its grants, comment and the
-- views that read it stay.
-- Errors: 42P17 the view made is not of the scratch's shape (every apply
-- would make it again).
-- Calls: awa._view_shape, (dynamic)
-- Writes: (dynamic)
create or replace function awa._ensure_view(target text, scratch regclass)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    names text[] := pg_catalog.parse_ident(target);
    wanted text := awa._view_shape(scratch);
    made text;
begin
    if wanted is null or pg_catalog.cardinality(names) <> 2 then
        raise exception 'want a view and a qualified name, not % and %', scratch, target
            using errcode = '22023';
    end if;
    target := pg_catalog.format('%I.%I', names[1], names[2]);
    made := awa._view_shape(pg_catalog.to_regclass(target));
    if made is distinct from wanted then
        execute pg_catalog.format(
            'create or replace view %s%s as %s',
            target,
            (select ' with (' || pg_catalog.array_to_string(c.reloptions, ', ') || ')'
               from pg_catalog.pg_class as c
              where c.oid = scratch and pg_catalog.cardinality(c.reloptions) > 0),
            pg_catalog.pg_get_viewdef(scratch)
        );
        made := awa._view_shape(pg_catalog.to_regclass(target));
        if made is distinct from wanted then
            raise exception 'view % is made as %, not as its definition %',
                target, coalesce(made, 'nothing'), wanted
                using errcode = '42P17';
        end if;
    end if;
    execute pg_catalog.format('drop view %s', scratch);
end;
$$;

-- Function: awa._privilege_text(privilege text, column_name text, on_what text) returns text
-- A privilege as GRANT and REVOKE name it ('EXECUTE on function
-- awa.enqueue_shards(text)', 'INSERT (kind) on table awa.copy_staging'):
-- the one spelling of the layer's revokes, its warning and
-- awa._grant_drift. column_name '' for the whole object.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._privilege_text(privilege text, column_name text, on_what text)
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
    select privilege
           || case when column_name <> '' then pg_catalog.format(' (%I)', column_name)
                   else '' end
           || ' on ' || on_what
$$;

-- Function: awa._grants_found()
-- Every privilege on schema awa's routines, relations and their columns
-- held by a role other than PUBLIC (its own rules) and the owner: each as
-- REVOKE names it (on_what 'function awa.enqueue_shards(text)', 'procedure
-- ...', 'table awa.ready' or 'sequence awa.run_lease_seq'; column_name ''
-- for the whole object).
-- Calls: nothing
-- Writes: nothing
create or replace function awa._grants_found()
returns table (
    on_what text, column_name text, privilege text, grantee text, grantable boolean
)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    -- REVOKE ... ON FUNCTION refuses a procedure (42809).
    select case when p.prokind = 'p' then 'procedure ' else 'function ' end
           || p.oid::regprocedure::text, '', a.privilege_type,
           pg_catalog.pg_get_userbyid(a.grantee), a.is_grantable
      from pg_catalog.pg_proc as p, pg_catalog.aclexplode(p.proacl) as a
     where p.pronamespace = 'awa'::regnamespace and a.grantee not in (0, p.proowner)
    union all
    select case when c.relkind = 'S' then 'sequence ' else 'table ' end
           || c.oid::regclass::text,
           '', a.privilege_type, pg_catalog.pg_get_userbyid(a.grantee), a.is_grantable
      from pg_catalog.pg_class as c, pg_catalog.aclexplode(c.relacl) as a
     where c.relnamespace = 'awa'::regnamespace and a.grantee not in (0, c.relowner)
    union all
    select 'table ' || c.oid::regclass::text, t.attname::text, a.privilege_type,
           pg_catalog.pg_get_userbyid(a.grantee), a.is_grantable
      from pg_catalog.pg_class as c
      join pg_catalog.pg_attribute as t on t.attrelid = c.oid,
           pg_catalog.aclexplode(t.attacl) as a
     where c.relnamespace = 'awa'::regnamespace
       and t.attnum > 0 and not t.attisdropped
       and a.grantee not in (0, c.relowner)
$$;

-- Function: awa._schema_grants_extra()
-- The privileges on schema awa itself that the bootstrap does not give,
-- held by a role other than PUBLIC (its own rule) and the owner: CREATE,
-- USAGE held by a role no runtime capability is bound to, and the grant
-- option of USAGE (grant_option_only: the USAGE itself is the bootstrap's).
-- CREATE there would let a role add a routine that a definer's qualified
-- call could resolve to.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._schema_grants_extra()
returns table (privilege text, grantee text, grant_option_only boolean)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select a.privilege_type, pg_catalog.pg_get_userbyid(a.grantee),
           a.privilege_type = 'USAGE' and r.bound
      from pg_catalog.pg_namespace as n,
           pg_catalog.aclexplode(n.nspacl) as a,
           lateral (
               select exists (
                   select from awa.role_binding as b
                    where b.capability <> 'owner'
                      and b.role_name = pg_catalog.pg_get_userbyid(a.grantee)
               )
           ) as r (bound)
     where n.oid = 'awa'::regnamespace and a.grantee not in (0, n.nspowner)
       and not (a.privilege_type = 'USAGE' and r.bound and not a.is_grantable)
$$;

-- Function: awa._revoke_grants() returns void
-- Revokes every privilege awa._grants_found() lists, so that the layer
-- grants from nothing and what it grants is all there is: a privilege
-- someone granted since (EXECUTE on an operator's function to the producer
-- role, a write on a table to a login) does not outlive the next apply;
-- and those on the schema itself that awa._schema_grants_extra() lists.
-- The layer's transaction grants its own again before it commits. What it
-- revokes is kept in awa.expected_grants until then, for
-- awa._record_grants to name those not granted again: on the upgrade that
-- makes that table nothing is recorded yet, so no check saw them before.
-- Calls: awa._grants_found, awa._privilege_text, awa._schema_grants_extra
-- Writes: awa.expected_grants
create or replace function awa._revoke_grants()
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
-- A grant another grantee made goes with its grantor's (CASCADE): the
-- revokes after it find nothing, which is no news.
set client_min_messages = error
as $$
declare
    g record;
begin
    if pg_catalog.to_regclass('awa.expected_grants') is not null then
        delete from awa.expected_grants;
        insert into awa.expected_grants (on_what, column_name, privilege, grantee)
        select distinct f.on_what, f.column_name, f.privilege, f.grantee
          from awa._grants_found() as f
        union
        select 'schema awa', '',
               case when x.grant_option_only then 'the grant option of ' else '' end
               || x.privilege, x.grantee
          from awa._schema_grants_extra() as x;
    end if;
    for g in select * from awa._grants_found() loop
        execute pg_catalog.format(
            'revoke %s from %I cascade',
            awa._privilege_text(g.privilege, g.column_name, g.on_what), g.grantee
        );
    end loop;
    for g in select * from awa._schema_grants_extra() loop
        execute pg_catalog.format(
            'revoke %s%s on schema awa from %I cascade',
            case when g.grant_option_only then 'grant option for ' else '' end,
            g.privilege, g.grantee
        );
    end loop;
end;
$$;

-- Function: awa._record_grants() returns void
-- Keeps what the layer granted (awa._grants_found() once every file is
-- applied) in awa.expected_grants, which awa._security_violations compares
-- with the catalog from then on. First it warns, in one WARNING that awa
-- migrate prints, of every privilege awa._revoke_grants took back that the
-- layer did not grant again; not of those on a routine or relation the
-- layer dropped (sql/retired.sql, or after the views that called it),
-- which went with it. Nothing where that table does not exist yet (a layer
-- applied over the migrations before 0036).
-- Calls: awa._grants_found, awa._privilege_text, awa._role_for
-- Writes: awa.expected_grants
create or replace function awa._record_grants()
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    taken text[];
begin
    if pg_catalog.to_regclass('awa.expected_grants') is null then
        return;
    end if;
    select array_agg(e.grantee || ' ' || awa._privilege_text(e.privilege, e.column_name, e.on_what)
                     order by e.on_what, e.column_name, e.privilege, e.grantee)
      into taken
      from (
          select x.on_what, x.column_name, x.privilege, x.grantee
            from awa.expected_grants as x
          except
          select f.on_what, f.column_name, f.privilege, f.grantee
            from awa._grants_found() as f
      ) as e
     where case pg_catalog.split_part(e.on_what, ' ', 1)
               when 'function' then pg_catalog.to_regprocedure(
                   pg_catalog.substr(e.on_what, pg_catalog.length('function ') + 1)) is not null
               when 'procedure' then pg_catalog.to_regprocedure(
                   pg_catalog.substr(e.on_what, pg_catalog.length('procedure ') + 1)) is not null
               when 'table' then pg_catalog.to_regclass(
                   pg_catalog.substr(e.on_what, pg_catalog.length('table ') + 1)) is not null
               when 'sequence' then pg_catalog.to_regclass(
                   pg_catalog.substr(e.on_what, pg_catalog.length('sequence ') + 1)) is not null
               else true
           end;
    if taken is not null then
        raise warning 'the function layer took back % privilege(s) it does not grant: %',
            cardinality(taken), array_to_string(taken, '; ')
            using hint = pg_catalog.format(
                'Give a login a bound role (GRANT %I TO app), not privileges on awa''s '
                'objects.', awa._role_for('producer'));
    end if;
    delete from awa.expected_grants;
    insert into awa.expected_grants (on_what, column_name, privilege, grantee)
    select f.on_what, f.column_name, f.privilege, f.grantee
      from awa._grants_found() as f
     where not f.grantable;
end;
$$;

-- Function: awa._grant_drift() returns table (what text)
-- How the catalog's grants differ from those the layer made
-- (awa.expected_grants): a privilege granted since, one revoked since, a
-- grant option; one line each. Nothing before the layer has recorded them.
-- Calls: awa._grants_found, awa._privilege_text
-- Writes: nothing
create or replace function awa._grant_drift()
returns table (what text)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    -- Two statements: one would be planned whole, the table named in it.
    if pg_catalog.to_regclass('awa.expected_grants') is null then
        return;
    end if;
    if not exists (select from awa.expected_grants) then
        return;
    end if;
    return query
    select pg_catalog.format(
               '%s %s %s',
               coalesce(f.grantee, e.grantee),
               case when e.grantee is null then 'was granted'
                    when f.grantee is null then 'lost'
                    else 'was given the grant option of' end,
               awa._privilege_text(coalesce(f.privilege, e.privilege),
                                   coalesce(f.column_name, e.column_name),
                                   coalesce(f.on_what, e.on_what)))
      from awa._grants_found() as f
      full join awa.expected_grants as e
        on e.on_what = f.on_what and e.column_name = f.column_name
       and e.privilege = f.privilege and e.grantee = f.grantee
     where e.grantee is null or f.grantee is null or f.grantable;
end;
$$;

-- Function: awa._security_violations() returns table (rule text, message text, hint text)
-- The invariants every install and upgrade must leave behind, one row for
-- each that is broken, naming up to ten offenders and how many more. The
-- layer step asserts them (awa._assert_security) and awa status reads them
-- on every run, so that grants lost after the install (a restore with
-- --no-acl, a REVOKE) fail the deploy gate. Rules, in this order:
--   search_path         a SECURITY DEFINER routine without a pinned search_path
--   public_execute      a routine PUBLIC may execute: granted, or no ACL at
--                       all (PostgreSQL's default: EXECUTE to PUBLIC)
--   schema_grants       schema awa grants PUBLIC anything, a bound runtime
--                       role lacks USAGE, or any role holds more than the
--                       bootstrap's USAGE (awa._schema_grants_extra)
--   public_relations    a table, view or sequence grants PUBLIC anything,
--                       or one of its columns does
--   default_privileges  the owner's default privileges let PUBLIC execute
--                       the routines or use the types it creates
--   owner               an object in schema awa not owned by the owner role
--   role_membership     a bound role (awa.role_binding) that is a member of
--                       another, directly or through other roles: GRANT
--                       awa_operator TO awa_producer gives every producer
--                       login the operator's functions, and no grant on
--                       schema awa's objects shows it. A login holding two
--                       bound roles is not a bound role, so that is fine
--                       (the migrating login holds the owner role)
--   grants              a privilege on a routine, relation or column that
--                       the layer did not grant, or one it granted that is
--                       gone (awa._grant_drift)
-- The layer step repairs every rule (its grants, and CREATE OR REPLACE
-- with the pin) but owner and role_membership, since it runs as the owner
-- and can neither take an object back nor revoke a role, and search_path
-- for a routine that is not the layer's.
-- Calls: awa._grant_drift, awa._role_for, awa._schema_grants_extra
-- Writes: nothing
create or replace function awa._security_violations()
returns table (rule text, message text, hint text)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    with recursive
    this (owner_oid, schema_oid) as (
        -- By name, not ::regrole, which reads it as an identifier (AwaOwner
        -- as awaowner, a dot as a schema's).
        select r.oid, 'awa'::regnamespace::oid
          from pg_catalog.pg_roles as r
         where r.rolname = awa._role_for('owner')
    ),
    bound (role_oid, role_name) as (
        select r.oid, r.rolname
          from awa.role_binding as b
          join pg_catalog.pg_roles as r on r.rolname = b.role_name
    ),
    -- Each bound role's memberships, direct and through other roles, with
    -- the roles between (PostgreSQL refuses a circular grant).
    member_of (member_oid, role_oid, via) as (
        select m.member, m.roleid, '{}'::name[]
          from pg_catalog.pg_auth_members as m
          join bound as b on b.role_oid = m.member
        union
        select o.member_oid, m.roleid, o.via || pg_catalog.pg_get_userbyid(o.role_oid)
          from member_of as o
          join pg_catalog.pg_auth_members as m on m.member = o.role_oid
    ),
    offender (rule, what) as (
        select 'search_path', p.oid::regprocedure::text
          from pg_catalog.pg_proc as p, this
         where p.pronamespace = this.schema_oid
           and p.prosecdef
           and (
               select count(*) filter (
                   where c.setting in ('search_path=pg_catalog, pg_temp', 'search_path=""')
               ) <> 1
               or count(*) filter (where c.setting like 'search_path=%') <> 1
                 from unnest(coalesce(p.proconfig, '{}')) as c (setting)
           )
        union all
        select 'public_execute', p.oid::regprocedure::text
          from pg_catalog.pg_proc as p, this
         where p.pronamespace = this.schema_oid
           and (
               p.proacl is null
               or exists (
                   select from pg_catalog.aclexplode(p.proacl) as a where a.grantee = 0
               )
           )
        union all
        select 'schema_grants', 'PUBLIC has ' || a.privilege_type
          from pg_catalog.pg_namespace as n, this,
               pg_catalog.aclexplode(
                   coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))
               ) as a
         where n.oid = this.schema_oid and a.grantee = 0
        union all
        select 'schema_grants', b.role_name || ' has no USAGE'
          from awa.role_binding as b, this
         where b.capability <> 'owner'
           and not exists (
               select
                 from pg_catalog.pg_namespace as n,
                      pg_catalog.aclexplode(
                          coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))
                      ) as a
                where n.oid = this.schema_oid
                  and a.grantee = (select r.oid from pg_catalog.pg_roles as r
                                    where r.rolname = b.role_name)
                  and a.privilege_type = 'USAGE'
           )
        union all
        select 'schema_grants', x.grantee || ' has '
               || case when x.grant_option_only then 'the grant option of ' else '' end
               || x.privilege
          from awa._schema_grants_extra() as x
        union all
        select 'public_relations', c.oid::regclass::text
          from pg_catalog.pg_class as c, this
         where c.relnamespace = this.schema_oid
           and exists (select from pg_catalog.aclexplode(c.relacl) as a where a.grantee = 0)
        union all
        -- GRANT SELECT (args) ON awa.ready TO PUBLIC: in pg_attribute only.
        select 'public_relations', pg_catalog.format('%s (%I)', c.oid::regclass, t.attname)
          from pg_catalog.pg_class as c
          join pg_catalog.pg_attribute as t on t.attrelid = c.oid, this
         where c.relnamespace = this.schema_oid
           and t.attnum > 0 and not t.attisdropped and t.attacl is not null
           and exists (select from pg_catalog.aclexplode(t.attacl) as a where a.grantee = 0)
        union all
        select 'default_privileges', d.what
          from (values ('f', 'EXECUTE on routines'), ('T', 'USAGE on types')) as d (kind, what),
               this
         where not exists (
             select
               from pg_catalog.pg_default_acl as da
              where da.defaclrole = this.owner_oid
                and da.defaclnamespace = 0
                and da.defaclobjtype = d.kind::"char"
                and not exists (
                    select from pg_catalog.aclexplode(da.defaclacl) as a where a.grantee = 0
                )
         )
        union all
        select 'owner', p.oid::regprocedure::text
          from pg_catalog.pg_proc as p, this
         where p.pronamespace = this.schema_oid and p.proowner <> this.owner_oid
        union all
        select 'owner', c.oid::regclass::text
          from pg_catalog.pg_class as c, this
         where c.relnamespace = this.schema_oid and c.relowner <> this.owner_oid
        union all
        select 'owner', t.oid::regtype::text
          from pg_catalog.pg_type as t, this
         where t.typnamespace = this.schema_oid and t.typowner <> this.owner_oid
        union all
        select distinct 'role_membership', a.role_name || ' is a member of ' || r.role_name
               || case when o.via = '{}' then ''
                       else ' through ' || pg_catalog.array_to_string(o.via, ' and ') end
          from member_of as o
          join bound as a on a.role_oid = o.member_oid
          join bound as r on r.role_oid = o.role_oid
        union all
        select 'grants', d.what from awa._grant_drift() as d
    ),
    named (rule, n, first_ten) as (
        select o.rule, count(*), (array_agg(o.what order by o.what))[1:10]
          from offender as o
         group by o.rule
    )
    select r.rule,
           r.message || ': ' || array_to_string(named.first_ten, ', ')
           || case when named.n > 10 then pg_catalog.format(' and %s more', named.n - 10)
                   else '' end,
           r.hint
      from named
      join (
          values
          (1, 'search_path', 'SECURITY DEFINER functions without a pinned search_path',
           'Add SET search_path = pg_catalog, pg_temp to each.'),
          (2, 'public_execute', 'routines executable by PUBLIC',
           'Every routine needs its awa._grant_execute line.'),
          (3, 'schema_grants', 'schema awa''s grants differ from the bootstrap''s',
           'Runtime roles need USAGE on schema awa; PUBLIC and every other role need '
           'nothing: awa migrate revokes the rest.'),
          (4, 'public_relations', 'relations or columns PUBLIC may use',
           'The layer revokes everything on schema awa''s relations from PUBLIC.'),
          (5, 'default_privileges', 'the owner''s default privileges give PUBLIC',
           'The bootstrap revokes them with ALTER DEFAULT PRIVILEGES FOR ROLE.'),
          (6, 'owner', pg_catalog.format(
              'objects in schema awa not owned by %s',
              (select this.owner_oid::regrole from this)
           ),
           'Only a superuser or their owner can give them to the owner role.'),
          (7, 'role_membership', 'bound roles granted to one another',
           pg_catalog.format(
               'REVOKE each such grant as the role that granted it (or with GRANTED BY): '
               'awa migrate, which runs as the owner, cannot. A login that needs two '
               'capabilities gets both roles (GRANT %I, %I TO app), never one role '
               'granted to another.', awa._role_for('producer'), awa._role_for('worker'))),
          (8, 'grants', 'grants on schema awa''s objects differ from the layer''s',
           pg_catalog.format(
               'awa migrate applies the layer''s grants again and revokes the others; give a '
               'login a bound role (GRANT %I TO app), not privileges on awa''s objects.',
               awa._role_for('producer')))
      ) as r (ord, rule, message, hint) on r.rule = named.rule
     order by r.ord;
$$;

-- Function: awa._assert_security() returns void
-- Raises AW001 with every broken invariant of awa._security_violations(),
-- so the migration transaction rolls back.
-- Calls: awa._security_violations
-- Writes: nothing
create or replace function awa._assert_security()
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    found text;
    first_hint text;
begin
    select string_agg(v.message, '; ' order by v.n), (array_agg(v.hint order by v.n))[1]
      into found, first_hint
      from awa._security_violations() with ordinality as v (rule, message, hint, n);
    if found is not null then
        raise exception '%', found
            using errcode = 'AW001',
                  hint = first_hint;
    end if;
end;
$$;

-- The layer grants from nothing: each file's grant lines below and after
-- this one are every privilege on the schema's objects when it commits.
-- In a subtransaction (a block that catches, to raise again): a revoke
-- rewrites its routine's pg_proc row, and written by the layer's own
-- transaction the row of an earlier layer's granted routine would pass for
-- one this layer made, which the sweep at the layer's end keeps.
do $revoke$
begin
    perform awa._revoke_grants();
exception when others then
    raise;
end
$revoke$;

select awa._grant_execute('awa._sticky(integer)');
select awa._grant_execute('awa._spread(integer, integer, integer)');
select awa._grant_execute('awa._in_turn(integer, integer)');
select awa._grant_execute('awa._lock_class_lane()');
select awa._grant_execute('awa._lock_class_provisioning()');
select awa._grant_execute('awa._lock_class_copy()');
select awa._grant_execute('awa._lock_leader(text)');
select awa._grant_execute('awa._try_leader(text)');
select awa._grant_execute('awa._lock_class_migrate()');
select awa._grant_execute('awa._check_read_committed(text)');
select awa._grant_execute('awa._check_run_owner(text, bigint, bigint)');
select awa._grant_execute('awa._check_capability(text, text, text)');
select awa._grant_execute('awa._check_no_run(text, bigint, bigint)');
select awa._grant_execute('awa._role_for(text)');
select awa._grant_execute('awa._grant_execute(regprocedure, text[])');
select awa._grant_execute('awa._grant_select(regclass, text[])');
select awa._grant_execute('awa._check_snapshot_current()');
select awa._grant_execute('awa._grant_insert(regclass, text[], text[])');
select awa._grant_execute('awa._ensure_trigger(regclass, text, text, boolean)');
select awa._grant_execute('awa._privilege_text(text, text, text)');
select awa._grant_execute('awa._grants_found()');
select awa._grant_execute('awa._schema_grants_extra()');
select awa._grant_execute('awa._revoke_grants()');
select awa._grant_execute('awa._record_grants()');
select awa._grant_execute('awa._grant_drift()');
select awa._grant_execute('awa._security_violations()');
select awa._grant_execute('awa._view_shape(regclass)');
select awa._grant_execute('awa._ensure_view(text, regclass)');
select awa._grant_execute('awa._assert_security()');
