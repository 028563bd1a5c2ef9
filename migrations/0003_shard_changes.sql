-- 0003_shard_changes: the audit trail of enqueue-shard changes.

create table awa.shard_changes (
    change_id bigint generated always as identity primary key,
    queue text not null,
    old_shards smallint not null,
    new_shards smallint not null,
    lanes_created integer not null,
    changed_by text not null default session_user,
    changed_at timestamptz not null default pg_catalog.now(),
    source text not null default 'manual',
    constraint shard_changes_source_known check (source in ('manual', 'auto'))
);

create index shard_changes_queue_changed_at_idx on awa.shard_changes (queue, changed_at);

comment on table awa.shard_changes is
'Every change of a physical queue''s enqueue_shards, by whom (the login), when, '
'and whether an operator (manual) or the auto-scaler (auto) made it.';
