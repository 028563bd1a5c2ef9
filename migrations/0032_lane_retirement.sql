-- 0032_lane_retirement: lanes above S leave the claim walk once drained (ADR 041).
--
-- Lanes are never dropped. After S is lowered, the lanes at or above it
-- drain, and every claim kept walking them, empty, for good: a queue once
-- raised to S = 64 by the auto-scaler paid for 64 lanes per priority at
-- every claim ever after. awa.retire_lanes() lowers queue_meta.lane_shards,
-- the shards a claim walks, past the lanes at or above S that are empty and
-- that no enqueue can reach any more: none holds their locks, and no
-- session keeps a snapshot older than the last change of S, which this
-- column records. The rows that exist now get this migration's
-- transaction: every snapshot older than an earlier change is older than it.

alter table awa.queue_meta
add column shards_changed_xact xid8 not null default pg_catalog.pg_current_xact_id();

comment on column awa.queue_meta.shards_changed_xact is
'The transaction that last changed enqueue_shards (or created the queue). A snapshot older '
'than it may still read the S before, and route a job to a lane at or above the S now: '
'awa.retire_lanes() retires no lane while a session holds one.';

comment on column awa.queue_meta.lane_shards is
'How many shards a claim walks (with enqueue_shards, whichever is greater): the lanes of '
'shards 0 .. lane_shards - 1 at every priority. Lanes are never dropped; raising S counts '
'them all again (awa._provision_lanes), and awa.retire_lanes() lowers it past the lanes at '
'or above S that are empty and that no enqueue can reach any more.';
