# awa-sql developer entry points. `make test` and `make demo` work on a fresh
# Debian 12 machine with Python 3.11+: as root they install the Debian
# packages they need (scripts/system-deps.sh), otherwise they name them.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: dev test test-durations lint schema sql-headers demo demo-stop bench clean system-deps-test \
        system-deps-demo system-deps-bench

$(STAMP): pyproject.toml examples/node/package.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	cd examples/node && npm install --no-audit --no-fund --silent
	touch $(STAMP)

dev: $(STAMP)

# Debian packages (npm, psql, chromium, pgbouncer, promtool, ...): installed when
# missing if root, else printed with the apt-get line.
system-deps-test:
	@scripts/system-deps.sh test

system-deps-demo:
	@scripts/system-deps.sh demo

system-deps-bench:
	@scripts/system-deps.sh bench

# The whole suite, PostgreSQL 17 and 18, lint included: four pytest-xdist
# workers, each with one version's server and a part of its test files
# balanced by tests/durations.json (tests/conftest.py groups them), the tests
# of no version shared out. PYTEST_XDIST= runs it in one process;
# PYTEST_ARGS adds pytest arguments (`make test PYTEST_ARGS='-k retry'`).
PYTEST_XDIST ?= -n 4 --dist loadgroup
test: system-deps-test $(STAMP)
	$(BIN)/pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# The whole suite, recording each test file's seconds in tests/durations.json
# for the split above. Re-run it when the workers' times drift apart.
test-durations: system-deps-test $(STAMP)
	$(BIN)/pytest $(PYTEST_XDIST) --store-durations $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/pytest tests/test_lint.py

# docs/schema.sql: schema awa after a fresh migrate, as DDL, from the suite's
# PostgreSQL 18. Run it after changing a migration or a file in sql/; a test
# fails until you do.
schema: system-deps-test $(STAMP)
	$(BIN)/python -m tests.support.schema

# The generated -- Calls: / -- Writes: lines of every function header in sql/
# and docs/sql-map.md, from the function bodies (no database needed). Run it
# after changing a function or its header; tests/test_sql_headers.py fails
# until you do.
sql-headers: $(STAMP)
	$(BIN)/python -m tests.support.sql_headers --write

# The demo: PostgreSQL 18 under .awa/, load, admin page and /metrics; Ctrl-C stops it.
# `make demo-stop` stops a server left by a killed demo.
demo: system-deps-demo $(STAMP)
	$(BIN)/awa demo

demo-stop: $(STAMP)
	$(BIN)/awa demo --stop

# Every bench, each replacing its block of the Current numbers in
# docs/benchmarks.md (hours: the auto-scaler experiment alone takes 50
# minutes). backend_cpu.py and before_after.py compare with a git revision
# and need --before REF: run them by hand.
bench: system-deps-bench $(STAMP)
	@for script in bench/*.py; do \
	  case $$script in */__init__.py|*/_*|*/backend_cpu.py|*/before_after.py) continue;; esac; \
	  echo "== $$script"; $(BIN)/python $$script --write-docs || exit 1; \
	done
	@echo "== bench/e2e_pgbench.py --long"; $(BIN)/python bench/e2e_pgbench.py --long --write-docs

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build dist
