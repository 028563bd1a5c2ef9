-- 0038_run_owner: a run belongs to the login that claimed it.
--
-- A run lease is a number from a sequence, and job ids are too: a worker
-- that knew its own (job_id, run_lease) could guess another login's and
-- complete, fail or heartbeat that job, and awa.run_outcome answered
-- 'running' for a right guess. The claim now records its session's login
-- (session_user: the login, whatever role it has set), and the calls that
-- take a lease act only on a run of the caller's login. A run claimed
-- before this migration has none, and any login holding its lease may end
-- it, as before. Added without a default: no rewrite of awa.running.

alter table awa.running add column claimed_by text;

comment on column awa.running.claimed_by is
'The login (session_user) whose claim started the run; only it may complete, fail or '
'heartbeat the run or ask its outcome. Null for a run claimed before migration 0038.';
