"""The admin page in Debian's chromium, driven by Playwright, against `awa admin serve`."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import awa_sql
from tests.support.admin import TOKEN, enqueue_jobs, operator_login, reader_login, serve_cli
from tests.support.jobs import claim, enqueue

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT_DIR = Path(os.environ.get("AWA_SCREENSHOT_DIR")
                      or Path(tempfile.gettempdir()) / "awa-admin-screenshots")

pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason="needs Debian's chromium (apt-get install chromium)"),
              pytest.mark.one_version]  # what the page shows is tested on both in test_admin_api
# Playwright's own deadlines (5 s for an expect, 30 s for an action), long
# enough on a machine where the browser and the server share two loaded cores.
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    context = browser.new_context(viewport={"width": 1200, "height": 1000})
    context.set_default_timeout(WAIT_MS)
    # Nothing but the admin server: a request elsewhere fails the test.
    outside = []
    context.route(re.compile(r"^(?!http://127\.0\.0\.1:).*"),
                  lambda route: (outside.append(route.request.url), route.abort()))
    p = context.new_page()
    yield p
    context.close()
    assert outside == [], f"the page fetched from outside the admin server: {outside}"


def _lane_shards(page) -> set[int]:
    return {int(s) for s in page.locator("#lanes-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.shard)")}


def test_change_s_from_1_to_4_through_the_confirm_dialog(db, page):
    from playwright.sync_api import expect

    enqueue_jobs(db, "orders", 5)
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/queues/orders")
        expect(page.locator("#shards-value")).to_have_text("1")
        expect(page.locator("#lanes-table tbody tr")).to_have_count(4)
        assert _lane_shards(page) == {0}
        expect(page.locator("#changes-table")).to_have_text("S has never changed.")

        page.fill("#token", TOKEN)
        page.fill("#new-shards", "4")
        page.click("#change-shards")
        dialog = page.locator("#confirm")
        expect(dialog).to_be_visible()
        expect(page.locator("#confirm-title")).to_have_text("Change S of orders from 1 to 4?")
        expect(page.locator("#confirm-text")).to_contain_text("partitioned FIFO")
        expect(page.locator("#confirm-text")).to_contain_text("per-key order resumes")
        expect(page.locator("#confirm-lanes")).to_contain_text("12 new lanes")
        with db.connect() as conn:  # nothing is sent before the confirmation
            assert conn.execute("select awa.enqueue_shards('orders')").fetchone()[0] == 1
        page.click("#confirm-ok")

        expect(page.locator("#shards-value")).to_have_text("4")
        expect(page.locator("#lanes-table tbody tr")).to_have_count(16)
        assert _lane_shards(page) == {0, 1, 2, 3}
        expect(page.locator("#changes-table tbody tr").first).to_contain_text("1 → 4")
        expect(page.locator("#status")).to_contain_text("S is now 4")
        with db.connect() as conn:
            assert conn.execute("select awa.enqueue_shards('orders')").fetchone()[0] == 4

        enqueue_jobs(db, "orders", 40)  # the page refreshes itself: ready jobs appear
        expect(page.locator("#summary")).to_contain_text("45")
        expect(page.locator("#lane-evidence")).to_contain_text(
            "40 enqueues: 40 on lanes < S, 0 on lanes ≥ S")

        with db.connect() as conn:  # what the auto-scaler in shadow mode would log
            conn.execute("select awa.sample_lane_contention()")
            conn.execute("select awa.sample_lane_contention()")
            conn.execute(
                "insert into awa.autoscale_decisions (queue, mode, samples, mean_waiters,"
                " wait_share, enqueue_rate, current_shards, proposed_shards, action, reason)"
                " values ('orders', 'shadow', 12, 2.5, 0.6, 1800, 4, 8, 'would_raise',"
                " 'mean waiters per held lane 2.50 >= 1.00 over 12 samples')")
        with awa_sql.Producer(db.dsn(db.login_role("awa_producer")),
                              snapshot_every=0.2) as producer:
            producer.enqueue("t", queue="orders", ordering_key="o-1")
            expect(page.locator("#producers-on-s")).to_have_text(
                "1 of 1 live producers have enqueued with S = 4 since the change.")
            expect(page.locator("#decisions-table")).to_contain_text("would_raise")
            expect(page.locator("#decisions-table")).to_contain_text("2.50 >= 1.00")
            expect(page.locator("#contention-table tbody tr")).to_have_count(1)


def _screenshot(page, db) -> None:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOT_DIR / f"admin-queue-page-pg{db.cluster.major}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if target := os.environ.get("AWA_UPDATE_SCREENSHOT"):
        shutil.copy(shot, target)


HOUR = """
insert into awa.contention_samples (sampled_at, queue_id, lanes, lanes_held, lanes_waited,
                                    waiters, enqueued, busiest_priority_held, ready,
                                    oldest_ready_at)
select now() - make_interval(mins => 60 - i), m.queue_id, 32,
       case when i < 20 then 1 else 5 end,
       case when i < 20 then 1 else (i % 7 = 0)::int end,
       case when i < 20 then (10 + 2 * sin(i))::int else (i % 7 = 0)::int end,
       -- about 300 enqueues/s at S = 1, 900/s from S = 8 on
       case when i < 20 then i * 18000 + (600 * sin(i))::int
            else 360000 + (i - 20) * 54000 + (3000 * sin(i / 3.0))::int end,
       case when i < 20 then 1 else 5 end,
       case when i < 20 then 4000 + i * 900 else greatest(200, 22000 - (i - 20) * 1500) end,
       now() - make_interval(mins => 60 - i)
             - make_interval(secs => case when i < 20 then 8 + i else 2 + sin(i) end)
  from awa.queue_meta as m, generate_series(0, 59) as i
 where m.queue = 'orders'
"""


def test_the_last_hour_charts_render_with_data_and_the_change_of_s(db, page):
    from playwright.sync_api import expect

    enqueue_jobs(db, "orders", 20)
    with db.connect() as conn:
        conn.execute("select awa.set_shard_mode('orders', 'auto', 8)")
        conn.execute(HOUR)  # an hour of samples: contended at S = 1, calm at S = 8
        conn.execute("select awa.set_enqueue_shards('orders', 8)")
        conn.execute("update awa.shard_changes set changed_at = now() - interval '40 min',"
                     " source = 'auto'")
        for _ in range(5):  # real ticks: a run of holds, folded into one row
            conn.execute("select awa.autoscale_tick()")
        # Their samples count the lanes' real sequences, not the hour's counter.
        conn.execute("delete from awa.contention_samples"
                     " where sampled_at > now() - interval '30 seconds'")
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/queues/orders")
        charts = page.locator("#history svg.chart")
        expect(charts).to_have_count(5)
        for chart_id in ("chart-shards", "chart-rate", "chart-waiters", "chart-ready",
                         "chart-lag"):
            chart = page.locator(f"#{chart_id} svg.chart")
            assert int(chart.get_attribute("data-points")) >= 55, chart_id
            points = chart.locator("polyline.series").get_attribute("points").split()
            assert len(points) >= 55, chart_id
            # The line moves: drawn from data, not a flat placeholder.
            assert len({p.split(",")[1] for p in points}) > 1, chart_id
            expect(chart.locator("line.change-mark")).to_have_count(1)
        expect(page.locator("#chart-shards figcaption")).to_contain_text("S (mode auto, max 8)")
        expect(page.locator("#chart-shards .chart-last")).to_have_text("8")
        expect(page.locator("#chart-shards text.change-label")).to_have_text("1→8")
        expect(page.locator("#chart-shards line.change-mark title")).to_contain_text(
            "S 1 → 8 (auto)")
        expect(page.locator("#history")).to_contain_text("the 1 change of S")
        # The five real ticks: two holds for too few samples, three steady ones.
        folded = page.locator("#decisions-table tbody tr")
        expect(folded).to_have_count(2)
        expect(folded.first).to_contain_text("held \u00d73")
        _screenshot(page, db)


def test_cancel_in_the_dialog_changes_nothing(db, page):
    from playwright.sync_api import expect

    enqueue_jobs(db, "keep", 1)
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/queues/keep")
        page.fill("#token", TOKEN)
        page.fill("#new-shards", "8")
        page.click("#change-shards")
        page.click("#confirm-cancel")
        expect(page.locator("#confirm")).to_be_hidden()
        expect(page.locator("#shards-value")).to_have_text("1")
    with db.connect() as conn:
        assert conn.execute("select count(*) from awa.shard_changes").fetchone()[0] == 0


def test_read_only_mode_has_no_write_control(db, page):
    from playwright.sync_api import expect

    enqueue_jobs(db, "ro", 2)
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/")
        expect(page.locator("#queues tbody tr")).to_have_count(1)
        page.click("text=ro")
        expect(page.locator("#shards-value")).to_have_text("1")
        expect(page.locator("#lanes-table tbody tr")).to_have_count(4)
        assert page.locator("button, input, select, form, dialog").count() == 0
        expect(page.locator("header")).to_contain_text("read-only")


def test_a_stripe_or_dropped_queue_page_sends_no_refused_request_and_says_where_to_go(
        db, page):
    """The queue list links a stripe (st#0) and a dropped queue (#dropped#N),
    whose pages read their failed jobs every refresh and offered pause and
    retry: each refused with 400 ('#' is reserved), the status line red on
    every refresh. Their pages send none of those and say why, a stripe's
    linking its logical queue's page, where the failed jobs and changes are."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    with db.connect() as conn:
        conn.execute("select awa.set_queue_stripes('st', 2)")
        enqueue(conn, "st", "charge", max_attempts=1)  # a failure is for good
        ((job_id, lease, *_),) = claim(conn, ["st"], 1)
        conn.execute("select awa.fail(%s, %s, 'card declined')", [job_id, lease])
        (stripe,) = conn.execute("select queue from awa.jobs('st', 'failed')").fetchone()
        enqueue(conn, "old")
        conn.execute("select awa.cancel_jobs('old')")
        conn.execute("select awa.drop_queue('old', true)")
        (dropped,) = conn.execute("select queue from awa.queue_overview"
                                  " where queue like '#dropped#%'").fetchone()
    assert stripe.startswith("st#"), stripe
    sent: list[tuple[str, str]] = []
    page.on("request", lambda r: sent.append((r.method, r.url)) if "/api/" in r.url else None)
    refreshed = "document.getElementById('app').dataset.refreshed"

    def a_refresh_later():  # the first load, then one of the 3 s refreshes
        page.wait_for_function(f"() => {refreshed}")  # a function: the page's CSP forbids eval
        page.wait_for_function(f"b => {refreshed} !== b", arg=page.evaluate(refreshed))

    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/")
        expect(page.locator("#queues tbody tr", has_text=stripe)).to_have_count(1)
        page.click(f"#queues a:text-is('{stripe}')")
        expect(page.locator("h1")).to_have_text(stripe)
        a_refresh_later()
        assert page.locator("#status").text_content() == ""
        assert page.locator("#status.error").count() == 0
        expect(page.locator("#elsewhere")).to_have_text(
            f"{stripe} is a stripe of st. Its failed jobs, pause and resume, retry and cancel, "
            "and changes of S and mode are on that page, which covers all its stripes: they "
            "do not take a stripe's name.")
        assert page.locator("#controls, #failed, button, input, select, form, dialog").count() == 0
        expect(page.locator("#lanes-table tbody tr")).to_have_count(4)  # what works stays
        assert [m for m, u in sent if m != "GET" or "/jobs" in u] == [], sent

        page.click("#logical-link")
        expect(page.locator("h1")).to_have_text("st")
        expect(page.locator("#failed-jobs tbody tr")).to_have_count(1)
        expect(page.locator("#failed-jobs tbody tr")).to_contain_text("card declined")
        expect(page.locator("#pause")).to_be_visible()

        sent.clear()
        page.goto(f"{base}/queues/{quote(dropped, safe='')}")
        expect(page.locator("h1")).to_have_text(dropped)
        a_refresh_later()
        assert page.locator("#status").text_content() == ""
        expect(page.locator("#elsewhere")).to_contain_text(
            f"{dropped} is a dropped queue: nothing can be changed on it")
        assert page.locator("#controls, #failed, button, input, select, form, dialog").count() == 0
        assert [m for m, u in sent if m != "GET" or "/jobs" in u] == [], sent


def test_a_queue_state_says_active_or_paused_apart_from_its_running_jobs(db, page):
    """The state of a queue that is not paused said "running", as did the
    column of its running jobs next to it."""
    from playwright.sync_api import expect

    enqueue_jobs(db, "live", 2)
    enqueue_jobs(db, "held", 2)
    with db.connect() as conn:
        assert len(claim(conn, ["live"], 1)) == 1
        conn.execute("select awa.pause_queue('held')")
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/")
        expect(page.locator("#queues tbody tr")).to_have_count(2)
        headers = page.locator("#queues thead th").all_inner_texts()
        state, running = headers.index("State"), headers.index("Running")

        def cells(queue):
            return page.locator("#queues tbody tr", has_text=queue).locator("td")

        expect(cells("live").nth(state)).to_have_text("active")
        expect(cells("live").nth(running)).to_have_text("1")
        expect(cells("held").nth(state)).to_have_text("paused")
        expect(cells("held").nth(running)).to_have_text("0")
        page.click("text=live")
        expect(page.locator("#paused-value")).to_have_text("active")
        page.goto(f"{base}/queues/held")
        expect(page.locator("#paused-value")).to_have_text("paused")


def test_what_is_failing_is_summed_up_on_request_and_links_the_last_job(db, page):
    """The queue list sums up the failed jobs kept (awa.failure_summary) when
    asked, by queue, kind and error, never on its refresh."""
    from playwright.sync_api import expect

    with db.connect() as conn:
        # One attempt each: a failure is for good.
        conn.execute("select awa.enqueue('pay', 'charge', '{}', 2::smallint, null, null, 1)"
                     " from generate_series(1, 3)")
        jobs = claim(conn, ["pay"], 3)
        for job_id, lease, *_ in jobs:
            conn.execute("select awa.fail(%s, %s, 'card declined' || chr(10) || 'at charge()')",
                         [job_id, lease])
    failed = [j[0] for j in jobs]
    assert {_state(db, j) for j in failed} == {"failed"}
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/")
        expect(page.locator("#queues tbody tr")).to_have_count(1)
        expect(page.locator("#failures-table")).to_have_count(0)
        page.click("#sum-failures")
        row = page.locator("#failures-table tbody tr")
        expect(row).to_have_count(1)
        cells = row.locator("td")
        expect(cells.nth(0)).to_have_text("pay")
        expect(cells.nth(2)).to_have_text("card declined")
        expect(cells.nth(3)).to_have_text(str(len(failed)))
        row.locator("a.job-link").click()
        expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
        assert int(page.url.rsplit("/", 1)[1]) in failed


def _state(db, job_id):
    with db.connect() as conn:
        return conn.execute("select state from awa.job(%s)", [job_id]).fetchone()[0]


@pytest.mark.parametrize("ids_from", [None, 2**53], ids=["small ids", "ids past 2^53"])
def test_fail_a_job_find_it_on_the_queue_page_retry_it_and_see_it_run(db, page, ids_from):
    """A worker fails a job for good; the queue page lists it and links to
    its page (args, last error, attempts, times); Retry, confirmed in the
    dialog, sends it back; the page then shows a worker running it, with the
    same args and key, and completing it. With job ids and run leases past
    2^53, which a JavaScript number cannot hold, the page keeps every digit
    (it linked to the id rounded to an even number)."""
    from playwright.sync_api import expect
    from psycopg.types.json import Jsonb

    if ids_from:
        with db.connect() as su:
            for seq in ("awa.job_id_seq", "awa.run_lease_seq"):
                su.execute("select setval(%s, %s)", [seq, ids_from])
    worker = db.login_role("awa_worker")
    with db.connect(db.login_role("awa_producer")) as p:
        job_id = enqueue(p, "orders", "charge", args=Jsonb({"order": 1001}),
                         ordering_key=b"cust-42", max_attempts=1)[0]
    with db.connect(worker) as w:
        (c,) = claim(w, ["orders"])
        assert w.execute("select awa.fail(%s, %s, 'card declined')", [c[0], c[1]]).fetchone()[0]
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/queues/orders")
        row = page.locator(f"#failed-jobs tbody tr[data-job-id='{job_id}']")
        expect(row).to_contain_text("charge")
        expect(row).to_contain_text("card declined")
        expect(row).to_contain_text("1/1")
        row.locator("a.job-link").click()

        expect(page).to_have_url(f"{base}/jobs/{job_id}")
        expect(page.locator("h1")).to_have_text(f"Job {job_id}")
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("#job-args")).to_contain_text('"order": 1001')
        expect(page.locator("#job-error")).to_have_text("card declined")
        expect(page.locator("#job-attempts")).to_have_text("1 of 1")
        expect(page.locator("#job-key")).to_have_text("cust-42")
        expect(page.locator("#job-finished")).to_contain_text("20")  # a date
        expect(page.locator("#cancel-job")).to_be_disabled()

        page.fill("#token", TOKEN)
        page.click("#retry-job")
        expect(page.locator("#confirm-jobs")).to_be_visible()
        expect(page.locator("#confirm-jobs-title")).to_have_text(
            f"Retry 1 job: job {job_id} (charge, failed) of orders? It runs again now, with a"
            " fresh set of attempts.")
        assert _state(db, job_id) == "failed"  # nothing is sent before the confirmation
        page.click("#confirm-jobs-ok")
        expect(page.locator("#status")).to_have_text(f"Job {job_id} retried: now ready.")
        expect(page.locator("#job-state")).to_have_text("ready")
        expect(page.locator("#job-attempts")).to_have_text("0 of 1")
        expect(page.locator("#retry-job")).to_be_disabled()

        with db.connect(worker) as w:  # it runs again: same job, args and key
            (c,) = claim(w, ["orders"], worker="browser-worker")
            assert (c[0], c[7], c[10], c[8]) == (job_id, {"order": 1001}, b"cust-42", 1)
            expect(page.locator("#job-state")).to_have_text("running")
            expect(page.locator("#job-worker")).to_have_text("browser-worker")
            expect(page.locator("#job-attempts")).to_have_text("1 of 1")
            assert w.execute("select awa.complete(%s, %s)", [c[0], c[1]]).fetchone()[0]
        expect(page.locator("#job-state")).to_have_text("completed")
        expect(page.locator("#job-args")).to_have_text("(not kept for a completed job)")

        page.click("#job-queue a")
        expect(page).to_have_url(f"{base}/queues/orders")
        expect(page.locator("#failed-jobs")).to_have_text("No failed jobs.")


def test_bulk_retry_and_cancel_say_how_many_jobs_and_the_list_pages(db, page):
    from playwright.sync_api import expect

    with db.connect() as conn:
        conn.execute("select awa.enqueue('bulk', 'k', jsonb_build_object('i', i), 2::smallint,"
                     " null, null, 1) from generate_series(1, 25) as i")
        conn.execute("select count(awa.fail(c.job_id, c.run_lease, 'boom'))"
                     " from awa.claim(array['bulk'], 25, 'w') as c")
    enqueue_jobs(db, "bulk", 3, keyed=False)
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/queues/bulk")
        rows = page.locator("#failed-jobs tbody tr")
        expect(rows).to_have_count(20)
        page.click("#failed-next")
        expect(rows).to_have_count(5)
        page.click("#failed-first")
        expect(rows).to_have_count(20)

        page.fill("#token", TOKEN)
        expect(page.locator("#retry-state")).to_have_value("failed")
        page.click("#retry-jobs")
        expect(page.locator("#confirm-jobs-title")).to_have_text("Retry 25 failed jobs of bulk?")
        expect(page.locator("#confirm-jobs-ok")).to_have_text("Retry 25 jobs")
        page.click("#confirm-jobs-cancel")
        expect(page.locator("#confirm-jobs")).to_be_hidden()
        with db.connect() as conn:
            assert conn.execute("select awa.count_jobs('bulk', 'failed')").fetchone()[0] == 25

        page.click("#retry-jobs")
        page.click("#confirm-jobs-ok")
        expect(page.locator("#status")).to_have_text("Retried 25 failed jobs.")
        expect(page.locator("#failed-jobs")).to_have_text("No failed jobs.")

        page.click("#cancel-waiting")
        expect(page.locator("#confirm-jobs-title")).to_have_text("Cancel 28 ready jobs of bulk?")
        # Jobs that come in while the dialog is open were not asked about.
        enqueue_jobs(db, "bulk", 5, keyed=False)
        page.click("#confirm-jobs-ok")
        expect(page.locator("#status")).to_have_text("Cancelled 28 jobs.")
        with db.connect() as conn:
            assert conn.execute("select awa.count_jobs('bulk', 'cancelled')").fetchone()[0] == 28
            assert conn.execute("select awa.count_jobs('bulk', 'ready')").fetchone()[0] == 5


def test_bulk_retry_of_cancelled_jobs_is_chosen_on_the_page_and_leaves_failed_ones(db, page):
    """The runbook's way back for a flood cancelled in bulk, from the page:
    the state picked beside the button goes to the plan, the dialog and
    the call; the failed jobs stay failed."""
    from playwright.sync_api import expect

    with db.connect() as conn:
        conn.execute("select awa.enqueue('flood', 'ok', '{}', 2::smallint, null, null, 1)"
                     " from generate_series(1, 2)")
        conn.execute("select count(awa.fail(c.job_id, c.run_lease, 'boom'))"
                     " from awa.claim(array['flood'], 2, 'w') as c")
        conn.execute("select awa.enqueue('flood', 'bad') from generate_series(1, 3)")
        assert conn.execute("select awa.cancel_jobs('flood', 'bad')").fetchone()[0] == 3
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/queues/flood")
        expect(page.locator("#failed-jobs tbody tr")).to_have_count(2)
        page.fill("#token", TOKEN)
        page.select_option("#retry-state", "cancelled")
        expect(page.locator("#retry-jobs")).to_have_text("Retry cancelled jobs…")
        page.click("#retry-jobs")
        expect(page.locator("#confirm-jobs-title")).to_have_text(
            "Retry 3 cancelled jobs of flood?")
        expect(page.locator("#confirm-jobs-ok")).to_have_text("Retry 3 jobs")
        with db.connect() as conn:  # nothing is sent before the confirmation
            assert conn.execute("select awa.count_jobs('flood', 'cancelled')").fetchone()[0] == 3
        page.click("#confirm-jobs-ok")
        expect(page.locator("#status")).to_have_text("Retried 3 cancelled jobs.")
        expect(page.locator("#failed-jobs tbody tr")).to_have_count(2)
        with db.connect() as conn:
            assert conn.execute("select awa.count_jobs('flood', 'cancelled')").fetchone()[0] == 0
            assert conn.execute("select awa.count_jobs('flood', 'ready')").fetchone()[0] == 3
            assert conn.execute("select awa.count_jobs('flood', 'failed')").fetchone()[0] == 2
        page.click("#retry-jobs")  # the state stays picked: none are left
        expect(page.locator("#status")).to_have_text("No cancelled jobs in flood.")


def _leases_running(db, worker: str) -> list[bool]:
    with db.connect() as conn:
        return [r[0] for r in conn.execute(
            "select lease_expires_at > now() from awa.running where worker = %s"
            " order by job_id", [worker]).fetchall()]


def test_a_dead_workers_jobs_are_released_from_a_running_jobs_page(db, page):
    """A running job's page names its worker; for a worker known dead,
    "Release worker…", confirmed, ends the leases of every job it runs
    (here in two queues), and the rescue then sends the job back."""
    from playwright.sync_api import expect

    with db.connect() as conn:
        conn.execute("select awa.enqueue(q, 't') from unnest(array['rw-a', 'rw-b']) as q")
        (job, *_), = claim(conn, ["rw-a"], 1, worker="dead-w")
        claim(conn, ["rw-b"], 1, worker="dead-w")
        conn.execute("select awa.enqueue('rw-a', 'failing', '{}', 2::smallint, null, null, 1)")
        (f, lease, *_), = claim(conn, ["rw-a"], 1, worker="x")
        conn.execute("select awa.fail(%s, %s, 'boom')", [f, lease])
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/jobs/{f}")
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("#release-worker")).to_be_disabled()
        page.goto(f"{base}/jobs/{job}")
        expect(page.locator("#job-worker")).to_have_text("dead-w")
        expect(page.locator("#release-worker")).to_be_enabled()
        page.fill("#token", TOKEN)
        page.click("#release-worker")
        expect(page.locator("#confirm-jobs-title")).to_have_text(
            "Release worker dead-w? The leases of every job it runs, in every queue, end "
            "now, and the next rescue pass of awa maintain sends them back to retry, the "
            "attempt counted. Only for a worker known dead: a live one keeps a job it "
            "heartbeats before that pass.")
        expect(page.locator("#confirm-jobs-ok")).to_have_text("Release worker")
        assert _leases_running(db, "dead-w") == [True, True]  # nothing sent yet
        page.click("#confirm-jobs-ok")
        expect(page.locator("#status")).to_have_text(
            "Released worker dead-w: the leases of 2 running jobs ended.")
        assert _leases_running(db, "dead-w") == [False, False]
        with db.connect() as conn:
            assert conn.execute("select awa.rescue_expired()").fetchone()[0] == 2
        expect(page.locator("#job-state")).not_to_have_text("running")
        expect(page.locator("#release-worker")).to_be_disabled()


def test_the_failed_list_refreshes_without_the_jobs_args_and_whole_errors(db, page):
    """A producer's 1 MB args and a worker's long error: the queue page's
    refresh reads brief rows, not megabytes a job every 3 seconds; the job
    page has the whole of them."""
    from playwright.sync_api import expect

    error = "card declined\n" + "at frame()\n" * 100_000  # 1 MB: a stack trace
    with db.connect() as conn:
        ids = [r[0] for r in conn.execute(
            "select (awa.enqueue('heavy', 'big', jsonb_build_object('blob', repeat(md5(i::text),"
            " 32768)), 2::smallint, null, null, 1)).job_id from generate_series(1, 3) as i"
        ).fetchall()]
        conn.execute("select count(awa.fail(c.job_id, c.run_lease, %s))"
                     " from awa.claim(array['heavy'], 3, 'w') as c", [error])
    sizes = []

    def listed(response):
        if "/api/queues/heavy/jobs?" in response.url:
            sizes.append(len(response.body()))

    page.on("response", listed)
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/queues/heavy")
        rows = page.locator("#failed-jobs tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.first).to_contain_text("card declined at frame() at frame()")
        assert sizes and max(sizes) < 10_000, sizes
        rows.first.locator("a.job-link").click()
        expect(page).to_have_url(f"{base}/jobs/{ids[0]}")
        expect(page.locator("#job-args")).to_contain_text('"blob": "c4ca4238')
        expect(page.locator("#job-error")).to_contain_text("card declined")
        assert page.locator("#job-error").text_content() == error[:65536]  # what awa.fail keeps


def test_a_refresh_waits_for_the_one_before_instead_of_piling_up(db, page):
    """A read slower than the 3 s refresh (a huge queue, a slow database): the
    page sent another every 3 s while the first was unanswered, and more the
    slower the server got. A refresh starts 3 s after the one before ended.
    The page's clock is Playwright's: time moves only when the test says."""
    from datetime import datetime, timedelta

    enqueue_jobs(db, "slow", 2)
    page.add_init_script("""
        window.__fetches = [];
        const send = window.fetch;
        window.fetch = (...args) => {
            window.__fetches.push(String(args[0]));
            return send(...args);
        };
    """)
    details = "window.__fetches.filter((u) => u.endsWith('/api/queues/slow')).length"
    refreshed = "document.getElementById('app').dataset.refreshed"
    held = []
    hold = [True]

    def answer_later(route):
        if hold[0]:
            held.append(route)
        else:
            route.continue_()

    start = datetime.now()
    page.clock.install(time=start)
    page.clock.pause_at(start + timedelta(seconds=1))
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/queues/slow")
        page.wait_for_function(f"() => {refreshed}")  # a function: the page's CSP forbids eval
        first = page.evaluate(details)
        page.route(re.compile(r"/api/queues/slow$"), answer_later)
        page.clock.run_for(3_000)
        assert page.evaluate(details) == first + 1
        page.clock.run_for(30_000)  # ten refreshes' time, that one still unanswered
        assert page.evaluate(details) == first + 1
        for _ in range(1_000):  # Playwright hands the route over between its calls
            if held:
                break
            page.evaluate("0")
        assert len(held) == 1
        hold[0] = False
        before = page.evaluate(refreshed)
        held.pop().continue_()
        page.wait_for_function(f"b => {refreshed} !== b", arg=before)
        page.clock.run_for(3_000)  # and refreshes go on
        assert page.evaluate(details) == first + 2


def test_a_job_page_reads_the_jobs_args_once_not_on_every_refresh(db, page):
    """A producer's 1 MB of args: the job page read them every 3 s. It reads
    them when the job changes state or attempt, and its refresh without them."""
    from playwright.sync_api import expect

    with db.connect() as conn:
        job_id = conn.execute(
            "select (awa.enqueue('heavy', 'big', jsonb_build_object('blob',"
            " repeat(md5('1'), 32768)))).job_id").fetchone()[0]
    sizes = []

    def read(response):
        if f"/api/jobs/{job_id}" in response.url:
            sizes.append(len(response.body()))

    page.on("response", read)
    with serve_cli(db.dsn(reader_login(db))) as base:
        page.goto(f"{base}/jobs/{job_id}")
        expect(page.locator("#job-state")).to_have_text("ready")
        expect(page.locator("#job-args")).to_contain_text('"blob": "c4ca4238')
        assert max(sizes) > 1_000_000
        shown = len(sizes)
        with page.expect_response(lambda r: f"/api/jobs/{job_id}" in r.url):
            pass  # the next refresh
        with db.connect() as conn:
            assert claim(conn, ["heavy"], 1, worker="w-1")
        expect(page.locator("#job-state")).to_have_text("running")
        expect(page.locator("#job-worker")).to_have_text("w-1")
        expect(page.locator("#job-args")).to_contain_text('"blob": "c4ca4238')
        with page.expect_response(lambda r: f"/api/jobs/{job_id}" in r.url):
            pass  # a refresh after the change
        later = sizes[shown:]
        # Refreshes without the args; the args once more for the new state.
        assert sum(size > 1_000_000 for size in later) == 1, later
        assert sum(size < 10_000 for size in later) >= 2, later


def test_another_site_cannot_frame_the_page_under_its_own(db, page):
    """A page on another site framed the admin page (its Host is the admin's
    own, which the Host check allows) under buttons of its own: clickjacking
    of Change S, Pause, Retry. The pages forbid framing and any script,
    style or fetch but their own (Content-Security-Policy)."""
    from playwright.sync_api import expect

    enqueue_jobs(db, "framed", 1)
    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.set_content(f'<iframe id="admin" src="{base}/queues/framed"></iframe>')
        framed = [f for f in page.frames if f != page.main_frame]
        assert len(framed) == 1
        assert not framed[0].url.startswith(base), framed[0].url
        assert page.frame_locator("#admin").locator("#app").count() == 0
        page.goto(f"{base}/queues/framed")  # on its own it works, the lane bars drawn
        expect(page.locator("#lanes-table tbody tr")).to_have_count(4)
        bar = page.locator("#lanes-table td.bar span").first
        assert bar.evaluate("b => b.style.width") in ("100%", "0%")
        got = page.request.get(f"{base}/queues/framed")
        policy = got.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy
        assert got.headers["x-frame-options"] == "DENY"


# The reads a page could embed to keep the admin's database busy, and /metrics.
EMBEDDED_READS = ("/api/queues/embedded/drop/plan?discard_finished=true",
                  "/api/failures?limit=1000", "/api/queues/embedded/jobs/retry/plan",
                  "/api/queues/embedded/jobs?limit=1000", "/metrics")


@contextmanager
def _another_site(base: str) -> Iterator[int]:
    """A web server on 127.0.0.1 (a loopback page: the browser lets it reach
    the admin's address) whose page embeds the admin's reads as images and
    fetches them (no-cors) as any page may; yields its port."""
    images = "".join(f'<img src="{base}{path}" onload="window.__loaded++" '
                     'onerror="window.__loaded++">' for path in EMBEDDED_READS)
    paths = ", ".join(f'"{base}{path}"' for path in EMBEDDED_READS)
    page = (f"<!doctype html><script>window.__loaded = 0; Promise.allSettled([{paths}]"
            ".map((u) => fetch(u, {mode: 'no-cors'}))).then(() => { window.__fetched = true; })"
            f"</script>{images}").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_args):
            """Quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_page_of_another_site_cannot_make_the_admin_read(db, page):
    """A page the operator opens embeds the admin's costliest reads as
    images and fetches: it could not read them, but each load made the
    database read. The browser says the request is cross-site (a page named
    localhost) or same-site (another port of 127.0.0.1): 403 before any
    read. The admin page's own reads (same-origin) and writes still work."""
    from playwright.sync_api import expect

    enqueue_jobs(db, "embedded", 3)
    answers: list[tuple[str, int]] = []
    page.on("response", lambda r: answers.append((r.url, r.status))
            if r.url.startswith(base) else None)
    with (serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base,
          _another_site(base) as port):
        # The page fixture lets the browser reach 127.0.0.1 only; this page too.
        page.route(re.compile(rf"^http://localhost:{port}/"), lambda route: route.continue_())
        for other in (f"http://localhost:{port}/", f"http://127.0.0.1:{port}/"):
            answers.clear()
            page.goto(other)
            page.wait_for_function(
                f"window.__fetched && window.__loaded === {len(EMBEDDED_READS)}")
            # Each read sent, each refused (the browser may send an image and
            # a fetch of one URL once).
            assert set(answers) == {(f"{base}{path}", 403) for path in EMBEDDED_READS}, (
                other, answers)

        answers.clear()
        page.goto(f"{base}/queues/embedded")
        expect(page.locator("#summary")).to_contain_text("3")
        page.fill("#token", TOKEN)
        page.click("#pause")
        expect(page.locator("#status")).to_have_text("Paused.")
        assert answers and all(status == 200 for _, status in answers), answers
    with db.connect() as conn:
        assert conn.execute("select paused from awa.queue_overview"
                            " where queue = 'embedded'").fetchone()[0] is True


MARKUP = '"><img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b>'
BIDI = "\u202eSREDRO"


def test_what_producers_workers_and_runtimes_write_is_shown_as_text(db, page):
    """Queue names, kinds, args, ordering keys, errors, worker names and a
    runtime's host are the producers' and workers' own: the pages show them
    as text, never as markup (the policy would stop a script, not markup),
    and a bidi override in them as its escape."""
    import json
    import uuid
    from urllib.parse import quote

    from playwright.sync_api import expect

    queue = "q" + MARKUP
    with db.connect() as conn:
        conn.execute("select awa.enqueue(%s, %s, %s::jsonb, 2::smallint, %s::bytea, null, 1)",
                     [queue, "k" + MARKUP, json.dumps({"a": MARKUP}), MARKUP.encode()])
        (failed,) = claim(conn, [queue], 1, worker="w" + MARKUP)
        conn.execute("select awa.fail(%s, %s, %s)", [failed[0], failed[1], "e" + MARKUP])
        conn.execute("select awa.enqueue(%s, %s)", [queue, "k" + MARKUP])
        (running,) = claim(conn, [queue], 1, worker="w" + MARKUP + BIDI)
        conn.execute("select awa.publish_runtime(%s, 'producer', %s, 1, %s, 0, %s::jsonb)",
                     [str(uuid.uuid4()), "h" + MARKUP, "v<b>1",
                      json.dumps([{"queue": queue, "activity": "enqueue", "age_seconds": 1}])])

    def no_markup():
        assert page.evaluate("window.__xss") is None
        assert page.locator("#app img, #app script, #app b").count() == 0

    with serve_cli(db.dsn(operator_login(db)), "--writable", token=TOKEN) as base:
        page.goto(f"{base}/")
        expect(page.locator("#queues tbody tr td").first).to_have_text(queue)
        page.click("#sum-failures")
        expect(page.locator("#failures-table tbody td").nth(1)).to_have_text("k" + MARKUP)
        no_markup()
        page.goto(f"{base}/queues/{quote(queue, safe='')}")
        expect(page.locator("h1")).to_have_text(queue)
        expect(page.locator("#failed-jobs tbody tr")).to_contain_text("e" + MARKUP)
        expect(page.locator("#runtimes-table tbody tr")).to_contain_text("h" + MARKUP)
        expect(page.locator("#runtimes-table tbody tr td").nth(3)).to_have_text(queue)
        page.fill("#token", TOKEN)
        page.click(".retry-one")
        expect(page.locator("#confirm-jobs-title")).to_contain_text(f"(k{MARKUP}, failed)")
        no_markup()
        page.goto(f"{base}/jobs/{failed[0]}")
        expect(page.locator("#job-error")).to_have_text("e" + MARKUP)
        expect(page.locator("#job-key")).to_have_text(MARKUP)
        expect(page.locator("#job-args")).to_contain_text('"a": "\\"><img')
        no_markup()
        page.goto(f"{base}/jobs/{running[0]}")
        # A right-to-left override would show the name reversed: shown as its escape.
        expect(page.locator("#job-worker")).to_have_text("w" + MARKUP + "\\u202eSREDRO")
        no_markup()
