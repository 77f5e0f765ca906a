// Sluice dashboard: one small script, no framework. Every page reads the JSON endpoints of
// the same origin (/api/...); the job page follows its job's log with server-sent events
// and fetches its data once per event (events that arrive during a fetch are coalesced
// into one more fetch). SVG (the DAG, the Gantt chart) is drawn here as markup.
"use strict";

const COLOURS = {
  CREATED: "#d9d9d9", SCHEDULED: "#c6dbef", DEPLOYING: "#9ecae1", INITIALIZING: "#6baed6",
  RUNNING: "#4292c6", FINISHED: "#74c476", CANCELING: "#fdd0a2", CANCELED: "#fd8d3c", FAILED: "#ef3b2c",
};
const EVENTS = 300; // the job page's events table: the last this many of the moment shown
const ATTEMPTS = 400; // the job page's attempts and Gantt chart: the ones that started last
const app = document.getElementById("app");
const AT = new URLSearchParams(location.search).get("at"); // a page opened at a past moment (?at=)
const stats = document.body.dataset; // counters a test (or a curious user) can read

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}
function when(ms) { return ms == null ? "" : new Date(ms).toISOString().replace("T", " ").replace("Z", ""); }
function secs(s) { return s == null ? "" : s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`; }
function badge(state) { return `<span class="badge" style="background:${COLOURS[state] || "#eee"}">${esc(state)}</span>`; }

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}
function fail(where, error) { where.innerHTML = `<p class="error">${esc(error.message)}</p>`; }

// A table of rows (objects); columns: [[heading, row => html]] (default: every key, as text).
function table(rows, columns, cls = "") {
  if (!rows.length) return `<p class="muted">none</p>`;
  columns = columns || Object.keys(rows[0]).map((k) => [k, (r) => esc(typeof r[k] === "object" && r[k] !== null ? JSON.stringify(r[k]) : r[k])]);
  const head = columns.map(([h]) => `<th>${esc(h)}</th>`).join("");
  const body = rows.map((r) => `<tr>${columns.map(([, f]) => `<td>${f(r)}</td>`).join("")}</tr>`).join("");
  return `<table class="${cls}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

// --- pages ---------------------------------------------------------------------------------

// At most one load() runs at a time; calls that come during it make one more (coalesced),
// after a pause as long as the load took (at least 250 ms): on a big log, where a view takes
// seconds to fold, a page that is told of changes all the time keeps the server at most half busy.
function coalesce(load) {
  let running = false, again = false;
  return async () => {
    if (running) { again = true; return; }
    running = true;
    try {
      do {
        again = false;
        stats.loads = Number(stats.loads) + 1;
        const began = performance.now();
        await load();
        if (again) await new Promise((done) => setTimeout(done, Math.max(250, performance.now() - began)));
      } while (again);
    } finally { running = false; }
  };
}

// Follow a server-sent stream of the log: onChange({entry, new}) per "changed" event; Redis
// going away is shown in `trouble` until the browser's reconnection succeeds.
function follow(url, onChange, trouble) {
  stats.sseEvents = 0; stats.loads = 0;
  const source = new EventSource(url);
  source.addEventListener("changed", (ev) => { stats.sseEvents = Number(stats.sseEvents) + 1; onChange(JSON.parse(ev.data)); });
  source.addEventListener("unavailable", (ev) => { trouble.textContent = `${JSON.parse(ev.data).error} · reconnecting…`; });
  source.onopen = () => { trouble.textContent = ""; };
  return source;
}

// A list page: at a past moment (?at=) loaded once; now, followed live (the cluster's facts and
// every job's: /api/events).
function liveOrAt(load) {
  if (AT) load();
  else follow("/api/events", coalesce(load), document.getElementById("trouble"));
}

function atQuery() { return AT ? `?at=${encodeURIComponent(AT)}` : ""; }
function atNote() {
  return AT ? `<p class="moment">As it was at ${esc(AT)} · <a href="${location.pathname}">now</a></p>` : "";
}

async function jobsPage() {
  app.innerHTML = `<h1>Jobs</h1>${atNote()}<p id="trouble" class="error"></p><div id="jobs"></div>`;
  const out = document.getElementById("jobs");
  const load = async () => {
    try {
      const jobs = await api(`/api/jobs${atQuery()}`);
      out.innerHTML = table(jobs, [
        ["job", (j) => `<a href="/jobs/${encodeURIComponent(j.job_id)}${atQuery()}">${esc(j.job_id)}</a>`],
        ["name", (j) => esc(j.name)], ["state", (j) => badge(j.status)],
        ["submitted", (j) => esc(when(j.submitted_at))], ["duration", (j) => esc(secs(j.duration_s))],
        ["tasks done", (j) => `${j.tasks_done} / ${j.tasks_total}`], ["restarts", (j) => esc(j.restarts)],
        ["reason", (j) => esc((j.reason || "").split("\n")[0])],
      ], "jobs");
    } catch (e) { fail(out, e); }
  };
  liveOrAt(load);
}

async function taskmanagersPage() {
  app.innerHTML = `<h1>TaskManagers</h1>${atNote()}<p id="trouble" class="error"></p><div id="tms"></div>`;
  const out = document.getElementById("tms");
  const load = async () => {
    try {
      const tms = await api(`/api/taskmanagers${atQuery()}`);
      out.innerHTML = table(tms, [
        ["TaskManager", (t) => esc(t.resource_id)], ["host", (t) => esc(t.host)], ["state", (t) => esc(t.state)],
        ["slots in use", (t) => `${t.slots_in_use} / ${t.slots_total}`],
        ["slots", (t) => Array.from({length: t.slots_total}, (_, i) => {
          const held = t.slots.filter((s) => s.slot === i);
          return `slot ${i}: ${held.length ? held.map((s) => `<a href="/jobs/${encodeURIComponent(s.job_id)}">${esc(s.job_id)}</a> ${esc(s.execution_id)}`).join(", ") : '<span class="muted">free</span>'}`;
        }).join("<br>")],
        ["last heartbeat", (t) => t.last_heartbeat == null ? "—" : `${esc(when(t.last_heartbeat))} <span class="muted">(${esc(secs((Date.now() - t.last_heartbeat) / 1000))} ago)</span>`],
        ["registered", (t) => esc(when(t.registered_at))], ["reason", (t) => esc(t.reason)],
      ], "taskmanagers");
    } catch (e) { fail(out, e); }
  };
  liveOrAt(load);
}

async function streamsPage() {
  app.innerHTML = `<h1>Streams <button id="refresh">Refresh</button></h1><div id="stats"></div>`;
  const out = document.getElementById("stats");
  const age = (s) => (s == null ? "" : secs(s));
  const load = async () => {
    try {
      const s = await api("/api/stats");
      const dead = s.dead_letters || {total: 0, by_reason: []};
      out.innerHTML = `<h2>Streams</h2>${table(s.streams, [
        ["stream", (r) => esc(r.stream)], ["kind", (r) => esc(r.kind)], ["length", (r) => esc(r.length)],
        ["memory", (r) => (r.memory_bytes == null ? "" : `${(r.memory_bytes / 1024).toFixed(1)} KiB`)],
        ["last entry", (r) => esc(r.last_entry ?? "")]], "streams")}
      <h2>Consumer groups</h2>${table(s.groups, [
        ["stream", (g) => esc(g.stream)], ["group", (g) => esc(g.group)], ["consumers", (g) => esc(g.consumers)],
        ["lag", (g) => esc(g.lag ?? "unknown")], ["pending", (g) => esc(g.pending)],
        ["oldest pending", (g) => esc(g.oldest_pending ?? "")], ["its age", (g) => esc(age(g.oldest_pending_age_s))]], "groups")}
      <h2>Dead letters: ${esc(dead.total)}</h2>${table(dead.by_reason, [
        ["stream kind", (d) => esc(d.kind)], ["reason", (d) => esc(d.reason)], ["count", (d) => esc(d.count)]], "dead-letters")}
      <h2>Events in the last ${esc(s.window_s)} s</h2>${table(s.events, [
        ["type", (e) => esc(e.type)], ["count", (e) => esc(e.count)], ["per second", (e) => esc(e.rate_per_s)],
        ["where", (e) => esc(Object.entries(e.by_kind).map(([k, n]) => `${k} ${n}`).join(", "))]], "events")}`;
    } catch (e) { fail(out, e); }
  };
  document.getElementById("refresh").onclick = load;
  await load();
}

function stateBox(jobId = "") {
  return `<form class="state-box">
    <label>job <input name="job" value="${esc(jobId)}" required></label>
    <label>name <input name="name" placeholder="word-counts" required></label>
    <label>key <input name="key" required></label>
    <label>type <select name="type"><option>string</option><option>long</option></select></label>
    <button type="submit">Look up</button></form><div class="state-result"></div>`;
}
function wireStateBox(root) {
  const form = root.querySelector(".state-box"), out = root.querySelector(".state-result");
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    const f = new FormData(form), part = (k) => encodeURIComponent(f.get(k));
    out.className = "state-result";
    out.textContent = "…";
    try {
      const found = await api(`/api/state/${part("job")}/${part("name")}/${part("key")}?type=${part("type")}`);
      out.innerHTML = found.value == null
        ? `<p class="muted">no value for this key (key group ${esc(found.key_group)}, vertex ${esc(found.vertex)})</p>`
        : `<pre>${esc(JSON.stringify(found.value, null, 2))}</pre><p class="muted">key group ${esc(found.key_group)}, vertex ${esc(found.vertex)}, state ${esc(found.state_id)} at ${esc(found.address)}</p>`;
    } catch (e) { out.className = "state-result error"; out.textContent = e.message; }
  };
}

function statePage() {
  app.innerHTML = `<h1>Queryable state</h1>${stateBox()}`;
  wireStateBox(app);
}

// --- the job page ----------------------------------------------------------------------------

function dag(graph) {
  const layer = {}, incoming = {};
  graph.vertices.forEach((v) => { layer[v.id] = 0; incoming[v.id] = []; });
  graph.edges.forEach((e) => incoming[e.target] && incoming[e.target].push(e.source));
  for (let round = 0; round < graph.vertices.length; round++) {  // longest path from a source
    graph.vertices.forEach((v) => incoming[v.id].forEach((s) => { layer[v.id] = Math.max(layer[v.id], (layer[s] ?? 0) + 1); }));
  }
  const rows = {}, pos = {}, W = 190, H = 70;
  graph.vertices.forEach((v) => {
    const l = layer[v.id], r = (rows[l] = (rows[l] ?? -1) + 1);
    pos[v.id] = {x: 20 + l * (W + 70), y: 20 + r * (H + 30)};
  });
  const width = 40 + (Math.max(0, ...Object.values(layer)) + 1) * (W + 70), height = 40 + (Math.max(0, ...Object.values(rows)) + 1) * (H + 30);
  const edges = graph.edges.map((e) => {
    const a = pos[e.source], b = pos[e.target];
    if (!a || !b) return "";
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    return `<g class="edge"><path d="M${x1},${y1} C${x1 + 35},${y1} ${x2 - 35},${y2} ${x2 - 6},${y2}" marker-end="url(#arrow)"${e.exchange === "keyed" ? ' stroke-dasharray="5,4"' : ""}/>
      <text x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 - 6}">${esc(e.exchange)}${e.key ? " by " + esc(e.key) : ""}</text></g>`;
  }).join("");
  const nodes = graph.vertices.map((v) => {
    const {x, y} = pos[v.id], counts = Object.entries(v.states).map(([s, n]) => `${s} ${n}`).join(", ");
    return `<g class="vertex" data-vertex="${esc(v.id)}" data-status="${esc(v.status)}">
      <rect x="${x}" y="${y}" width="${W}" height="${H}" rx="8" fill="${COLOURS[v.status] || "#fff"}"/>
      <text x="${x + 10}" y="${y + 20}" class="name">${esc(v.name)} ×${esc(v.parallelism)}</text>
      <text x="${x + 10}" y="${y + 40}" class="status">${esc(v.status)}</text>
      <text x="${x + 10}" y="${y + 58}" class="counts">${esc(counts)}</text></g>`;
  }).join("");
  return `<svg class="dag" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="ExecutionGraph">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>
    ${edges}${nodes}</svg>`;
}

function gantt(attempts, endMs) {
  if (!attempts.length) return `<p class="muted">no attempts yet</p>`;
  const start = Math.min(...attempts.map((a) => a.states[0].at));
  const end = Math.max(start + 1, endMs, ...attempts.map((a) => a.ended_at ?? 0));
  const L = 170, W = 760, R = 22, x = (t) => L + ((t - start) / (end - start)) * W;
  const bars = attempts.map((a, i) => {
    const y = 24 + i * R, stop = a.ended_at ?? end;
    const segments = a.states.map((s, k) => {
      const next = k + 1 < a.states.length ? a.states[k + 1].at : stop;
      return `<rect x="${x(s.at)}" y="${y}" width="${Math.max(1, x(next) - x(s.at))}" height="${R - 6}" fill="${COLOURS[s.state] || "#ccc"}"><title>${esc(s.state)} ${esc(secs(s.duration_s))}</title></rect>`;
    }).join("");
    return `<g class="bar" data-attempt="${esc(`${a.vertex}:${a.subtask}:${a.attempt}`)}" data-final="${esc(a.final)}">
      <text x="4" y="${y + 12}">${esc(a.vertex)}[${a.subtask}] #${a.attempt}</text>${segments}</g>`;
  }).join("");
  const height = 30 + attempts.length * R;
  return `<svg class="gantt" width="${L + W + 20}" height="${height}" viewBox="0 0 ${L + W + 20} ${height}" role="img" aria-label="attempts over time">
    <text x="${L}" y="14" class="axis">${esc(when(start))}</text><text x="${L + W}" y="14" class="axis" text-anchor="end">+${esc(secs((end - start) / 1000))}</text>
    ${bars}</svg>`;
}

// Speculative execution: a speculative attempt, and which attempt of a race won or lost.
function race(a) {
  const marks = [...(a.speculative ? ["speculative"] : []), ...(a.race ? [a.race] : [])];
  return marks.length ? ` <span class="muted">(${esc(marks.join(", "))})</span>` : "";
}

function attemptsTable(attempts) {
  return table(attempts, [
    ["subtask", (a) => `${esc(a.vertex)}[${a.subtask}]`], ["attempt", (a) => esc(a.attempt) + race(a)], ["state", (a) => badge(a.final)],
    ["TaskManager", (a) => esc(a.taskmanager ?? "—")], ["slot", (a) => esc(a.slot ?? "—")],
    ["splits", (a) => a.splits.map((s) => `${esc(s.split)} <span class="muted">${esc(s.outcome)}</span>`).join(", ")],
    ["started", (a) => esc(when(a.started_at))], ["duration", (a) => esc(secs(a.duration_s))],
    ["states", (a) => a.states.map((s) => `${esc(s.state)} ${esc(secs(s.duration_s))}`).join(" → ")],
  ], "attempts");
}

async function jobPage(jobId) {
  const base = `/api/jobs/${encodeURIComponent(jobId)}`;
  app.innerHTML = `<h1>Job <span id="job-id">${esc(jobId)}</span> <span id="job-status"></span></h1>
    <p id="trouble" class="error"></p><p id="job-summary" class="muted"></p><p><a id="tms-then" href="/taskmanagers">TaskManagers at this moment</a></p>
    <section class="slider"><label>log entry <input type="range" id="slider" min="0" max="0" value="0"></label>
      <button id="live" disabled>Live</button> <span id="moment"></span> <span id="behind" class="muted"></span></section>
    <section><h2>ExecutionGraph</h2><div id="dag"></div></section>
    <section id="root-cause" hidden><h2>Root cause</h2><p id="root-text"></p><pre id="root-trace"></pre></section>
    <section><h2>Attempts</h2><div id="gantt"></div><div id="attempts"></div></section>
    <section><h2>Queryable state</h2><div id="kvstate"></div>${stateBox(jobId)}</section>
    <section><details><summary>Events (the last ${EVENTS})</summary><div id="events"></div></details></section>
    <section class="cancel" id="cancel-section"><h2>Cancel</h2><input type="password" id="token" placeholder="dashboard token" autocomplete="off">
      <button id="cancel">Cancel job</button> <span id="cancel-result"></span></section>`;
  wireStateBox(app);
  const $ = (id) => document.getElementById(id);
  const slider = $("slider");
  let entries = [], at = AT;

  function show(tl, graph, kv) {
    const job = tl.job;
    $("job-status").innerHTML = badge(job.status);
    $("cancel-section").hidden = ["FINISHED", "FAILED", "CANCELED"].includes(job.status) || at !== null;
    $("job-summary").textContent = `${job.name} · ${job.tasks_done} of ${job.tasks_total} tasks done · ${secs(job.duration_s)} · ${tl.restarts} restart${tl.restarts === 1 ? "" : "s"}`;
    $("dag").innerHTML = dag(graph);
    $("gantt").innerHTML = gantt(tl.attempts, at ? Number(at.split("-")[0]) : job.ended_at ?? Date.now());
    $("attempts").innerHTML = (tl.attempts_total > tl.attempts.length
      ? `<p class="muted">the ${tl.attempts.length} attempts that started last, of ${tl.attempts_total}</p>` : "") + attemptsTable(tl.attempts);
    $("kvstate").innerHTML = table(kv, [
      ["name", (r) => esc(r.name)], ["vertex", (r) => esc(r.vertex)],
      ["key groups registered", (r) => `${esc(r.registered_key_groups)} / ${esc(r.num_key_groups)}`],
      ["ranges", (r) => r.ranges.map((g) => `${esc(g.start)}–${esc(g.end)}: ${esc(g.state_id)} at ${esc(g.address)}`).join("<br>")]], "kvstate");
    const rc = tl.root_cause;
    $("root-cause").hidden = !rc;
    $("root-text").textContent = rc ? rc.text : "";
    $("root-trace").textContent = rc ? rc.traceback || "" : "";
    $("events").innerHTML = table(tl.events, [["time", (e) => esc(when(e.at))], ["entry", (e) => esc(e.entry)], ["kind", (e) => esc(e.kind)], ["what", (e) => esc(e.text)]], "events");
  }

  function placeSlider() {
    slider.max = Math.max(0, entries.length - 1);
    slider.value = at === null ? slider.max : Math.max(0, entries.indexOf(at));
    const i = Number(slider.value);
    $("moment").textContent = entries.length ? `${at === null ? "live: " : ""}entry ${i + 1} of ${entries.length} (${entries[i]}, ${when(Number(entries[i].split("-")[0]))})` : "";
    $("live").disabled = at === null;
    if (at === null) $("behind").textContent = "";
  }

  async function load() {  // one fetch of the page's data, at the slider's moment
    const q = at === null ? "" : `&at=${encodeURIComponent(at)}`;
    try {
      const [tl, graph, kv, now] = await Promise.all([api(`${base}?events=${EVENTS}&attempts=${ATTEMPTS}${q}`),
        api(`${base}/graph?${q.slice(1)}`), api(`${base}/kvstate?${q.slice(1)}`),
        at !== null && !entries.length ? api(`${base}?events=0&attempts=0`) : null]);  // opened at a past moment
      entries = (at === null ? tl : now || {entries}).entries;  // the slider's stops: every entry up to now
      show(tl, graph, kv);
      placeSlider();
      history.replaceState(null, "", at === null ? location.pathname : `?at=${encodeURIComponent(at)}`);
      $("tms-then").href = `/taskmanagers${at === null ? "" : `?at=${encodeURIComponent(at)}`}`;
      stats.shownAt = at ?? "live";
    } catch (e) { fail($("dag"), e); }
  }
  const refresh = coalesce(load);

  slider.addEventListener("change", () => {
    const i = Number(slider.value);
    at = i >= entries.length - 1 ? null : entries[i];
    refresh();
  });
  $("live").onclick = () => { at = null; refresh(); };
  $("cancel").onclick = async () => {
    const out = $("cancel-result");
    try {
      const token = $("token").value;
      const r = await api(`${base}/cancel`, {method: "POST", headers: token ? {Authorization: `Bearer ${token}`} : {}});
      out.className = ""; out.textContent = `cancel requested (the job was ${r.status})`;
    } catch (e) { out.className = "error"; out.textContent = e.message; }
  };

  const source = follow(`${base}/events`, ({entry}) => {
    if (at === null || !entries.length) refresh();  // the first event, or live: fetch
    else $("behind").textContent = `· the log has moved on to ${entry}: Live shows it`;  // the past stays
  }, $("trouble"));
  source.onerror = async () => {  // the browser retries a dropped stream by itself; a refused one is closed
    if (source.readyState !== EventSource.CLOSED) return;
    try { await api(base); fail($("dag"), new Error("the live stream was refused: reload the page")); } catch (e) { fail($("dag"), e); }
  };
}

// --- routing -----------------------------------------------------------------------------------

const path = location.pathname;
const route = path.startsWith("/jobs/") ? "jobs" : (path.slice(1) || "jobs");
document.querySelectorAll("nav a[data-nav]").forEach((a) => a.classList.toggle("here", a.dataset.nav === route));
if (path.startsWith("/jobs/")) jobPage(decodeURIComponent(path.slice("/jobs/".length)));
else if (path === "/taskmanagers") taskmanagersPage();
else if (path === "/streams") streamsPage();
else if (path === "/state") statePage();
else jobsPage();
