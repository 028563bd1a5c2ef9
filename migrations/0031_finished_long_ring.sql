-- 0031_finished_long_ring: a third ring of awa.finished for jobs kept long.
--
-- A job kept longer than its ring's round was copied forward at every
-- round: a completed job kept 30 days some 23 times (ADR 040). Slots 64-95
-- are a ring of day-wide slots, 32 days round: a carry moves a job kept
-- past its own ring's next round there, where it is copied again once a
-- month at most (awa._carried_slot).

do $$
begin
    for s in 64..95 loop
        execute format(
            'create table awa.%I partition of awa.finished for values in (%s)',
            'finished_' || lpad(s::text, 2, '0'), s
        );
    end loop;
end;
$$;

alter table awa.finished_carry drop constraint finished_carry_slot_range;
alter table awa.finished_carry add constraint finished_carry_slot_range
check (slot between 0 and 95);

comment on column awa.finished.slot is
'The slot the row was written in (awa._finished_slot, awa._carried_slot): 0-31 completed, '
'one per hour; 32-63 failed and cancelled, one per 6 hours; 64-95 jobs a carry found kept '
'past their ring''s next round, one per day.';
