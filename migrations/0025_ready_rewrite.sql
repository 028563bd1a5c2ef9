-- 0025_ready_rewrite: where awa.compact_ready() holds the live rows of
-- awa.ready while it truncates the table (ADR 036).
--
-- While a snapshot is held open, every claimed job leaves a dead row in
-- awa.ready that no vacuum can remove; only a TRUNCATE removes rows
-- whatever snapshot is held. awa.compact_ready() copies the live rows here,
-- truncates awa.ready, copies them back and truncates this table, in one
-- transaction under awa.ready's ACCESS EXCLUSIVE lock: this table is empty
-- whenever no such transaction runs. Unlogged: its rows never outlive the
-- transaction that wrote them, so they need no WAL, and a crash leaves it
-- empty. No role but the owner reads or writes it. Its columns are
-- awa.ready's, in the same order; a migration that changes one changes the
-- other (tests/test_ready_compaction.py compares them).

create unlogged table awa.ready_rewrite (like awa.ready);

comment on table awa.ready_rewrite is
'The live rows of awa.ready while awa.compact_ready() truncates it (ADR 036); empty outside '
'that transaction. Its columns are awa.ready''s, in the same order.';
