-- 0007_contention_samples: the lane-contention signal, measured in the
-- database so that it covers every producer, ours or not.

create table awa.contention_samples (
    sampled_at timestamptz not null default pg_catalog.clock_timestamp(),
    queue_id integer not null,
    lanes integer not null,
    lanes_held integer not null,
    lanes_waited integer not null,
    waiters integer not null,
    enqueued bigint not null,
    constraint contention_samples_pkey primary key (queue_id, sampled_at)
);

comment on table awa.contention_samples is
'One row per queue per awa.sample_lane_contention() call: lanes held and waited for, '
'backends waiting for a lane lock, and the sum of the lanes'' sequences (enqueues so far).';
comment on column awa.contention_samples.waiters is
'Backends waiting (ungranted) for one of the queue''s lane locks at the sample.';
comment on column awa.contention_samples.enqueued is
'Sum of the lane sequences of the queue: the difference between two samples is the '
'number of enqueues between them (rolled-back reservations included).';
