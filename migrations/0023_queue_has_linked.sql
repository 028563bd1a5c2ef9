-- 0023_queue_has_linked: a queue's row says whether other queues link to it (ADR 033).
--
-- A claim by a queue's name reaches the queue, its stripes and its
-- partitions: every row whose logical_queue or root_queue is that name. A
-- claim by one name of a queue nothing links to, the usual call, reads that
-- one row by name and carries it into its walk as parameters, which costs a
-- sixth less than reading queue_meta inside the walk. has_linked tells the
-- two apart. It is set by the function layer (awa._count_linked), when a
-- link is made and at every apply, so links an older layer makes while
-- this migration and the next layer are applied are counted too; until it
-- is set the older layer's claim, which reads queue_meta inside its walk,
-- is the one running.
--
-- A constant default: the column is added without rewriting the table, under
-- an ACCESS EXCLUSIVE lock held for an instant (it waits for enqueues and
-- claims in flight, bounded by --lock-timeout).

alter table awa.queue_meta add column has_linked boolean not null default false;

comment on column awa.queue_meta.has_linked is
'True once another queue (a stripe, a partition) links to this one by logical_queue or '
'root_queue: a claim by this name reads them too. Set by awa._count_linked; never cleared, '
'since a link is never removed.';
