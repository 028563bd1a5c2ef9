-- 0039_scheduled_rewrite: where awa.compact_scheduled() holds the live rows
-- of awa.scheduled while it truncates the table (ADR 047), and the record
-- of its runs.
--
-- While a snapshot is held open, every job promoted from awa.scheduled (and
-- every job for later cancelled) leaves a dead row there that no vacuum can
-- remove, and awa.promote_due and awa.queue_overview walk them all; only a
-- TRUNCATE removes rows whatever snapshot is held. awa.compact_scheduled()
-- copies the live rows here, truncates awa.scheduled, copies them back and
-- truncates this table, in one transaction under awa.scheduled's ACCESS
-- EXCLUSIVE lock: this table is empty whenever no such transaction runs.
-- Unlogged: its rows never outlive the transaction that wrote them, so they
-- need no WAL, and a crash leaves it empty. No role but the owner reads or
-- writes it. Its columns are awa.scheduled's, in the same order, and it has
-- no constraint but their NOT NULLs (no key to check, no reference to
-- awa.queue_meta to hold its rows' queues); a migration that changes
-- awa.scheduled's columns changes these too
-- (tests/test_scheduled_compaction.py compares them).

create unlogged table awa.scheduled_rewrite (like awa.scheduled);

comment on table awa.scheduled_rewrite is
'The live rows of awa.scheduled while awa.compact_scheduled() truncates it (ADR 047); empty '
'outside that transaction. Its columns are awa.scheduled''s, in the same order.';

-- The pass's row of the record of maintenance runs (ADR 045), from now, as
-- migration 0034 started the others: awa._note_run updates a task's row, it
-- adds none.
insert into awa.maintenance_runs (name, last_at)
values ('scheduled_rewrite', pg_catalog.now());
