-- 0020_ready_late: ready jobs that entered their lane with an older job id
-- (ADR 029).
--
-- Within a lane, a job enqueued there takes its job id after the lane's lock
-- and in lane_seq order, so those ids rise with lane_seq. A job moved into a
-- lane later (promoted from awa.scheduled, retried, rescued, or given its id
-- before the lane, as a unique key's holder is) keeps its older id: it is
-- recorded here by awa._insert_jobs, the one place such rows are written,
-- with the highest job id handed out when it entered (stamp). So for every
-- ready row, f = its stamp if recorded here, else its job id, never falls
-- as lane_seq rises and is never below the job id: awa.jobs finds where a
-- lane's jobs above a job id start by bisecting lane_seq on f, lists the
-- lane's other rows from there in lane_seq (so job id) order, and these
-- rows by job id. A row stays when its job leaves the lane (the claim does
-- not look here; a job moved in again gets a new row at its new place);
-- awa.prune_ready_late removes those. Keyed by place, as a lane_seq is
-- never handed out twice.

create table awa.ready_late (
    job_id bigint not null,
    queue_id integer not null,
    lane_id integer not null,
    lane_seq bigint not null,
    stamp bigint not null,
    constraint ready_late_pkey primary key (lane_id, lane_seq)
);

create index ready_late_queue_job_idx on awa.ready_late (queue_id, job_id);

comment on table awa.ready_late is
'Ready jobs that entered their lane with a job id older than the lane''s (promoted, retried, '
'rescued, unique-keyed): lane, lane_seq and the highest job id handed out then (stamp). '
'Written by awa._insert_jobs; rows whose job left the lane are removed by '
'awa.prune_ready_late. Read by awa.jobs (ADR 029).';

-- The rows already ready that entered with an older id are recorded by the
-- function layer's first apply after this migration (sql/jobs.sql), in the
-- transaction that makes awa._insert_jobs record new ones: the earlier
-- layer keeps moving jobs into lanes until then.
