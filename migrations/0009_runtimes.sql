-- 0009_runtimes: snapshots of the Python producers and workers, and the lane
-- positions at every shard change (evidence that every producer uses S).

create table awa.runtimes (
    instance_id uuid primary key,
    kind text not null,
    hostname text not null,
    pid integer not null,
    version text not null,
    in_flight integer not null default 0,
    owner_login text not null default session_user,
    started_at timestamptz not null default pg_catalog.now(),
    last_seen timestamptz not null default pg_catalog.now(),
    constraint runtimes_kind_known check (kind in ('producer', 'worker'))
);

comment on table awa.runtimes is
'One row per running Python Producer or Worker, refreshed every 10 s by '
'awa.publish_runtime(); rows not refreshed for 30 s are stale and removed.';

create table awa.runtime_queues (
    instance_id uuid not null references awa.runtimes (instance_id) on delete cascade,
    queue text not null,
    activity text not null,
    last_at timestamptz not null,
    shards smallint,
    constraint runtime_queues_pkey primary key (instance_id, queue, activity),
    constraint runtime_queues_activity_known check (activity in ('enqueue', 'claim'))
);

comment on table awa.runtime_queues is
'Per runtime and physical queue: when it last enqueued or claimed there, and the '
'queue''s S at that moment.';

create table awa.shard_change_lanes (
    change_id bigint not null references awa.shard_changes (change_id) on delete cascade,
    lane_id integer not null,
    shard smallint not null,
    seq_at_change bigint not null,
    constraint shard_change_lanes_pkey primary key (change_id, lane_id)
);

comment on table awa.shard_change_lanes is
'The sequence position of every lane of a queue when its S changed: enqueues since '
'the change per lane are the lane''s sequence now minus this.';
