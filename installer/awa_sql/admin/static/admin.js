// awa admin: renders the queue list and the queue page from the JSON API and
// refreshes them every few seconds. Every value from the database is set as
// text (never as HTML), so queue names cannot inject markup.
(function () {
  "use strict";

  const REFRESH_MS = 3000;
  const body = document.body;
  const page = body.dataset.page;
  const queueName = body.dataset.queue;
  const writable = body.dataset.writable === "true";
  const app = document.getElementById("app");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
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
      data = await response.json();
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
    status.textContent = text;
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
      el("td", {}, q.paused ? "paused" : "running"),
      el("td", { class: "num" }, q.ready),
      el("td", { class: "num" }, q.running),
      el("td", { class: "num" }, q.failed),
      el("td", { class: "num" }, seconds(q.oldest_ready_age_seconds))));
    replace("queues", table("queues",
      ["Queue", "S", "Mode", "Max", "State", "Ready", "Running", "Failed", "Lag"], rows));
    if (!data.length) replace("queues", el("p", { id: "queues" }, "No queues yet."));
    app.dataset.refreshed = String(Date.now());
    setStatus("");
  }

  function renderQueueList() {
    app.replaceChildren(
      el("h1", {}, "Queues"),
      el("p", { id: "status", role: "status" }),
      el("div", { id: "queues" }));
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
      item("State", q.paused ? "paused" : "running", "paused-value"),
      item("Ready", q.ready),
      item("Running", q.running),
      item("Scheduled", q.scheduled),
      item("Failed", q.failed),
      item("Lag (oldest ready)", seconds(q.oldest_ready_age_seconds)));
  }

  function laneState(lane) {
    if (lane.draining) return "draining";
    if (lane.above_s) return "retired";
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
      el("td", {}, x.activity),
      el("td", { class: "num" }, number(x.shards)),
      el("td", {}, when(x.last_at)),
      el("td", { class: "num" }, x.in_flight),
      el("td", {}, when(x.last_seen))));
    parts.push(rows.length
      ? table("runtimes-table",
        ["Kind", "Host:pid", "Version", "Does", "S at last", "Last at", "In flight",
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
      `Change S of ${queueName} from ${plan.data.old_shards} to ${plan.data.new_shards}?`;
    document.getElementById("confirm-text").textContent = plan.data.consequence;
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

  function controls() {
    if (!writable) return null;
    return el("section", { id: "controls" },
      el("h2", {}, "Change"),
      el("label", {}, "Admin token ",
        el("input", { id: "token", type: "password", autocomplete: "off",
          placeholder: "AWA_ADMIN_TOKEN" })),
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
      el("dialog", { id: "confirm" },
        el("h3", { id: "confirm-title" }),
        el("p", { id: "confirm-text" }),
        el("p", { id: "confirm-lanes", class: "muted" }),
        el("button", { id: "confirm-ok", type: "button", onclick: confirmShards }, "Change S"),
        el("button", { id: "confirm-cancel", type: "button",
          onclick: () => document.getElementById("confirm").close() }, "Cancel")));
  }

  function renderQueuePage() {
    app.replaceChildren(...[
      el("h1", {}, queueName),
      el("p", { id: "status", role: "status" }),
      el("section", { id: "summary" }),
      el("section", { id: "history" }),
      controls(),
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
    current = data;
    replace("summary", summary(data));
    replace("lanes", lanes(data));
    replace("contention", contention(data));
    replace("changes", changes(data));
    replace("decisions", decisions(data));
    replace("runtimes", runtimes(data));
    if (first && writable) {
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

  if (page === "queue") {
    renderQueuePage();
    refresh(loadQueue);
    setInterval(() => refresh(loadQueue), REFRESH_MS);
  } else {
    renderQueueList();
    refresh(loadQueues);
    setInterval(() => refresh(loadQueues), REFRESH_MS);
  }
})();
