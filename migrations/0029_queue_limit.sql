-- 0029_queue_limit: a cap on the number of physical queues.
--
-- An enqueue to a name no queue has creates that queue: its settings row,
-- four lanes and seven sequences (one per lane, three counters), each a
-- relation with a file of its own. A producer that takes queue names from
-- its input (an id, a tenant, a typo in a loop) created them without end.
-- Past awa.queue_limit.max_queues physical queues (partitions and stripes
-- count), creating one more is refused with 53400; an operator raises the
-- cap with awa.set_max_queues. One row, which also counts the queues: each
-- creation adds one to it, an UPDATE, so that a creation in a repeatable
-- read transaction whose snapshot misses another's fails to serialize
-- (40001) rather than count too few. An installation that already has
-- more than 5,000 queues gets twice what it has (at most 1,000,000), so
-- that the upgrade refuses no queue it would have made the day before.

create table awa.queue_limit (
    singleton boolean primary key default true,
    max_queues integer not null,
    queues bigint not null,
    constraint queue_limit_singleton check (singleton),
    constraint queue_limit_range check (max_queues between 1 and 1000000)
);

insert into awa.queue_limit (max_queues, queues)
select least(greatest(10000, 2 * pg_catalog.count(*)), 1000000) as max_queues,
       pg_catalog.count(*) as queues
  from awa.queue_meta;

comment on table awa.queue_limit is
'One row: max_queues, the most physical queues (partitions and stripes count) that may exist, '
'and queues, how many do. Creating a queue past it is refused (53400). Set by awa.set_max_queues.';
