-- 0022_lane_hints: claim hints that are inserted, never updated (ADR 030).
--
-- awa.lane_heads kept one row per lane, updated each time its lane's hint
-- moved. While any snapshot older than those updates is open (a long
-- report, a forgotten BEGIN, a standby with hot_standby_feedback), no
-- version can be removed, and every claim that reads the hint walks all of
-- them: after ten minutes of one held snapshot a claim read thousands of
-- versions per lane and workers ran at two thirds of their first minute.
-- awa.lane_hints holds a lane's hints as rows of their own: a claim reads
-- the highest one, from the top of the index, and the rows below it (kept
-- or gone) are never read. Moving a hint locks the row it was read at
-- (skipping it if another claim holds it, as before), deletes it and
-- inserts the new one.
--
-- Unlogged like awa.lane_heads: a hint is only a hint (a lane with no row
-- starts at lane_seq 0), so it needs no WAL and may be empty after a crash.
-- The hints awa.lane_heads holds now are copied: every row of a lane below
-- its hint is gone for good, so an older hint stays true. awa.lane_heads is
-- left to the function layer that runs until this upgrade's layer is
-- applied, and is no longer read after that.

create unlogged table awa.lane_hints (
    lane_id integer not null,
    head_seq bigint not null
);

create index lane_hints_lane_idx on awa.lane_hints (lane_id, head_seq);

insert into awa.lane_hints (lane_id, head_seq)
select h.lane_id, h.head_seq from awa.lane_heads as h;

comment on table awa.lane_hints is
'Claim hints: every row of lane lane_id below its highest head_seq is gone for good, so '
'claims start their scan there. Inserted by awa.claim, which deletes the hint it moves up '
'from; never updated. A lane with no row starts at lane_seq 0 (ADR 030).';

comment on table awa.lane_heads is
'Retired by migration 0022 (awa.lane_hints): written only by a function layer older than it.';
