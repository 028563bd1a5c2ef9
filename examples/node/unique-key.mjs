// The unique key of a job from its kind and args, as awa_sql.unique_key
// computes it in Python (docs/sql-api.md, "Unique jobs"):
//   SHA-256("awa-unique-v1" 0x00 kind 0x00 canonical JSON of args)
// Run: node unique-key.mjs KIND 'ARGS-JSON'   (prints the key in hex)
import { createHash } from "node:crypto";

// Object keys sorted by code point at every level, no whitespace.
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const byCodePoint = (a, b) => {
      const x = Array.from(a, (c) => c.codePointAt(0));
      const y = Array.from(b, (c) => c.codePointAt(0));
      for (let i = 0; i < Math.min(x.length, y.length); i++) {
        if (x[i] !== y[i]) return x[i] - y[i];
      }
      return x.length - y.length;
    };
    const keys = Object.keys(value).sort(byCodePoint);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

export function uniqueKey(kind, args = {}) {
  return createHash("sha256")
    .update("awa-unique-v1\0", "utf8")
    .update(`${kind}\0`, "utf8")
    .update(canonical(args), "utf8")
    .digest();
}

if (import.meta.url === `file://${process.argv[1]}`) {
  console.log(uniqueKey(process.argv[2], JSON.parse(process.argv[3] ?? "{}")).toString("hex"));
}
