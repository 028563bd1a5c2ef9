-- 0033_queue_drops: an empty queue is dropped in two steps (ADR 044).
--
-- awa.drop_queue(queue) renames the queue's settings row to a name no
-- enqueue or claim can look up ('#dropped#<queue_id>': '#' is refused in
-- every name a caller gives, and a stripe's name never starts with it),
-- pauses it, and records here the name, the pause state and the
-- transaction. awa.finish_drops() removes the queue later, once no session
-- can still route a job to it by the old name; a job that came late puts
-- the queue back instead. Its sequences are dropped later again, once no
-- snapshot can still read the rows that named them (awa.dropped_sequences).

alter table awa.queue_meta
add column dropped_name text,
add column dropped_paused boolean,
add column dropped_xact xid8,
add column dropped_at timestamptz,
add constraint queue_meta_dropped_whole check (
    (dropped_xact is null) = (dropped_name is null)
    and (dropped_xact is null) = (dropped_paused is null)
    and (dropped_xact is null) = (dropped_at is null)
);

comment on column awa.queue_meta.dropped_name is
'For a queue awa.drop_queue() dropped and awa.finish_drops() has not removed yet: the name '
'it had (the row is renamed to #dropped#<queue_id>); null otherwise.';
comment on column awa.queue_meta.dropped_paused is
'For a dropped queue: whether it was paused before the drop, restored if a job came late.';
comment on column awa.queue_meta.dropped_xact is
'For a dropped queue: the transaction that dropped it. A snapshot older than it may still '
'read the old name and route a job to the queue: awa.finish_drops() waits for none to be held.';
comment on column awa.queue_meta.dropped_at is
'For a dropped queue: when it was dropped.';

create index queue_meta_dropped_idx on awa.queue_meta (queue_id)
where dropped_xact is not null;

create table awa.dropped_sequences (
    seq regclass not null,
    removed_xact xid8 not null default pg_catalog.pg_current_xact_id(),
    constraint dropped_sequences_pkey primary key (seq)
);

comment on table awa.dropped_sequences is
'Sequences of queues awa.finish_drops() removed, in the transaction removed_xact, and not '
'dropped yet: a snapshot older than that transaction still reads the rows that name them '
'(a watch would fail to read a dropped one). A later call drops them once no session holds '
'such a snapshot.';
