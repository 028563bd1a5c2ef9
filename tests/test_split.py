"""The suite's split of a version's test files between two workers
(tests/support/split.py)."""

from __future__ import annotations

from tests.support import split


def _loads(parts, weights):
    total = [0.0, 0.0]
    for (_version, f), part in parts.items():
        total[part] += weights[f]
    return sorted(total)


def test_recorded_seconds_balance_the_parts():
    weights = {"a.py": 100.0, "b.py": 60.0, "c.py": 50.0, "d.py": 10.0}
    tests = [("pg18", f) for f in weights]
    parts = split.assign(tests, 2, {"pg18": weights})
    # a hash or a count could put a and b together (160 against 60)
    assert _loads(parts, weights) == [110.0, 110.0]


def test_a_file_not_recorded_weighs_its_tests_at_the_mean():
    record = {"pg17": {"a.py": 30.0, "b.py": 10.0}}  # 40 s over 4 tests: 10 s each
    tests = [("pg17", "a.py")] * 3 + [("pg17", "b.py")] + [("pg17", "new.py")] * 2
    parts = split.assign(tests, 2, record)  # new.py weighs 20 s: a | new + b
    assert parts[("pg17", "new.py")] != parts[("pg17", "a.py")]
    assert parts[("pg17", "b.py")] == parts[("pg17", "new.py")]


def test_versions_are_split_apart_and_the_same_on_every_call():
    tests = [(v, f"t{i}.py") for v in ("pg17", "pg18") for i in range(7)]
    first = split.assign(tests, 2, {})
    assert first == split.assign(list(reversed(tests)), 2, {})
    for version in ("pg17", "pg18"):
        sizes = [sum(1 for (v, _), p in first.items() if v == version and p == part)
                 for part in (0, 1)]
        assert sorted(sizes) == [3, 4]


def test_the_record_round_trips(tmp_path):
    path = tmp_path / "durations.json"
    split.write({"pg18": {"b.py": 2.04, "a.py": 1.26}}, path)
    assert split.load(path) == {"pg18": {"a.py": 1.3, "b.py": 2.0}}
    assert split.load(tmp_path / "missing.json") == {}
