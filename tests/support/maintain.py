"""The real ``awa maintain`` as a subprocess: its log and its /metrics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.waiting import wait_until

AWA = Path(sys.executable).parent / "awa"  # the console script of .venv


class MaintainProcess:
    """``awa maintain --metrics-port 0 *flags`` with AWA_DATABASE_URL=dsn
    (``env`` adds to the environment); stderr (its log) goes to a file, so
    nothing blocks on a full pipe. The system picks the port when the process
    binds it, and the process logs its URL: no other test worker can take it
    between a pick and the bind."""

    def __init__(self, dsn: str, *flags: str, env: dict[str, str] | None = None):
        self.metrics_url: str | None = None
        fd, name = tempfile.mkstemp(prefix="awa-maintain-", suffix=".log")
        self.log_file = Path(name)
        given = env or {}
        env = {**os.environ, "AWA_DATABASE_URL": dsn}
        env.pop("DATABASE_URL", None)
        env.pop("AWA_MAINTAIN_ALLOWED_HOSTS", None)
        env.update(given)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(
                [str(AWA), "maintain", "--metrics-port", "0", *flags], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def __enter__(self) -> MaintainProcess:
        return self

    def __exit__(self, *_exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._kept = self.log()
        self.log_file.unlink(missing_ok=True)

    def log(self) -> str:
        kept = getattr(self, "_kept", None)
        return kept if kept is not None else self.log_file.read_text(errors="replace")

    def bound_url(self) -> str | None:
        """The URL of its /metrics as it logged it, or None until it has."""
        if self.proc.poll() is not None:
            raise AssertionError(f"awa maintain exited {self.proc.returncode}:\n{self.log()}")
        if self.metrics_url is None:
            bound = re.search(r"metrics at (http://\S+/metrics)", self.log())
            self.metrics_url = bound and bound.group(1)
        return self.metrics_url

    def url(self) -> str:
        """The URL of its /metrics, once it has logged it."""
        return self.wait(self.bound_url, "the URL of /metrics in the log")

    def samples(self) -> dict[tuple[str, tuple], float] | None:
        """Every sample of its /metrics, or None while it does not answer."""
        if self.bound_url() is None:
            return None
        try:
            with urllib.request.urlopen(  # noqa: S310 - the URL it logged
                    self.metrics_url, timeout=2) as response:
                text = response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def value(self, name: str, **labels: str) -> float:
        samples = wait_until(self.samples, 30, "awa maintain's /metrics")
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def passes(self, task: str, outcome: str = "ran") -> float:
        return self.value("awa_maintain_passes_total", task=task, outcome=outcome)

    def handled(self, task: str) -> float:
        return self.value("awa_maintain_handled_total", task=task)

    def wait(self, condition, what: str, timeout: float = 30):
        """wait_until, with this process's log in the failure."""
        try:
            return wait_until(condition, timeout, what)
        except AssertionError as err:
            raise AssertionError(f"{err}\nawa maintain's log:\n{self.log()}") from None

    def wait_for_pass(self, task: str, outcome: str = "ran", more_than: float = 0,
                      timeout: float = 30) -> None:
        self.wait(lambda: self.passes(task, outcome) > more_than,
                  f"a {task} pass ({outcome}) after {more_than:g}", timeout)

    def wait_for_handled(self, task: str, n: float, timeout: float = 30) -> None:
        """Waits until the process counted ``n`` handled by ``task``, then checks
        it counted no more. It counts (and then logs) after the call committed,
        so what a pass did shows in the database a moment before it shows here."""
        self.wait(lambda: self.handled(task) >= n, f"{n:g} handled by {task}", timeout)
        assert self.handled(task) == n

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        self.wait(lambda: text in self.log(), f"{text!r} in the log", timeout)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, float]:
        """Sends ``sig``; the exit code and the seconds until the process ended."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"awa maintain still runs 30 s after {signal.Signals(sig).name}:\n"
                                 f"{self.log()}") from None
        return code, time.monotonic() - started
