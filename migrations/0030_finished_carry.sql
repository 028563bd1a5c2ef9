-- 0030_finished_carry: where the carry of a slot of awa.finished has got to.
--
-- A queue that keeps terminal jobs longer than a ring round has them carried
-- forward: when a slot is the next its ring will write, the rows still
-- within their retention are copied into the current slot, then the slot is
-- truncated (ADR 024). That copy was one statement under the slot's lock: a
-- slot of a few million retained rows (an hour of a queue completing 1,000
-- jobs a second and keeping them two days) ran past awa maintain's
-- statement timeout, and the prune, rolled back whole, emptied no slot at
-- all from then on. The carry now moves the rows in bounded batches through
-- the hours the slot is next (ADR 040); this table keeps, per slot, the
-- period it is carried in and the heap position its batches have reached,
-- so that each batch reads only what the one before it did not.

create table awa.finished_carry (
    slot smallint primary key,
    period bigint not null,
    next_tid tid not null,
    constraint finished_carry_slot_range check (slot between 0 and 63)
);

comment on table awa.finished_carry is
'Per slot of awa.finished being carried (ADR 040): the period of its ring it is carried in, '
'and next_tid, the heap position below which its batches have moved every retained row. '
'Written by awa.prune_finished and awa.carry_finished only.';
