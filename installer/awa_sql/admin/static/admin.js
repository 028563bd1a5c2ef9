// awa admin: renders the queue list and the queue page from the JSON API and
// refreshes them every few seconds (3 s after the read before ended). Every value from the database is set as
// text (never as HTML), so queue names cannot inject markup.
(function () {
  "use strict";

  const REFRESH_MS = 3000;
  const body = document.body;
  const page = body.dataset.page;
  const queueName = body.dataset.queue;
  const jobId = body.dataset.job;
  const writable = body.dataset.writable === "true";
  const app = document.getElementById("app");

  // Characters a reader cannot see or that reorder the text around them
  // (bidi overrides, zero-width ones, controls but newline and tab), written
  // as their escapes, as the CLI writes them: a queue name, kind or worker
  // name a producer or worker chose cannot pass for another on the page.
  // Joiners that make up emoji and words are left as they are.
  const UNSHOWN = /(?![\n\t\u200c\u200d\u{E0020}-\u{E007F}])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/gu;

  function shown(text) {
    return String(text).replace(UNSHOWN, (c) => {
      const code = c.codePointAt(0);
      const hex = code.toString(16);
      if (code < 0x100) return `\\x${hex.padStart(2, "0")}`;
      if (code < 0x10000) return `\\u${hex.padStart(4, "0")}`;
      return `\\U${hex.padStart(8, "0")}`;
    });
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      // Through the CSSOM: the page's policy (style-src 'self') refuses a style attribute.
      else if (key === "style") node.style.cssText = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(shown(child)));
    }
    return node;
  }

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    if (value < 1) return `${Math.round(value * 1000)} ms`;
    if (value < 120) return `${value.toFixed(1)} s`;
    if (value < 7200) return `${(value / 60).toFixed(1)} min`;
    return `${(value / 3600).toFixed(1)} h`;
  }

  function number(value, digits) {
    if (value === null || value === undefined) return "–";
    return digits === undefined ? String(value) : Number(value).toFixed(digits);
  }

  function when(value) {
    if (!value) return "–";
    return new Date(value).toLocaleString();
  }

  function token() {
    const input = document.getElementById("token");
    return input ? input.value.trim() : "";
  }

  // Job ids, run leases and counters are bigint: an integer past 2^53, which
  // a number would round, keeps its digits as a string (the reviver's
  // source text). Every use of an id on the page is as text.
  function keepBigIntegers(_key, value, context) {
    if (typeof value === "number" && !Number.isSafeInteger(value) && context
        && /^-?\d+$/.test(context.source)) {
      return context.source;
    }
    return value;
  }

  async function api(method, path, payload) {
    const headers = { Accept: "application/json" };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      if (token()) headers.Authorization = `Bearer ${token()}`;
    }
    const response = await fetch(path, {
      method,
      headers,
      body: payload === undefined ? undefined : JSON.stringify(payload),
    });
    let data = null;
    try {
      data = JSON.parse(await response.text(), keepBigIntegers);
    } catch (_err) {
      data = { error: `HTTP ${response.status}` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  function queuePath(name) {
    return `/api/queues/${encodeURIComponent(name)}`;
  }

  function setStatus(text, kind) {
    const status = document.getElementById("status");
    if (!status) return;
    status.textContent = shown(text);
    status.className = kind || "";
  }

  function table(id, headers, rows) {
    return el("table", { id },
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows));
  }

  function replace(id, node) {
    const old = document.getElementById(id);
    if (old) old.replaceWith(node);
  }

  // -- queue list ---------------------------------------------------------------------

  async function loadQueues() {
    const { ok, data } = await api("GET", "/api/queues");
    if (!ok) {
      setStatus(data.error, "error");
      return;
    }
    const rows = data.map((q) => el("tr", {},
      el("td", {}, el("a", { href: `/queues/${encodeURIComponent(q.queue)}` }, q.queue)),
      el("td", { class: "num" }, q.enqueue_shards),
      el("td", {}, q.shard_mode),
      el("td", { class: "num" }, number(q.max_shards)),
      el("td", {}, q.paused ? "paused" : "active"),
      el("td", { class: "num" }, q.ready),
      el("td", { class: "num" }, q.running),
      el("td", { class: "num" }, q.failed),
      el("td", { class: "num" }, seconds(q.oldest_ready_age_seconds))));
    replace("queues", table("queues",
      ["Queue", "S", "Mode", "Max", "State", "Ready", "Running", "Failed, ever", "Lag"], rows));
    if (!data.length) replace("queues", el("p", { id: "queues" }, "No queues yet."));
    app.dataset.refreshed = String(Date.now());
    setStatus("");
  }

  function renderQueueList() {
    app.replaceChildren(
      el("h1", {}, "Queues"),
      el("p", { id: "status", role: "status" }),
      el("div", { id: "queues" }),
      el("section", { id: "failing" },
        el("h2", {}, "What is failing"),
        el("p", { class: "muted" },
          "The jobs that failed for good and are kept, by queue, kind and error. It reads " +
          "every failed job kept, so it runs when you ask, never on the refresh."),
        el("button", { type: "button", id: "sum-failures", onclick: () => refresh(loadFailures) },
          "Sum up failures"),
        el("div", { id: "failures" })));
  }

  async function loadFailures() {
    const { ok, status, data } = await api("GET", "/api/failures?limit=100");
    if (!ok) {
      setStatus(`${status}: ${data.error}`, "error");
      return;
    }
    const rows = data.groups.map((g) => el("tr", {},
      el("td", {}, el("a", { href: `/queues/${encodeURIComponent(g.logical_queue)}` },
        g.logical_queue)),
      el("td", {}, g.kind),
      el("td", { class: "error" }, oneLine(g.error, 80)),
      el("td", { class: "num" }, number(g.failed)),
      el("td", {}, when(g.first_failed_at)),
      el("td", {}, when(g.last_failed_at)),
      el("td", { class: "num" }, el("a", { class: "job-link",
        href: `/jobs/${encodeURIComponent(g.sample_job_id)}` }, g.sample_job_id))));
    replace("failures", rows.length
      ? el("div", { id: "failures" },
        table("failures-table", ["Queue", "Kind", "Error", "Failed", "First", "Last",
          "Last job"], rows),
        data.more ? el("p", { class: "muted" }, "More groups than shown.") : null,
        el("p", { class: "muted" }, `Summed up at ${when(new Date().toISOString())}.`))
      : el("p", { id: "failures", class: "muted" }, "No failed jobs are kept."));
  }

  // -- queue page ---------------------------------------------------------------------

  let current = null;

  function summary(q) {
    const item = (label, value, id) => el("div", { class: "stat" },
      el("span", { class: "label" }, label), el("span", { class: "value", id }, value));
    return el("section", { id: "summary", class: "stats" },
      item("S (enqueue shards)", q.enqueue_shards, "shards-value"),
      item("Shard mode", q.shard_mode, "mode-value"),
      item("Max shards", number(q.max_shards), "max-value"),
      item("State", q.paused ? "paused" : "active", "paused-value"),
      item("Ready", q.ready),
      item("Running", q.running),
      item("Scheduled", q.scheduled_at_cap ? `${q.scheduled}+` : q.scheduled),
      item("Failed, ever", q.failed),
      item("Lag (oldest ready)", seconds(q.oldest_ready_age_seconds)));
  }

  function laneState(lane) {
    if (lane.draining) return "draining";
    if (lane.above_s) return lane.walked ? "drained" : "retired";
    return "active";
  }

  function lanes(q) {
    const deepest = Math.max(1, ...q.lanes.map((l) => l.ready));
    const many = q.physical_queues.length > 1;
    const rows = q.lanes.map((l) => el("tr", { class: laneState(l), "data-shard": l.shard },
      many ? el("td", {}, l.queue) : null,
      el("td", { class: "num" }, l.shard),
      el("td", { class: "num" }, l.priority),
      el("td", { class: "num" }, l.ready),
      el("td", { class: "bar" }, el("span", {
        style: `width:${Math.round((100 * l.ready) / deepest)}%`,
      })),
      el("td", { class: "num" }, seconds(l.lag_seconds)),
      el("td", { class: "num" }, l.next_seq),
      el("td", {}, laneState(l))));
    const headers = [...(many ? ["Queue"] : []),
      "Shard", "Priority", "Ready", "", "Lag", "Next seq", "Lane"];
    return el("section", { id: "lanes" },
      el("h2", {}, `Lanes (${q.lanes.length})`),
      el("p", { class: "muted" },
        "New jobs land on shards below S. Lanes at or above S take no new jobs; " +
        "they are draining while they still hold ready jobs."),
      table("lanes-table", headers, rows));
  }

  function contention(q) {
    const rows = q.contention.map((c) => el("tr", {},
      el("td", {}, c.queue),
      el("td", { class: "num" }, c.samples),
      el("td", { class: "num" }, number(c.mean_waiters_per_held_lane, 2)),
      el("td", { class: "num" }, c.wait_share === null ? "–" : `${Math.round(c.wait_share * 100)}%`),
      el("td", { class: "num" }, number(c.enqueue_rate, 1)),
      el("td", {}, when(c.last_sample))));
    return el("section", { id: "contention" },
      el("h2", {}, "Contention (last minute)"),
      rows.length
        ? table("contention-table",
          ["Queue", "Samples", "Waiters per held lane", "Samples with waits", "Enqueues/s",
            "Last sample"], rows)
        : el("p", { class: "muted" },
          "No samples in the last minute (the auto-scaler's tick, awa.autoscale_tick(), " +
          "takes one each tick)."));
  }

  function changes(q) {
    const rows = q.shard_changes.map((c) => el("tr", {},
      el("td", {}, when(c.changed_at)),
      el("td", {}, c.queue),
      el("td", { class: "change" }, `${c.old_shards} → ${c.new_shards}`),
      el("td", { class: "num" }, c.lanes_created),
      el("td", {}, c.source),
      el("td", {}, c.changed_by)));
    return el("section", { id: "changes" },
      el("h2", {}, "Recent shard changes"),
      rows.length
        ? table("changes-table", ["When", "Queue", "S", "Lanes created", "Source", "By"], rows)
        : el("p", { id: "changes-table", class: "muted" }, "S has never changed."));
  }


  // -- the last hour: small SVG charts drawn here, from /history ----------------------

  const SVG = "http://www.w3.org/2000/svg";
  const CHART_W = 320;
  const CHART_H = 96;
  const PAD = { left: 40, right: 8, top: 8, bottom: 16 };

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function shortNumber(value) {
    if (value === null || value === undefined) return "–";
    if (Math.abs(value) >= 10000) return `${Math.round(value / 1000)}k`;
    if (Math.abs(value) >= 100) return String(Math.round(value));
    if (Number.isInteger(value)) return String(value);
    return value.toFixed(value < 10 ? 2 : 1);
  }

  function clock(ms) {
    const d = new Date(ms);
    return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
  }

  // One chart: a line over [since, until], the changes of S as dashed marks.
  function chart(id, title, h, key, opts) {
    const t0 = Date.parse(h.since);
    const t1 = Date.parse(h.until);
    const pts = h.points
      .filter((p) => p[key] !== null && p[key] !== undefined)
      .map((p) => [Date.parse(p.at), p[key]]);
    const last = pts.length ? pts[pts.length - 1][1] : null;
    const caption = el("figcaption", {},
      el("span", { class: "chart-title" }, title),
      el("span", { class: "chart-last" }, opts.format(last)));
    if (!pts.length) {
      return el("figure", { class: "chart-box", id },
        caption, el("p", { class: "muted chart-empty" }, opts.empty));
    }
    const top = Math.max(opts.floor || 0, ...pts.map((p) => p[1])) || 1;
    const x = (t) => PAD.left + ((t - t0) / Math.max(t1 - t0, 1)) * (CHART_W - PAD.left - PAD.right);
    const y = (v) => CHART_H - PAD.bottom - (v / top) * (CHART_H - PAD.top - PAD.bottom);
    let line = pts.map(([t, v]) => [x(t), y(v)]);
    if (opts.step) {  // S holds its value until the next sample
      line = line.flatMap((p, i) => (i ? [[p[0], line[i - 1][1]], p] : [p]));
    }
    const base = CHART_H - PAD.bottom;
    const marks = h.changes.map((c) => {
      const cx = x(Date.parse(c.at)).toFixed(1);
      return svg("line", { class: "change-mark", x1: cx, x2: cx, y1: PAD.top, y2: base },
        svg("title", {}, `S ${c.old_shards} → ${c.new_shards} (${c.source}) at ${when(c.at)}`));
    });
    const labels = opts.step ? h.changes.map((c) => svg("text", {
      class: "change-label", x: (x(Date.parse(c.at)) + 3).toFixed(1), y: PAD.top + 8,
    }, `${c.old_shards}→${c.new_shards}`)) : [];
    const picture = svg("svg", {
      class: "chart", viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img",
      "aria-label": title, "data-points": String(pts.length),
    },
    svg("line", { class: "axis", x1: PAD.left, x2: CHART_W - PAD.right, y1: base, y2: base }),
    svg("text", { class: "tick", x: PAD.left - 4, y: PAD.top + 4, "text-anchor": "end" },
      shortNumber(top)),
    svg("text", { class: "tick", x: PAD.left - 4, y: base, "text-anchor": "end" }, "0"),
    svg("text", { class: "tick", x: PAD.left, y: CHART_H - 2 }, clock(t0)),
    svg("text", { class: "tick", x: CHART_W - PAD.right, y: CHART_H - 2, "text-anchor": "end" },
      clock(t1)),
    ...marks,
    ...labels,
    svg("polyline", { class: "series",
      points: line.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(" ") }));
    return el("figure", { class: "chart-box", id }, caption, picture);
  }

  function historyCharts(h) {
    if (h === null) {
      return el("section", { id: "history" }, el("h2", {}, "Last hour"),
        el("p", { class: "muted" }, "This database keeps no queue history yet."));
    }
    const counted = "Counted by the auto-scaler's tick for queues in shadow or auto mode.";
    const noSamples = "No samples (is the auto-scaler tick running?).";
    const mode = `S (mode ${h.shard_mode}${h.max_shards ? `, max ${h.max_shards}` : ""})`;
    return el("section", { id: "history" },
      el("h2", {}, "Last hour"),
      el("p", { class: "muted" },
        `From the contention samples; dashed lines mark the ${h.changes.length} ` +
        `change${h.changes.length === 1 ? "" : "s"} of S in this hour.`),
      el("div", { class: "charts" },
        chart("chart-shards", mode, h, "shards",
          { step: true, floor: h.max_shards || 1, format: shortNumber, empty: noSamples }),
        chart("chart-rate", "Enqueues/s", h, "enqueue_rate",
          { format: shortNumber, empty: noSamples }),
        chart("chart-waiters", "Waiters per held lane", h, "waiters_per_held_lane",
          { format: shortNumber, empty: noSamples }),
        chart("chart-ready", "Ready jobs", h, "ready", { format: shortNumber, empty: counted }),
        chart("chart-lag", "Lag (oldest ready)", h, "lag_seconds",
          { format: seconds, empty: counted })));
  }

  function decisions(q) {
    if (q.decisions === null) {
      return el("section", { id: "decisions" }, el("h2", {}, "Auto-scaler decisions"),
        el("p", { class: "muted" }, "This database has no auto-scaler yet."));
    }
    const rows = q.decisions.map((d) => el("tr", { class: d.action },
      el("td", {}, d.repeats > 1
        ? `${when(d.decided_at)} – ${when(d.last_decided_at)}` : when(d.decided_at)),
      el("td", {}, d.action, d.repeats > 1
        ? el("span", { class: "repeats" }, ` ×${d.repeats}`) : null),
      el("td", { class: "change" },
        d.proposed_shards === null ? "–" : `${d.current_shards} → ${d.proposed_shards}`),
      el("td", {}, d.mode),
      el("td", { class: "num" }, number(d.mean_waiters, 2)),
      el("td", { class: "num" }, number(d.enqueue_rate, 1)),
      el("td", {}, d.reason || "")));
    return el("section", { id: "decisions" },
      el("h2", {}, "Auto-scaler decisions"),
      rows.length
        ? table("decisions-table",
          ["When", "Action", "S", "Mode", "Waiters", "Enqueues/s", "Reason"], rows)
        : el("p", { class: "muted" }, "No decisions for this queue yet."));
  }

  function runtimes(q) {
    const r = q.runtimes;
    if (r === null) {
      return el("section", { id: "runtimes" }, el("h2", {}, "Runtimes"),
        el("p", { class: "muted" }, "This database keeps no runtime snapshots."));
    }
    const p = r.producers;
    const sentence = p.since === null
      ? `${p.live} live producer${p.live === 1 ? "" : "s"}; S has not changed.`
      : `${p.on_current_s} of ${p.live} live producers have enqueued with S = ${p.shards} ` +
        "since the change.";
    const parts = [el("h2", {}, "Runtimes"), el("p", { id: "producers-on-s" }, sentence)];
    const e = r.lane_evidence;
    if (e) {
      parts.push(el("p", { id: "lane-evidence" },
        `From the lanes (every producer, ours or not): since the change to S = ${e.shards} ` +
        `at ${when(e.changed_at)}, ${e.enqueues_since} enqueues: ${e.below_s} on lanes < S, ` +
        `${e.at_or_above_s} on lanes ≥ S` +
        (e.on_new_lanes ? `, ${e.on_new_lanes} of them on the lanes the change added.` : ".")));
    }
    const rows = r.live.map((x) => el("tr", {},
      el("td", {}, x.kind),
      el("td", {}, `${x.hostname}:${x.pid}`),
      el("td", {}, x.version),
      el("td", {}, x.queues > 1 ? `${x.queue} (+${x.queues - 1})` : x.queue),
      el("td", {}, x.activity),
      el("td", { class: "num" }, number(x.shards)),
      el("td", {}, when(x.last_at)),
      el("td", { class: "num" }, x.in_flight),
      el("td", {}, when(x.last_seen))));
    parts.push(rows.length
      ? table("runtimes-table",
        ["Kind", "Host:pid", "Version", "Queue", "Does", "S at last", "Last at", "In flight",
          "Last seen"], rows)
      : el("p", { class: "muted" }, "No live runtime serves this queue."));
    return el("section", { id: "runtimes" }, parts);
  }

  async function changeShards(event) {
    event.preventDefault();
    const shards = Number(document.getElementById("new-shards").value);
    const plan = await api("GET",
      `${queuePath(queueName)}/enqueue-shards/plan?shards=${encodeURIComponent(shards)}`);
    if (!plan.ok) {
      setStatus(plan.data.error, "error");
      return;
    }
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent =
      shown(`Change S of ${queueName} from ${plan.data.old_shards} to ${plan.data.new_shards}?`);
    document.getElementById("confirm-text").textContent = shown(plan.data.consequence);
    document.getElementById("confirm-lanes").textContent = plan.data.lanes_created
      ? `${plan.data.lanes_created} new lanes will be created in the same transaction.`
      : "No lanes will be created.";
    dialog.dataset.shards = String(shards);
    dialog.showModal();
  }

  async function confirmShards() {
    const dialog = document.getElementById("confirm");
    const shards = Number(dialog.dataset.shards);
    dialog.close();
    const result = await api("PUT", `${queuePath(queueName)}/enqueue-shards`, { shards });
    if (result.ok) setStatus(`S is now ${shards}. ${result.data.consequence}`, "ok");
    else setStatus(`${result.status}: ${result.data.error}`, "error");
    await loadQueue();
  }

  async function saveMode(event) {
    event.preventDefault();
    const max = document.getElementById("max-shards").value.trim();
    const result = await api("PUT", `${queuePath(queueName)}/shard-mode`, {
      mode: document.getElementById("mode").value,
      max_shards: max === "" ? null : Number(max),
    });
    if (result.ok) setStatus("Shard mode saved.", "ok");
    else setStatus(`${result.status}: ${result.data.error}`, "error");
    await loadQueue();
  }

  async function setPaused(paused) {
    const result = await api("POST", `${queuePath(queueName)}/${paused ? "pause" : "resume"}`);
    if (result.ok) setStatus(paused ? "Paused." : "Resumed.", "ok");
    else setStatus(`${result.status}: ${result.data.error}`, "error");
    await loadQueue();
  }

  // -- jobs: a queue's failed jobs, a job's page, retry and cancel (ADR 025) -------------
  //
  // Every change is confirmed first in the jobs dialog, which says how many
  // jobs it takes (the bulk plan counts them), and sent with the token, as a
  // change of S is.

  const FAILED_PAGE = 20;
  let failedPages = [null];  // after_job_id of each page shown so far; the last is shown
  let failedShown = "";
  let pendingJobs = null;

  function jobPath(id) {
    return `/api/jobs/${encodeURIComponent(id)}`;
  }

  function oneLine(text, width) {
    if (!text) return "";
    const line = text.split(/\s+/).join(" ").trim();
    return line.length <= width ? line : `${line.slice(0, width - 1)}…`;
  }

  function tokenInput() {
    return el("label", {}, "Admin token ",
      el("input", { id: "token", type: "password", autocomplete: "off",
        placeholder: "AWA_ADMIN_TOKEN" }));
  }

  function askJobs(question, okLabel, action) {
    document.getElementById("confirm-jobs-title").textContent = shown(question);
    document.getElementById("confirm-jobs-ok").textContent = okLabel;
    pendingJobs = action;
    document.getElementById("confirm-jobs").showModal();
  }

  async function confirmJobs() {
    document.getElementById("confirm-jobs").close();
    const action = pendingJobs;
    pendingJobs = null;
    if (action) await action();
  }

  function jobsDialog() {
    return el("dialog", { id: "confirm-jobs" },
      el("h3", { id: "confirm-jobs-title" }),
      el("p", { id: "confirm-jobs-text", class: "muted" }, "Nothing is sent until you confirm."),
      el("button", { id: "confirm-jobs-ok", type: "button", onclick: confirmJobs }, "OK"),
      el("button", { id: "confirm-jobs-cancel", type: "button", onclick: () => {
        pendingJobs = null;
        document.getElementById("confirm-jobs").close();
      } }, "Cancel"));
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  function changeJob(j, action, reload) {
    const what = `job ${j.job_id} (${j.kind}, ${j.state}) of ${j.logical_queue}`;
    const question = action === "retry"
      ? `Retry 1 job: ${what}? It runs again now, with a fresh set of attempts.`
      : `Cancel 1 job: ${what}? It will not run again unless it is retried.`;
    askJobs(question, action === "retry" ? "Retry 1 job" : "Cancel 1 job", async () => {
      const result = await api("POST", `${jobPath(j.job_id)}/${action}`);
      if (result.ok) {
        setStatus(`Job ${j.job_id} ${action === "retry" ? "retried" : "cancelled"}: ` +
          `now ${result.data.state}.`, "ok");
      } else setStatus(`${result.status}: ${result.data.error}`, "error");
      await reload();
    });
  }

  // A bulk retry takes the state picked beside its button (failed or
  // cancelled, one a call: awa.retry_jobs); a cancel, ready and scheduled jobs.
  function retryState() {
    return document.getElementById("retry-state").value;
  }

  async function changeJobs(action) {
    const state = action === "retry" ? retryState() : null;
    const query = state ? `?state=${encodeURIComponent(state)}` : "";
    const plan = await api("GET", `${queuePath(queueName)}/jobs/${action}/plan${query}`);
    if (!plan.ok) {
      setStatus(`${plan.status}: ${plan.data.error}`, "error");
      return;
    }
    if (!plan.data.jobs) {
      setStatus(plan.data.question, "ok");
      return;
    }
    const label = `${action === "retry" ? "Retry" : "Cancel"} ${plural(plan.data.jobs, "job")}`;
    askJobs(plan.data.question, label, async () => {
      // At most the number the dialog named, and only jobs the plan could
      // count (its before): jobs that failed or came in while it was open
      // were not asked about.
      const result = await api("POST", `${queuePath(queueName)}/jobs/${action}`,
        { ...(state ? { state } : {}), max_jobs: plan.data.jobs, before: plan.data.before });
      if (result.ok) {
        // The state the call says it took, not the picker's (changed meanwhile).
        const taken = result.data.state ? `${result.data.state} ` : "";
        setStatus(`${action === "retry" ? "Retried" : "Cancelled"} ` +
          `${result.data.jobs} ${taken}job${result.data.jobs === 1 ? "" : "s"}.`, "ok");
      } else setStatus(`${result.status}: ${result.data.error}`, "error");
      failedPages = [null];
      await loadQueue();
    });
  }

  function pageLink(id, text, onclick) {
    return el("a", { href: "#", id, onclick: (event) => {
      event.preventDefault();
      onclick();
      refresh(loadQueue);
    } }, text);
  }

  function failedJobs(p) {
    const many = new Set(p.jobs.map((j) => j.queue)).size > 1;
    const rows = p.jobs.map((j) => el("tr", { "data-job-id": j.job_id },
      el("td", { class: "num" },
        el("a", { class: "job-link", href: `/jobs/${encodeURIComponent(j.job_id)}` }, j.job_id)),
      many ? el("td", {}, j.queue) : null,
      el("td", {}, j.kind),
      el("td", { class: "num" }, `${j.attempt}/${j.max_attempts}`),
      el("td", {}, when(j.finished_at)),
      el("td", { class: "error" }, oneLine(j.last_error, 80)),
      writable ? el("td", {}, el("button", { type: "button", class: "retry-one",
        onclick: () => changeJob(j, "retry", loadQueue) }, "Retry…")) : null));
    const first = failedPages[failedPages.length - 1] === null;
    const headers = ["Job", ...(many ? ["Queue"] : []), "Kind", "Attempts", "Failed at",
      "Last error", ...(writable ? [""] : [])];
    return el("section", { id: "failed" },
      el("h2", {}, "Failed jobs"),
      el("p", { class: "muted" },
        "Kept with their args for the queue's failed retention, oldest first. " +
        "Open one for its args, last error, attempts and times."),
      rows.length
        ? table("failed-jobs", headers, rows)
        : el("p", { id: "failed-jobs", class: "muted" },
          first ? "No failed jobs." : "No more failed jobs."),
      el("p", { class: "pager" },
        first ? null : pageLink("failed-first", "First page", () => { failedPages = [null]; }),
        first || p.next_after_job_id === null ? null : " · ",
        p.next_after_job_id === null ? null : pageLink("failed-next", "Next page",
          () => { failedPages.push(p.next_after_job_id); })));
  }

  async function loadFailed() {
    const after = failedPages[failedPages.length - 1];
    // Brief rows: no args, the error's first characters (a job's page has the rest).
    const { ok, status, data } = await api("GET", `${queuePath(queueName)}/jobs?state=failed` +
      `&brief=true&limit=${FAILED_PAGE}${after === null ? "" : `&after_job_id=${after}`}`);
    if (!ok) {
      setStatus(`${status}: ${data.error}`, "error");
      return;
    }
    // Redrawn only when it changed, so that a button is not replaced under the pointer.
    const shown = JSON.stringify([failedPages, data]);
    if (shown !== failedShown) {
      failedShown = shown;
      replace("failed", failedJobs(data));
    }
  }

  let currentJob = null;
  let jobShown = "";

  function jobFields(j) {
    const hex = j.ordering_key_hex === null ? "–" : `\\x${j.ordering_key_hex}`;
    const key = j.ordering_key ?? hex;
    const runLabel = { scheduled: "Runs at", ready: "Ready since", running: "Claimed" }[j.state];
    const fields = [
      ["State", j.state, "job-state"],
      ["Queue", el("a", { href: `/queues/${encodeURIComponent(j.logical_queue)}` },
        j.logical_queue), "job-queue"],
      ...(j.queue !== j.logical_queue ? [["Physical queue", j.queue, "job-physical"]] : []),
      ["Kind", j.kind, "job-kind"],
      ["Priority", j.priority, "job-priority"],
      ["Ordering key", key, "job-key"],
      ["Attempts", `${j.attempt} of ${j.max_attempts}`, "job-attempts"],
      ["Enqueued", when(j.enqueued_at), "job-enqueued"],
      ...(runLabel ? [[runLabel, when(j.run_at), "job-run-at"]] : []),
      ...(j.finished_at ? [["Finished", when(j.finished_at), "job-finished"]] : []),
      ...(j.worker ? [["Worker", j.worker, "job-worker"],
        ["Lease expires", when(j.lease_expires_at), "job-lease"]] : []),
    ];
    return el("section", { id: "job" },
      el("dl", { class: "fields" },
        fields.flatMap(([label, value, id]) => [el("dt", {}, label), el("dd", { id }, value)])),
      el("h2", {}, "Args"),
      el("pre", { id: "job-args" },
        j.args === null ? "(not kept for a completed job)" : JSON.stringify(j.args, null, 2)),
      el("h2", {}, "Last error"),
      el("pre", { id: "job-error" }, j.last_error || "–"));
  }

  async function loadJob() {
    // Without the args, read once more only when the job changed state or
    // attempt: a producer's 10 MB of args are not read every refresh.
    let { ok, status, data } = await api("GET", `${jobPath(jobId)}?args=false`);
    let argsRead = false;
    if (ok && currentJob && currentJob.state === data.state &&
        currentJob.attempt === data.attempt) {
      data.args = currentJob.args;
    } else if (ok) {
      ({ ok, status, data } = await api("GET", jobPath(jobId)));
      argsRead = true;
    }
    if (!ok) {
      setStatus(`${status}: ${data.error}`, "error");
      currentJob = null;
      jobShown = "";
      replace("job", el("section", { id: "job" }, el("p", { class: "muted" }, data.error)));
    } else {
      currentJob = data;
      const shown = JSON.stringify({ ...data, args: undefined });
      if (argsRead || shown !== jobShown) {
        jobShown = shown;
        replace("job", jobFields(data));
      }
    }
    const retry = document.getElementById("retry-job");
    const cancel = document.getElementById("cancel-job");
    const release = document.getElementById("release-worker");
    const state = currentJob ? currentJob.state : null;
    if (retry) retry.disabled = !["failed", "cancelled"].includes(state);
    if (cancel) cancel.disabled = !["scheduled", "ready", "running"].includes(state);
    if (release) release.disabled = state !== "running" || !currentJob.worker;
    app.dataset.refreshed = String(Date.now());
  }

  // awa.release_worker: every job the worker runs, in every queue, not only
  // this one; for a worker known dead (a live one loses the jobs it does
  // not heartbeat before the rescue).
  function releaseWorker(worker) {
    askJobs(`Release worker ${worker}? The leases of every job it runs, in every queue, ` +
      "end now, and the next rescue pass of awa maintain sends them back to retry, the " +
      "attempt counted. Only for a worker known dead: a live one keeps a job it heartbeats " +
      "before that pass.", "Release worker", async () => {
      const result = await api("POST",
        `/api/workers/${encodeURIComponent(worker)}/release`);
      if (result.ok) {
        setStatus(`Released worker ${worker}: the leases of ` +
          `${plural(result.data.released, "running job")} ended.`, "ok");
      } else setStatus(`${result.status}: ${result.data.error}`, "error");
      await loadJob();
    });
  }

  function jobControls() {
    if (!writable) return null;
    return el("section", { id: "controls" },
      el("h2", {}, "Change"),
      tokenInput(),
      el("div", {},
        el("button", { id: "retry-job", type: "button", disabled: true,
          onclick: () => currentJob && changeJob(currentJob, "retry", loadJob) }, "Retry…"),
        el("button", { id: "cancel-job", type: "button", disabled: true,
          onclick: () => currentJob && changeJob(currentJob, "cancel", loadJob) }, "Cancel…"),
        el("button", { id: "release-worker", type: "button", disabled: true,
          onclick: () => currentJob && currentJob.worker && releaseWorker(currentJob.worker) },
        "Release worker…")),
      jobsDialog());
  }

  function renderJobPage() {
    app.replaceChildren(...[
      el("h1", {}, `Job ${jobId}`),
      el("p", { id: "status", role: "status" }),
      el("section", { id: "job" }),
      jobControls()].filter((node) => node !== null));
  }

  function controls() {
    if (!writable) return null;
    return el("section", { id: "controls" },
      el("h2", {}, "Change"),
      tokenInput(),
      el("form", { id: "shards-form", onsubmit: changeShards },
        el("label", {}, "New S ",
          el("input", { id: "new-shards", type: "number", min: "1", max: "64", required: true })),
        el("button", { id: "change-shards", type: "submit" }, "Change S…")),
      el("form", { id: "mode-form", onsubmit: saveMode },
        el("label", {}, "Mode ",
          el("select", { id: "mode" },
            ["manual", "shadow", "auto"].map((m) => el("option", { value: m }, m)))),
        el("label", {}, " max ",
          el("input", { id: "max-shards", type: "number", min: "1", max: "64",
            placeholder: "none" })),
        el("button", { id: "save-mode", type: "submit" }, "Save mode")),
      el("div", {},
        el("button", { id: "pause", type: "button", onclick: () => setPaused(true) }, "Pause"),
        el("button", { id: "resume", type: "button", onclick: () => setPaused(false) },
          "Resume")),
      el("div", {},
        el("label", {}, "Retry ",
          el("select", { id: "retry-state", onchange: (event) => {
            document.getElementById("retry-jobs").textContent =
              `Retry ${event.target.value} jobs…`;
          } }, ["failed", "cancelled"].map((s) => el("option", { value: s }, s))),
          " jobs "),
        el("button", { id: "retry-jobs", type: "button", onclick: () => changeJobs("retry") },
          "Retry failed jobs…"),
        el("button", { id: "cancel-waiting", type: "button",
          onclick: () => changeJobs("cancel") }, "Cancel ready and scheduled jobs…")),
      jobsDialog(),
      el("dialog", { id: "confirm" },
        el("h3", { id: "confirm-title" }),
        el("p", { id: "confirm-text" }),
        el("p", { id: "confirm-lanes", class: "muted" }),
        el("button", { id: "confirm-ok", type: "button", onclick: confirmShards }, "Change S"),
        el("button", { id: "confirm-cancel", type: "button",
          onclick: () => document.getElementById("confirm").close() }, "Cancel")));
  }

  // A stripe (st#0) or a dropped queue (#dropped#4) has a page, but the jobs
  // reads and every change refuse a name with '#': its page sends none of them.
  const reservedName = page === "queue" && queueName.includes("#");

  function elsewhere(q) {
    const text = q.queue.startsWith("#dropped#")
      ? [`${q.queue} is a dropped queue: nothing can be changed on it and its jobs are not ` +
        "listed here. awa maintain removes it, or puts it back under its old name if a job " +
        "still reached it; a queue made since under the old name is a new queue, with its " +
        "own page."]
      : [`${q.queue} is a stripe of `,
        el("a", { id: "logical-link", href: `/queues/${encodeURIComponent(q.logical_queue)}` },
          q.logical_queue),
        ". Its failed jobs, pause and resume, retry and cancel, and changes of S and mode " +
        "are on that page, which covers all its stripes: they do not take a stripe's name."];
    return el("section", { id: "elsewhere" }, el("p", {}, ...text));
  }

  function renderQueuePage() {
    app.replaceChildren(...[
      el("h1", {}, queueName),
      el("p", { id: "status", role: "status" }),
      reservedName ? el("section", { id: "elsewhere" }) : null,
      el("section", { id: "summary" }),
      el("section", { id: "history" }),
      reservedName ? null : controls(),
      reservedName ? null : el("section", { id: "failed" }),
      el("section", { id: "lanes" }),
      el("section", { id: "contention" }),
      el("section", { id: "changes" }),
      el("section", { id: "decisions" }),
      el("section", { id: "runtimes" })].filter((node) => node !== null));
  }

  async function loadQueue() {
    const [{ ok, status, data }, past] = await Promise.all([
      api("GET", queuePath(queueName)),
      api("GET", `${queuePath(queueName)}/history`),
    ]);
    if (!ok) {
      setStatus(`${status}: ${data.error}`, "error");
      return;
    }
    replace("history", historyCharts(past.ok ? past.data : null));
    const first = current === null;
    if (!reservedName) await loadFailed();
    else if (first) replace("elsewhere", elsewhere(data));  // once: not redrawn under the pointer
    current = data;
    replace("summary", summary(data));
    replace("lanes", lanes(data));
    replace("contention", contention(data));
    replace("changes", changes(data));
    replace("decisions", decisions(data));
    replace("runtimes", runtimes(data));
    if (first && writable && !reservedName) {
      document.getElementById("new-shards").value = data.enqueue_shards;
      document.getElementById("mode").value = data.shard_mode;
      document.getElementById("max-shards").value = data.max_shards ?? "";
    }
    app.dataset.refreshed = String(Date.now());
  }

  async function refresh(load) {
    try {
      await load();
    } catch (err) {
      setStatus(`Cannot reach the admin server: ${err}`, "error");
    }
  }

  // Loads now, then REFRESH_MS after each load ends: never a second read
  // while one is unanswered, however slow the server or large the queue.
  async function every(load) {
    await refresh(load);
    setTimeout(() => every(load), REFRESH_MS);
  }

  if (page === "queue") {
    renderQueuePage();
    every(loadQueue);
  } else if (page === "job") {
    renderJobPage();
    every(loadJob);
  } else {
    renderQueueList();
    every(loadQueues);
  }
})();
