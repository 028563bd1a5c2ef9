-- 0028_autoscale_reads: the auto-scaler's log read by index, and its
-- decisions counted as they are made.
--
-- Each tick looked for a shadow queue's last would-be step with a scan of
-- the whole log (kept 24 hours, every queue's); the partial index below
-- finds it at the top of the queue's steps. Every metrics scrape counted
-- the log by queue and action, a read of all of it; it now reads
-- awa.autoscale_decision_counts, one row per queue and action, which
-- awa._autoscale_decide adds to as it logs. It starts from the log as it
-- is; decisions pruned before this migration are not in it.

create index autoscale_decisions_queue_steps_idx
    on awa.autoscale_decisions (queue, decided_at)
    where action in ('would_raise', 'would_lower');

create table awa.autoscale_decision_counts (
    queue text not null,
    action text not null,
    decisions bigint not null,
    constraint autoscale_decision_counts_pkey primary key (queue, action)
);

insert into awa.autoscale_decision_counts (queue, action, decisions)
select d.queue, d.action, sum(d.repeats) as decisions
  from awa.autoscale_decisions as d
 group by d.queue, d.action;

comment on table awa.autoscale_decision_counts is
'Per queue and action: how many decisions the auto-scaler has made, each tick of a folded '
'run of holds counted, pruned or not. The metrics exporter reads it instead of the log.';
