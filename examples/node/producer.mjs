// A Node.js producer for awa-sql, with the `pg` package only (plus
// pg-copy-streams for COPY). Run, in examples/node after `npm install` (which
// `make dev` does), as a login granted awa_producer:
//   DATABASE_URL=postgresql://app_web@db/app node producer.mjs
import pg from "pg";
import { from as copyFrom } from "pg-copy-streams";
import { pipeline } from "node:stream/promises";
import { Readable } from "node:stream";
import { uniqueKey } from "./unique-key.mjs";

const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
await client.connect();
const queue = process.env.AWA_QUEUE ?? "node-example";

// Keyed jobs: one customer's jobs keep their order.
for (let i = 0; i < 10; i++) {
  const { rows } = await client.query(
    "select * from awa.enqueue($1::text, $2::text, $3::jsonb, ordering_key => $4::bytea)",
    [queue, "charge", { i }, Buffer.from(`customer-${i % 3}`)],
  );
  console.log("enqueued", rows[0].job_id, "shard", rows[0].enqueue_shard);
}

// A unique job: while it is live, a second enqueue of its key inserts
// nothing and returns it, with duplicate true.
const key = uniqueKey("invoice.send", { invoice: 7 });
for (let n = 0; n < 2; n++) {
  const { rows } = await client.query(
    "select job_id, duplicate from awa.enqueue($1::text, $2::text, $3::jsonb, unique_key => $4::bytea)",
    [queue, "invoice.send", { invoice: 7 }, key],
  );
  console.log("unique", rows[0].job_id, "duplicate", rows[0].duplicate);
}

// A batch call with typed arrays.
const batch = await client.query(
  "select * from awa.enqueue_batch($1::text[], $2::text[], $3::jsonb[])",
  [[queue, queue], ["send", "send"], [JSON.stringify({ u: 1 }), JSON.stringify({ u: 2 })]],
);
console.log("batch", batch.rows.map((r) => r.job_id).join(","));

// COPY, then enqueue the staged rows, in one transaction.
await client.query("begin");
const lines = [];
for (let n = 0; n < 100; n++) {
  const key = n % 2 ? `\\\\x${Buffer.from(`k${n % 5}`).toString("hex")}` : "\\N";
  lines.push(`${queue}\t\\N\t${key}\tcopy.job\t{"n": ${n}}\t\\N\t\\N\n`);
}
await pipeline(
  Readable.from(lines),
  client.query(copyFrom(
    "copy awa.copy_staging (queue, priority, ordering_key, kind, args, run_at, max_attempts) from stdin",
  )),
);
const copied = await client.query("select awa.enqueue_copied() as n");
await client.query("commit");
console.log("copied", copied.rows[0].n);
await client.end();
