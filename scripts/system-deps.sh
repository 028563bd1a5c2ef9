#!/usr/bin/env bash
# The Debian packages `make test` (or `make demo`, `make bench`) needs,
# installed when missing: as root with apt-get, otherwise printed with the
# command to run.
#   scripts/system-deps.sh test|demo|bench
set -euo pipefail
target=${1:-test}

missing=()
command -v npm >/dev/null 2>&1 || missing+=(npm)  # the PostgreSQL builds come from npm
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "$target" = test ]; then
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the admin page's browser test
  # The pooler tests (tests/test_pgbouncer.py) run through Debian's PgBouncer.
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
  # promtool runs the alert rules' tests (tests/test_alert_rules.py).
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
fi
if [ "$target" = bench ]; then
  command -v pgbench >/dev/null 2>&1 || missing+=(postgresql-client)  # the C client
  command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)  # bench/enqueue_instructions.py
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# prometheus is installed for its promtool only: a server its postinst
# starts is stopped, and on a systemd host left disabled. Not one that ran
# before (a server of the host's own).
for_promtool=false
if [[ " ${missing[*]} " == *" prometheus "* ]] && ! pgrep -x prometheus >/dev/null 2>&1; then
  for_promtool=true
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
if $for_promtool; then
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
fi
