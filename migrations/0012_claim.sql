-- 0012_claim: where each lane's claimable rows start (ADR 012).
--
-- Claimers delete from the head of every lane, so between vacuums a lane's
-- primary key starts with dead entries; a scan from the lane's first key
-- walks all of them. awa.lane_heads remembers, per lane, a lane_seq below
-- which every row is gone for good, and a claim starts there. It is only a
-- hint: a missing row means "start at the beginning", so the table needs no
-- WAL and may be empty after a crash.

create unlogged table awa.lane_heads (
    lane_id integer primary key,
    head_seq bigint not null
) with (fillfactor = 50);

comment on table awa.lane_heads is
'Claim hint per lane: every row of the lane below head_seq is gone for good, so claims '
'start their scan there. Written by awa.claim; a missing row means lane_seq 0.';
