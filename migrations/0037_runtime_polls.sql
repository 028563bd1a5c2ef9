-- 0037_runtime_polls: a worker's snapshot names the queues it polls.
--
-- A worker noted a queue only when a claim there returned a job, so one
-- polling an idle queue (a nightly queue, a worker just started) was listed
-- with no queue, missing from `awa runtimes --queue` and from the queue's
-- admin page, and a day without jobs made it forget the queue. Its snapshot
-- now carries a 'poll' activity for every queue it claims from, whatever
-- the claim returned. Constraints change in one statement: the table holds
-- only the live runtimes' rows.

alter table awa.runtime_queues
    drop constraint runtime_queues_activity_known,
    add constraint runtime_queues_activity_known
    check (activity in ('enqueue', 'claim', 'poll'));

comment on table awa.runtime_queues is
'Per runtime and physical queue: when it last enqueued there, claimed a job there or '
'polled it (a claim call, with or without a job), and the queue''s S at that moment.';
