"""The non-Python producers in examples/ run against the test servers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.support.jobs import claim_all

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_psql_example(db):
    login = db.login_role("awa_producer", "awa_operator")
    result = subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", db.dsn(login), "-f", "producer.sql"],
        cwd=EXAMPLES / "psql", capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "copied" in result.stdout
    with db.connect(db.login_role("awa_worker")) as w:
        jobs = claim_all(w, ["psql-example"])
    assert sorted(c[6] for c in jobs) == sorted(
        ["send_welcome", "charge", "invoice.send", "send", "send", "charge", "copy.job",
         "copy.job", "copy.job"])
    # The unique job's second enqueue: the first job's id, duplicate true.
    first, again = re.findall(r"^\s*(\d+) \| ([tf])\s*$", result.stdout, re.MULTILINE)
    assert first[1] == "f" and again == (first[0], "t")
    keyed = [c for c in jobs if c[10] == b"customer-42"]
    assert len(keyed) == 3  # the single enqueue, the batch row and the COPY row


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_node_example(db):
    node_dir = EXAMPLES / "node"
    assert (node_dir / "node_modules" / "pg").exists(), "run `make dev` (npm install)"
    login = db.login_role("awa_producer")
    info = psycopg.conninfo.conninfo_to_dict(db.dsn(login))
    url = (f"postgresql://{quote(info['user'])}:{quote(info.get('password', ''))}"
           f"@{info['host']}:{info['port']}/{quote(info['dbname'])}")
    env = {**os.environ, "DATABASE_URL": url, "AWA_QUEUE": "node-example"}
    result = subprocess.run(["node", "producer.mjs"], cwd=node_dir, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "copied 100" in result.stdout
    unique = [line.split() for line in result.stdout.splitlines() if line.startswith("unique")]
    assert [u[3] for u in unique] == ["false", "true"] and unique[0][1] == unique[1][1]
    with db.connect(db.login_role("awa_worker")) as w:
        jobs = claim_all(w, ["node-example"], 50)
    assert len(jobs) == 10 + 1 + 2 + 100
    charges = [c for c in jobs if c[6] == "charge"]
    for i in range(3):
        mine = [c[7]["i"] for c in charges if c[10] == f"customer-{i}".encode()]
        assert mine == sorted(mine) and mine


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.parametrize("args", [
    {}, None, {"to": "a@b", "n": 1}, {"b": [1, "two", None, True, {"z": 0, "a": -5}], "a": "x"},
    {"é": "ü", "e": "\u2028 \"quoted\" \\ \n\t\u0001", "Z": "upper first"},
    {"😀": 1, "\uffff": 2},
])
def test_the_node_unique_key_is_the_python_one(args):
    """docs/sql-api.md's recipe, in examples/node/unique-key.mjs, gives the key
    awa_sql.unique_key gives."""
    import json

    from awa_sql import unique_key

    result = subprocess.run(["node", "unique-key.mjs", "email.send", json.dumps(args)],
                            cwd=EXAMPLES / "node", capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == unique_key("email.send", args).hex()


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_node_unique_key_refuses_a_lone_surrogate_as_python_does():
    """Node hashed U+FFFD in a lone surrogate's place, where Python raised;
    both refuse it now. A surrogate pair is one character, and hashes."""
    from awa_sql import unique_key

    script = """
import { uniqueKey } from "./unique-key.mjs";
const cases = [["k\\ud800", {}], ["k", { to: "a\\udc00" }], ["k", { "\\ud800x": 1 }],
               ["k", { l: [1, { z: "\\udfff" }] }], ["k", { pair: "\\ud83d\\ude00" }]];
for (const [kind, args] of cases) {
  try { console.log(uniqueKey(kind, args).toString("hex")); } catch (e) { console.log(e.message); }
}
"""
    result = subprocess.run(["node", "--input-type=module", "-e", script], cwd=EXAMPLES / "node",
                            capture_output=True, text=True, timeout=60, check=True)
    refused = ": it is not text, which UTF-8 cannot encode nor PostgreSQL store"
    assert result.stdout.splitlines() == [
        f"kind holds a lone surrogate{refused}",
        f'args["to"] holds a lone surrogate{refused}',
        f'the key "\\ud800x" of args holds a lone surrogate{refused}',
        f'args["l"][1]["z"] holds a lone surrogate{refused}',
        unique_key("k", {"pair": "\U0001f600"}).hex(),
    ]
