"""Runs one bench script as of a git revision and as of this checkout, in turns.

For a change that touches many functions, where installing one old function
beside today's (``--before`` of the enqueue benches) is not enough: the
revision is exported into a temporary folder, and each round runs the
script there (with that checkout's ``awa_sql`` and ``sql/``), then here,
each against its own fresh server. Rounds alternate so both sides see the
same machine; the output lines of each run are printed under its label.

    python bench/before_after.py --before REF [--rounds 3] [--write-docs] SCRIPT [ARGS ...]
    python bench/before_after.py --before main~1 copy_ingest.py --rows 200000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import export_revision

ROOT = Path(__file__).resolve().parent.parent


def _run(checkout: Path, script: str, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(checkout / "installer"))
    result = subprocess.run([sys.executable, str(checkout / "bench" / script), *args],
                            cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{script} failed in {checkout}:\n{result.stdout}{result.stderr}")
    return result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, metavar="REF")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script", help="a script in bench/, e.g. copy_ingest.py")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    _docs.add_argument(parser)
    opts = parser.parse_args()
    block = _docs.Block(__file__, "A bench before and after a revision", opts.write_docs)
    with tempfile.TemporaryDirectory(prefix="awa-before-") as tmp:
        before = export_revision(opts.before, Path(tmp) / "checkout")
        for n in range(1, opts.rounds + 1):
            for label, checkout in ((f"before ({opts.before})", before), ("after", ROOT)):
                print(f"## round {n}, {label}", flush=True)
                print(_run(checkout, opts.script, opts.args), end="", flush=True)
    block.write()


if __name__ == "__main__":
    main()
