"""bench/e2e_pgbench.py's pure parts: no server."""

from __future__ import annotations

import pytest
from bench.e2e_pgbench import (
    first_last,
    keeps_up,
    median_series,
    parse_pgbench,
    systems,
    wait_label,
    window_rates,
)

SUMMARY = """\
transaction type: /tmp/x.sql
scaling factor: 1
query mode: prepared
number of clients: 8
number of threads: 2
maximum number of tries: 1
duration: 5 s
number of transactions actually processed: 7256
number of failed transactions: 0 (0.000%)
latency average = 5.512 ms
initial connection time = 12.345 ms
tps = 1451.330882 (without initial connection time)
"""


def test_parse_pgbench_reads_count_and_tps():
    assert parse_pgbench(SUMMARY) == (7256, pytest.approx(1451.330882))


@pytest.mark.parametrize("text", [
    SUMMARY.replace("failed transactions: 0 (0.000%)", "failed transactions: 3 (0.041%)"),
    SUMMARY.replace("tps = ", "tps: "),
    "",
])
def test_parse_pgbench_refuses_failures_and_garbage(text):
    with pytest.raises(ValueError):
        parse_pgbench(text)


def test_window_rates():
    assert window_rates([(0.0, 0), (10.0, 1000), (20.0, 3000)]) == [100.0, 200.0]
    assert window_rates([(0.0, 0)]) == []


def test_first_last_picks_the_samples_nearest_the_window():
    samples = [(float(t), t * 10 if t <= 60 else 600 + (t - 60) * 5) for t in range(0, 601, 30)]
    first, last = first_last(samples, 60)
    assert first == pytest.approx(10.0)
    assert last == pytest.approx(5.0)


def test_keeps_up_within_one_job_per_second():
    assert keeps_up(1000.0, 999.5)
    assert not keeps_up(1000.0, 998.9)


def test_median_series_per_window_cut_to_the_shortest_run():
    assert median_series([[1, 10, 5], [3, 30], [2, 20, 7]]) == [2, 20]
    assert median_series([]) == []


def test_awa_worker_is_the_contract_call_and_idle_mode_branches_on_its_count():
    awa = next(s for s in systems() if s.key == "s8")
    assert awa.worker_script({}, 0) == (
        "select count(awa.complete(c.job_id, c.run_lease))"
        " from awa.claim(array['q'], 1, 'w') c;\n")
    idle = awa.worker_script({}, 5)
    assert "\\gset\n\\if :count = 0\n\\sleep 5 ms\n\\endif\n" in idle


def test_every_worker_returns_a_count_in_idle_mode():
    for s in systems():
        script = s.worker_script({"worker_id": "1"}, 2)
        statement = script.split(" \\gset")[0]
        assert statement.startswith(("select count(", "with j as")), s.key
        assert "count(" in statement, s.key


def test_wait_label_tells_cpu_from_waits_and_idle():
    assert wait_label("active", None, None) == "on CPU"
    assert wait_label("active", "LWLock", "WALWrite") == "LWLock/WALWrite"
    assert wait_label("idle", "Client", "ClientRead") == "between statements"
    assert wait_label("idle in transaction", None, None) == "between statements"
