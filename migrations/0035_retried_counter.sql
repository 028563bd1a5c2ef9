-- 0035_retried_counter: a per-queue counter of failed attempts that were
-- scheduled again.
--
-- The database counted jobs failed for good, not the attempts before: a job
-- that fails every attempt is retried for hours (25 attempts, backoff up to
-- an hour) before its queue's failed counter moves, and only the Python
-- worker's own metrics saw the attempts. Every failed attempt that is
-- retried (awa.fail, or awa.rescue_expired for a lease or deadline that
-- ran out) now moves this sequence, whatever language the worker is
-- written in. The function layer gives each queue its sequence; it starts
-- at 0.

alter table awa.queue_meta add column retried_seq regclass;

comment on column awa.queue_meta.retried_seq is
'Counter of the queue''s failed attempts scheduled for a retry (a sequence; see '
'awa.queue_overview).';
