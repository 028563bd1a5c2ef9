-- 0034_maintenance_runs: when each maintenance task last ran, as the
-- database saw it (ADR 045).
--
-- Whether maintenance runs was known only to the process that ran it: awa
-- maintain exports its passes on its own /metrics. Maintenance run by
-- pg_cron, by Worker(maintain=True) in a process nobody scrapes, or by a
-- runner in another language left nothing to alert on, and an alert on
-- awa maintain's series fired for good where pg_cron does the work. Each
-- maintenance function now records the time of its call here, in its own
-- transaction (a call that rolls back records nothing), and the database
-- exporter reads it. The rows start at this migration's time, so that a
-- database where nothing runs them shows it from the start.

create table awa.maintenance_runs (
    name text primary key,
    last_at timestamptz not null,
    constraint maintenance_runs_name_shape check (name ~ '^[a-z][a-z_]{0,39}$')
) with (fillfactor = 50);

insert into awa.maintenance_runs (name, last_at)
select t.name, pg_catalog.now() as last_at
  from pg_catalog.unnest(array[
      'promote', 'rescue', 'move_staged', 'autoscale', 'prune', 'carry', 'running_slots',
      'lane_hints', 'ready_rewrite', 'unique_keys', 'ready_late', 'retire_lanes', 'drops',
      'shard_changes'
  ]) as t (name);

comment on table awa.maintenance_runs is
'When each maintenance task (named as awa maintain names its passes) last ran and committed, '
'within about 5 seconds: each maintenance function records its call (awa._note_run). '
'Exported as awa_maintenance_last_run_timestamp_seconds; read by awa_reader and awa_operator.';
