-- 0021_finished_unchecked: awa.finished without CHECK constraints (ADR 030).
--
-- Every insert into awa.finished is routed to a partition, and the executor
-- builds the partition's result relation afresh for each statement: its
-- CHECK constraints are read back from their stored text and compiled each
-- time, some 80,000 instructions of every completed job. Both rules stay
-- held without them: a slot outside 0-63 has no partition (LIST partitions,
-- no default), so the insert fails; the state is written only by
-- awa.complete ('completed'), awa._finish (which refuses anything but
-- 'failed' and 'cancelled') and awa.prune_finished (a copy of a row).

alter table awa.finished drop constraint finished_slot_range;
alter table awa.finished drop constraint finished_state_known;
