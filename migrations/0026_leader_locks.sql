-- 0026_leader_locks: the locks that let one caller at a time do a piece of
-- work, as rows only the owner can lock (ADR 037).
--
-- Creating queues and lanes, the auto-scaler's tick, the prune of
-- awa.finished, the rotation of awa.running and each pass of awa maintain
-- took an advisory lock of the package's own class. Any role can take an
-- advisory lock of any key: a producer that held one at session level
-- stalled every change of S and every new queue, or switched the
-- auto-scaler or a maintenance pass off, for as long as its session lived.
-- Locking a row needs UPDATE on its table, which only the owner has.
-- awa._lock_leader and awa._try_leader (sql/private.sql) take these rows;
-- awa.try_pass_lock adds awa maintain's, named 'pass.' and the task.

create table awa.leader_locks (
    name text primary key,
    constraint leader_locks_name_shape check (name ~ '^[a-z][a-z_.]{0,62}$')
);

insert into awa.leader_locks (name)
values ('provisioning'), ('autoscale'), ('prune'), ('running');

comment on table awa.leader_locks is
'One row per leader lock: a caller that locks the row FOR UPDATE does that work alone until '
'it commits (ADR 037). Only the owner can lock them: no runtime role may take or hold one.';
