-- 0001_schema: the runner's own records, the role binding and per-queue settings.
--
-- Schema awa itself is created by the runner's bootstrap step, because its
-- owner's name is chosen at install time. Everything below runs as that owner.

create table awa.schema_migrations (
    version integer primary key,
    name text not null,
    checksum text not null,
    checksum_algorithm text not null,
    contract_version text not null,
    applied_at timestamptz not null default pg_catalog.now(),
    applied_by text not null default session_user,
    execution_ms numeric not null
);

comment on table awa.schema_migrations is
'Numbered migrations applied by awa migrate; immutable once applied.';
comment on column awa.schema_migrations.checksum is
'Digest of the migration file as applied; a different file is drift and is refused.';
comment on column awa.schema_migrations.checksum_algorithm is
'Name of the digest algorithm of checksum (sha256).';
comment on column awa.schema_migrations.contract_version is
'awa-sql package version that applied the migration.';
comment on column awa.schema_migrations.applied_by is
'Login (session_user) that ran the migration.';
comment on column awa.schema_migrations.execution_ms is
'Wall time of the migration transaction in milliseconds.';

create table awa.schema_functions (
    file text primary key,
    checksum text not null,
    checksum_algorithm text not null,
    contract_version text not null,
    applied_at timestamptz not null default pg_catalog.now(),
    applied_by text not null default session_user
);

comment on table awa.schema_functions is
'Files of the function layer (sql/) as last applied; a changed file is re-applied.';

create table awa.role_binding (
    capability text primary key,
    role_name name not null unique,
    constraint role_binding_capability_known check (
        capability in ('owner', 'producer', 'worker', 'maintenance', 'operator', 'reader')
    )
);

comment on table awa.role_binding is
'Which database role holds each capability; grants in the function layer follow it.';

create table awa.queue_meta (
    queue text primary key,
    enqueue_shards smallint not null default 1,
    constraint queue_meta_enqueue_shards_range check (enqueue_shards between 1 and 64)
);

comment on table awa.queue_meta is
'Per physical queue settings. Change them through awa functions, never by hand.';
comment on column awa.queue_meta.enqueue_shards is
'S: lanes per (queue, priority); 1 keeps strict FIFO, more gives partitioned FIFO.';
