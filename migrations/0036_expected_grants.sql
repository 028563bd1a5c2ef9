-- 0036_expected_grants: the grants the function layer made, kept so that a
-- grant made or revoked since is seen.
--
-- The security check saw grants lost wholesale (a restore with --no-acl)
-- and PUBLIC's, not one privilege granted to a runtime role by hand
-- (EXECUTE on an operator's function to the producer role) or one revoked
-- (EXECUTE on awa.enqueue from it). The layer now revokes every privilege
-- on the schema's objects before it grants its own, and records what it
-- granted here (awa._record_grants); awa._security_violations reports any
-- difference, which awa status exits 10 for and awa migrate repairs.
-- Written by the layer only, read by the owner only.

create table awa.expected_grants (
    on_what text not null,
    column_name text not null,
    privilege text not null,
    grantee text not null,
    primary key (on_what, column_name, privilege, grantee)
);

comment on table awa.expected_grants is
'Every privilege the function layer granted on schema awa''s routines, relations and columns, '
'as REVOKE names it (column_name empty for a whole object); rewritten by each layer apply. '
'awa status compares it with the catalog.';
