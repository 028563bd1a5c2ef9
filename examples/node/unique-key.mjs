// The unique key of a job from its kind and args, as awa_sql.unique_key
// computes it in Python (docs/sql-api.md, "Unique jobs"):
//   SHA-256("awa-unique-v1" 0x00 kind 0x00 canonical JSON of args)
// Run: node unique-key.mjs KIND 'ARGS-JSON'   (prints the key in hex)
import { createHash } from "node:crypto";

// A lone surrogate is not text: UTF-8 cannot encode it (Node would hash
// U+FFFD in its place, where Python refuses it) and PostgreSQL cannot store it.
// With the u flag, a surrogate pair is one code point and does not match.
const LONE_SURROGATE = /[\uD800-\uDFFF]/u;

function text(value, where) {
  if (LONE_SURROGATE.test(value)) {
    throw new Error(`${where} holds a lone surrogate: it is not text, which UTF-8 cannot`
      + " encode nor PostgreSQL store");
  }
  return value;
}

// Object keys sorted by code point at every level, no whitespace.
function canonical(value, where) {
  if (typeof value === "string") return JSON.stringify(text(value, where));
  if (Array.isArray(value)) {
    return `[${value.map((v, i) => canonical(v, `${where}[${i}]`)).join(",")}]`;
  }
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
    return `{${keys.map((k) => {
      const key = JSON.stringify(text(k, `the key ${JSON.stringify(k)} of ${where}`));
      return `${key}:${canonical(value[k], `${where}[${JSON.stringify(k)}]`)}`;
    }).join(",")}}`;
  }
  return JSON.stringify(value);
}

// Null or absent args are {}, as in Python.
export function uniqueKey(kind, args) {
  if (typeof kind !== "string" || kind === "") {
    throw new Error(`kind must be a non-empty string, got ${JSON.stringify(kind)}`);
  }
  return createHash("sha256")
    .update("awa-unique-v1\0", "utf8")
    .update(`${text(kind, "kind")}\0`, "utf8")
    .update(canonical(args ?? {}, "args"), "utf8")
    .digest();
}

if (import.meta.url === `file://${process.argv[1]}`) {
  console.log(uniqueKey(process.argv[2], JSON.parse(process.argv[3] ?? "{}")).toString("hex"));
}
