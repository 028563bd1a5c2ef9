-- A producer and an operator in plain psql: run from examples/psql (the
-- \copy below reads jobs.csv from the current directory) with
--   psql -X -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -f producer.sql
-- as a login granted awa_producer and awa_operator. Everything is a call to
-- a function in schema awa; nothing here is specific to psql but \copy.

-- One job, unkeyed, then one with an ordering key.
select * from awa.enqueue('psql-example'::text, 'send_welcome'::text, '{"user": 42}'::jsonb);
select *
from awa.enqueue(
    'psql-example'::text, 'charge'::text, '{"order": 1001}'::jsonb,
    ordering_key => convert_to('customer-42', 'UTF8')
);

-- A unique job: while it is live, a second enqueue of its key inserts
-- nothing and returns it, with duplicate true.
select job_id, duplicate
from awa.enqueue(
    'psql-example'::text, 'invoice.send'::text, '{"invoice": 7}'::jsonb,
    unique_key => convert_to('invoice-7', 'UTF8')
);
select job_id, duplicate
from awa.enqueue(
    'psql-example'::text, 'invoice.send'::text, '{"invoice": 7}'::jsonb,
    unique_key => convert_to('invoice-7', 'UTF8')
);

-- Four shards for the queue: partitioned FIFO from this commit on.
select * from awa.set_enqueue_shards('psql-example', 4);

-- A batch: one array per column.
select *
from awa.enqueue_batch(
    array['psql-example', 'psql-example', 'psql-example'],
    array['send', 'send', 'charge'],
    args => array['{"u": 1}', '{"u": 2}', '{"o": 7}']::jsonb [],
    ordering_keys => array[null, null, convert_to('customer-42', 'UTF8')]
);

-- COPY: stage rows, then enqueue them, in one transaction.
begin;
\copy awa.copy_staging (queue, priority, ordering_key, kind, args, run_at, max_attempts) from 'jobs.csv' with (format csv, header true)
select awa.enqueue_copied() as copied;
commit;
