-- 0041_promote_lock: the leader lock of the promote pass exists from the
-- install.
--
-- awa.promote_due now runs one call at a time under the pass lock
-- 'pass.promote', which awa maintain's promote pass takes too: two calls
-- side by side, each skipping the other's rows, could put one ordering
-- key's later job into its lane before an earlier one the other call held
-- while it waited for a lane. awa.try_pass_lock makes a pass's row on its
-- first use; a row made by a call's own insert would make two first calls
-- wait for each other, and a repeatable-read caller fail (40001) on a row
-- made since its snapshot. No lock beyond the row's.

insert into awa.leader_locks (name) values ('pass.promote') on conflict do nothing;
