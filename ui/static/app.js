// shardmq operators' page: every number comes from the router's admin
// JSON endpoints, read with the token kept in sessionStorage. No data is
// written into the page as HTML: text only (textContent).
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN = "shardmq.token";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#e15759", "#bab0ac", "#ff9da7"];
const state = {
  qOffset: 0, qLimit: 50, sub: null, plan: null, redrive: null, colours: {}, timer: null, qtimer: null, rtimer: null,
  note: null, // {job, text, cls}: the resharding message about one job
  down: false, downSince: null, lastOK: null, // the router's reachability
  flowPrev: null, rates: new Map(), good: null, // queue table: flow counts, the last complete count
  alarms: [], queuesLive: false, queueProblem: null, // from the queue table's answer
  topology: null, ready: null, archive: null, // for the banners
  dl: { cursor: "", back: [], next: "" }, // the dead-letter list's paging
};

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

// Times: the API speaks UTC (RFC 3339); the page shows UTC with the zone
// named, and the browser's local time on hover.
function fmtTime(iso) {
  const d = iso instanceof Date ? iso : new Date(iso);
  if (!iso || isNaN(d)) return iso ? String(iso) : "";
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "").replace(/Z$/, "") + " UTC";
}

function timeEl(iso) {
  if (!iso) return el("span", { class: "muted" }, "–");
  const d = iso instanceof Date ? iso : new Date(iso);
  if (isNaN(d)) return el("span", {}, String(iso));
  if (d.getUTCFullYear() < 1971) return el("span", { class: "muted" }, "never"); // Go's zero time
  return el("time", { datetime: d.toISOString(), title: "local: " + d.toLocaleString(undefined, { timeZoneName: "short" }) }, fmtTime(d));
}

function ago(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return s + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  return Math.round(s / 86400) + " d";
}

// api calls the router with the token; a 401 signs out. A request that
// gets no answer at all marks the router unreachable; any answer marks it
// reachable again.
async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Bearer " + sessionStorage.getItem(TOKEN) } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, opts);
  } catch (e) {
    markDown();
    const err = new Error("no answer from the router (" + e.message + ")");
    err.network = true;
    throw err;
  }
  markUp();
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (resp.status === 401) {
    signOut("the token was refused: " + errText(data));
    throw new Error("unauthorized");
  }
  if (!resp.ok) throw new Error(errText(data) || resp.statusText);
  return data;
}

function errText(data) {
  return data && data.error ? data.error.code + ": " + data.error.message : "";
}

function markDown() {
  if (!state.down) {
    state.down = true;
    state.downSince = new Date();
  }
  $("app").classList.add("stale");
  document.querySelector("header").classList.add("down");
  $("status").textContent = "router unreachable";
  banners();
}

function markUp() {
  state.lastOK = new Date();
  if (!state.down) return;
  state.down = false;
  state.downSince = null;
  $("app").classList.remove("stale");
  document.querySelector("header").classList.remove("down");
  banners();
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN);
  for (const t of [state.timer, state.qtimer, state.rtimer]) clearTimeout(t);
  $("app").hidden = true;
  $("login").hidden = false;
  $("signout").hidden = true;
  $("banners").replaceChildren();
  $("status").textContent = "not signed in";
  $("loginerr").textContent = why || "";
}

async function signIn() {
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN, t);
  $("token").value = "";
  start();
}

function start() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  $("loginerr").textContent = "";
  tick();
  queues();
  retention();
}

// confirmAction asks before anything that moves or deletes data: a modal
// with what will happen; with typed set, OK stays disabled until exactly
// that text is typed.
function confirmAction({ title, text, ok, typed }) {
  const d = $("confirm");
  $("cftitle").textContent = title;
  $("cftext").textContent = text;
  $("cfok").textContent = ok || "OK";
  $("cftypedrow").hidden = !typed;
  $("cfword").textContent = typed || "";
  $("cftyped").value = "";
  $("cfok").disabled = !!typed;
  return new Promise((resolve) => {
    const done = (v) => {
      $("cfok").onclick = $("cfcancel").onclick = $("cftyped").oninput = d.oncancel = null;
      if (d.open) d.close();
      resolve(v);
    };
    $("cftyped").oninput = () => { $("cfok").disabled = $("cftyped").value !== typed; };
    $("cfok").onclick = () => { if (!typed || $("cftyped").value === typed) done(true); };
    $("cfcancel").onclick = () => done(false);
    d.oncancel = () => done(false);
    d.showModal();
    (typed ? $("cftyped") : $("cfcancel")).focus();
  });
}

// --- banners: what an operator must see first

function banner(kind, cls, ...parts) {
  return el("div", { class: "banner " + cls, "data-banner": kind }, ...parts);
}

function banners() {
  const out = [];
  if (state.down) {
    out.push(banner("down", "down", el("strong", {}, "Router unreachable"), " since ", timeEl(state.downSince),
      ": it does not answer. Everything below is what it said last" + (state.lastOK ? " (at " + fmtTime(state.lastOK) + ")" : "") +
      ", greyed out; actions are off until it answers again."));
  }
  const r = state.ready;
  // degraded: ready, but some clusters cannot be served (the banner of
  // missing clusters below names them).
  if (r && r.status && r.status !== "ready" && r.status !== "degraded") {
    out.push(banner("notready", "bad", el("strong", {}, "Router not ready: "), r.reason || r.status));
  }
  const missing = new Map();
  const addMissing = (list, where) => { for (const c of list || []) missing.set(c, (missing.get(c) || []).concat(where)); };
  addMissing(state.topology && state.topology.missing_clusters, "topology");
  addMissing(r && r.missing_clusters, "readiness");
  if (state.queueProblem) addMissing(state.queueProblem.missing, "queue counts");
  if (missing.size) {
    out.push(banner("missing", "bad", el("strong", {}, "Clusters not answering: "),
      [...missing].map(([c, w]) => c + " (" + w.join(", ") + ")").join("; ")));
  }
  const unserved = [];
  for (const c of (state.topology && state.topology.clusters) || []) {
    const prim = (c.endpoints || []).find((e) => e.role === "primary");
    if (c.state && c.state !== "serving") unserved.push(c.name + " is " + c.state + (c.detail ? " (" + c.detail + ")" : ""));
    else if (prim && prim.health !== "ok") unserved.push(c.name + "'s primary is " + prim.health);
    else if (c.vshards > 0 && !prim) unserved.push(c.name + " has no primary");
  }
  if (unserved.length) {
    out.push(banner("unserved", "bad", el("strong", {}, "Clusters not served: "), unserved.join("; "),
      " — requests for their vshards are answered 503 until they are back."));
  }
  for (const a of state.alarms) {
    out.push(banner("alarm", "bad", el("strong", {}, "Dead-letter alarm: "), a.topic + "/" + a.subscription + " has " + a.dead_letters +
      " dead letters, +" + Math.round(a.growth_percent) + " % over " + (a.window || "1h") + " (from " + a.dead_letters_window_start +
      "; the alarm fires above " + a.threshold_percent + " %), firing since ", timeEl(a.at), " ",
      el("button", { "data-act": "pick", onclick: () => pickSub(a.topic, a.subscription) }, "show")));
  }
  const q = state.queueProblem;
  if (q && q.text) out.push(banner("stale", q.cls, el("strong", {}, "Stale counts: "), q.text));
  if (state.archive === "unreachable") {
    out.push(banner("archive", "warn", el("strong", {}, "Archive cluster unreachable: "),
      "months past the hot window wait on their clusters; traces of archived months answer from the hot clusters only."));
  }
  $("banners").replaceChildren(...out);
}

// --- the map, the clusters and the jobs: every 2 s

async function tick() {
  clearTimeout(state.timer);
  try {
    const [map, top, jobs] = await Promise.all([
      api("GET", "/v1/admin/shardmap"), api("GET", "/v1/admin/topology"), api("GET", "/v1/admin/reshard").catch((e) => {
        if (e.network) throw e;
        return { jobs: [] };
      }),
    ]);
    state.topology = top;
    drawMap(map, jobs.jobs || [], (top.clusters || []).map((c) => c.name));
    drawClusters(top);
    drawJobs(jobs.jobs || []);
    await readiness();
    $("status").textContent = "live · refreshed " + fmtTime(new Date());
  } catch (e) {
    if (e.message === "unauthorized") return;
    if (!e.network) $("status").textContent = "refresh failed: " + e.message;
  }
  banners();
  if (sessionStorage.getItem(TOKEN)) state.timer = setTimeout(tick, 2000);
}

// readiness reads /readyz (open, no token): 503 with its reason is an
// answer too.
async function readiness() {
  try {
    const resp = await fetch("/readyz");
    state.ready = await resp.json();
  } catch (e) {
    state.ready = null;
  }
}

function colour(cluster) {
  if (!(cluster in state.colours)) state.colours[cluster] = PALETTE[Object.keys(state.colours).length % PALETTE.length];
  return state.colours[cluster];
}

const terminal = (s) => ["done", "aborted", "failed"].includes(s);
const active = (s) => !terminal(s);

function drawMap(map, jobs, names) {
  const grid = $("grid");
  if (grid.children.length !== 1024) {
    grid.replaceChildren();
    for (let v = 0; v < 1024; v++) grid.append(el("div", { "data-v": v }));
  }
  const moving = new Map();
  for (const j of jobs.filter((j) => active(j.state))) {
    for (const r of j.ranges || []) for (let v = r.from; v <= r.to; v++) moving.set(v, r.target);
  }
  const counts = {};
  for (const r of map.ranges || []) {
    for (let v = r.from; v <= r.to; v++) {
      const d = grid.children[v];
      let cls = r.state === "frozen" ? "frozen" : "";
      let title = "vshard " + v + " · " + r.cluster + " · " + r.state;
      if (moving.has(v)) { cls += " moving"; title += " · moving to " + moving.get(v); }
      d.className = cls.trim();
      d.style.backgroundColor = colour(r.cluster);
      d.title = title;
      counts[r.cluster] = (counts[r.cluster] || 0) + 1;
    }
  }
  const legend = $("legend");
  legend.replaceChildren();
  for (const c of names.concat(map.clusters || [], Object.keys(counts)).filter((c, i, a) => a.indexOf(c) === i)) {
    const s = el("span", { "data-cluster": c }, c + " (" + (counts[c] || 0) + ")");
    s.style.setProperty("--c", colour(c));
    legend.append(s);
  }
  legend.append(el("span", { class: "frozen" }, "frozen"), el("span", { class: "moving" }, "moving"));
  $("mapinfo").textContent = "version " + map.version + " · " + (map.ranges || []).length + " ranges";
}

function healthClass(h) {
  return h === "ok" || h === "closed" || h === "serving" ? "h-ok" : h === "lagging" || h === "half-open" ? "h-warn" : "h-bad";
}

function drawClusters(top) {
  const body = $("clusters").tBodies[0];
  body.replaceChildren();
  const missing = new Set(top.missing_clusters || []);
  for (const c of top.clusters || []) {
    const eps = c.endpoints && c.endpoints.length ? c.endpoints : [{}];
    eps.forEach((ep, i) => {
      const tr = el("tr", { "data-cluster": c.name });
      if (i === 0) {
        tr.append(el("td", { rowspan: eps.length }, c.name),
          el("td", { rowspan: eps.length, class: missing.has(c.name) ? "h-bad" : healthClass(c.state) }, (c.state || "") + (missing.has(c.name) ? " · not answering" : "")),
          el("td", { rowspan: eps.length, class: "num" }, c.vshards));
      }
      tr.append(el("td", {}, ep.role || "-"), el("td", {}, ep.endpoint || "-"),
        el("td", { class: healthClass(ep.health), title: ep.error || "" }, ep.health || "-"),
        el("td", { class: healthClass(ep.breaker) }, ep.breaker || "-"),
        el("td", { class: "num" }, ep.lag_ms === undefined ? "" : ep.lag_ms));
      body.append(tr);
    });
  }
}

// progress is a job's bar: rows on the target over rows to move (the
// router keeps the first at most the second); an aborted job's bar is
// grey at the point it stopped, a failed one's red.
function progress(j) {
  const pct = j.rows_total > 0 ? Math.min(100, Math.floor((100 * j.rows_copied) / j.rows_total)) : j.state === "done" ? 100 : 0;
  const cls = j.state === "done" ? "done" : j.state === "failed" ? "failed" : j.state === "aborted" ? "ended" : "running";
  const bar = el("span", { class: "bar " + cls }, el("i"));
  bar.firstChild.style.width = pct + "%";
  let text = " " + pct + "% · " + j.rows_copied + "/" + j.rows_total + " rows";
  if (j.rows_resynced > 0) text += " (+" + j.rows_resynced + " re-synced)";
  if (j.state === "aborted") text += j.error && j.error.includes("moves the vshards back") ? " · aborted after the flip" : " · aborted: copied rows removed from the target";
  if (j.state === "failed") text += " · failed";
  return el("td", { class: "progress" }, bar, text);
}

function drawJobs(jobs) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const j of jobs.slice(0, 20)) {
    const acts = el("td");
    const act = (name) => acts.append(el("button", { "data-act": name, onclick: () => jobAction(j, name) }, name));
    if (["pending", "copying", "catching_up"].includes(j.state)) act("pause");
    if (j.state === "paused") act("resume");
    if (active(j.state) && j.state !== "cleanup" && j.state !== "aborting") act("abort");
    body.append(el("tr", { "data-job": j.job, "data-state": j.state },
      el("td", {}, j.job), el("td", { class: "state" }, j.state + (j.error ? " (" + j.error + ")" : "")),
      el("td", {}, (j.ranges || []).map((r) => r.from + "-" + r.to + "→" + r.target).join(", ")),
      progress(j), el("td", { class: "num" }, j.max_pause_ms + " ms"), el("td", {}, timeEl(j.started_at)), acts));
    // A note about a job ("copying", "aborting") lasts while it runs.
    if (state.note && state.note.job === j.job && terminal(j.state)) setNote(null);
  }
}

function setNote(note) {
  state.note = note;
  $("rsmsg").className = note ? note.cls || "" : "";
  $("rsmsg").textContent = note ? note.text : "";
}

async function jobAction(j, action) {
  if (action === "abort") {
    const flipped = ["cutover", "cleanup"].includes(j.state);
    const ok = await confirmAction({
      title: "Abort " + j.job + "?",
      text: flipped ? "The shard map already points at the targets: aborting now starts a new job that moves the vshards back (copying their rows again)." :
        "The rows copied so far are deleted from the targets and the vshards stay on their sources.",
      ok: "Abort the job",
    });
    if (!ok) return;
  }
  try {
    const r = await api("POST", "/v1/admin/reshard/" + encodeURIComponent(j.job) + "/" + action);
    setNote({ job: j.job, text: j.job + ": " + r.state });
  } catch (e) { setNote({ job: j.job, text: action + " failed: " + e.message, cls: "err" }); }
  tick();
}

// reshardBody reads the form: add_cluster, drain or ranges.
function reshardBody() {
  const mode = $("rsmode").value, arg = $("rsarg").value.trim();
  if (!arg) throw new Error("name a cluster or give ranges");
  if (mode !== "ranges") return { [mode]: arg };
  const ranges = arg.split(",").map((part) => {
    const m = /^\s*(\d+)(?:-(\d+))?:([\w.-]+)\s*$/.exec(part);
    if (!m) throw new Error(JSON.stringify(part) + " is not FROM-TO:TARGET");
    return { from: +m[1], to: +(m[2] === undefined ? m[1] : m[2]), target: m[3] };
  });
  return { ranges };
}

const rangesText = (ranges) => (ranges || []).map((r) => r.from + "-" + r.to + "→" + r.target).join(", ");

async function plan() {
  $("rsstart").disabled = true;
  state.plan = null;
  try {
    const body = reshardBody();
    const p = await api("POST", "/v1/admin/reshard", Object.assign({ dry_run: true }, body));
    const n = (p.ranges || []).reduce((a, r) => a + r.to - r.from + 1, 0);
    setNote({ text: "plan: " + n + " vshards in " + (p.ranges || []).length + " ranges, " + (p.moves || []).length + " moves: " + rangesText(p.ranges) });
    state.plan = { ranges: p.ranges, vshards: n };
    $("rsstart").disabled = n === 0;
  } catch (e) { setNote({ text: e.message, cls: "err" }); }
}

async function startJob() {
  if (!state.plan) return;
  const p = state.plan;
  const ok = await confirmAction({
    title: "Start moving " + p.vshards + " vshards?",
    text: "Their rows are copied to the target clusters (" + rangesText(p.ranges) + "), the writes to them pause for the cut-over, " +
      "the shard map flips, and the rows are then deleted from the sources.",
    ok: "Start the job",
  });
  if (!ok) return;
  $("rsstart").disabled = true;
  try {
    const r = await api("POST", "/v1/admin/reshard", { ranges: p.ranges });
    setNote({ job: r.job, text: "started " + r.job + " (" + r.state + ")", cls: "ok" });
  } catch (e) { setNote({ text: e.message, cls: "err" }); }
  state.plan = null;
  tick();
}

// --- the queue table: every 5 s

function spark(values, cls) {
  const w = 120, h = 22, n = values.length;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark " + (cls || ""));
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => ((n === 1 ? w : (i * (w - 2)) / (n - 1)) + 1).toFixed(1) + "," + (h - 1 - ((h - 2) * v) / max).toFixed(1));
  if (n === 1) pts.unshift("1," + pts[0].split(",")[1]);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.append(line);
  const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
  t.textContent = "max " + Math.max(0, ...values) + " · last " + (values[n - 1] || 0);
  svg.append(t);
  return svg;
}

const subKey = (topic, sub) => topic + "\u0000" + sub;

// rates turns the rows' flow counts into per-second rates against the
// previous answer (at least 2 s before; a router restart resets them).
function rates(p) {
  const at = Date.parse(p.answered_at);
  const prev = state.flowPrev;
  const cur = { at, created: new Map(), acked: new Map() };
  for (const s of p.subscriptions) {
    if (!s.flow) continue;
    cur.created.set(s.topic, s.flow.created);
    cur.acked.set(subKey(s.topic, s.subscription), s.flow.acked);
  }
  if (prev && at - prev.at < 2000) return;
  if (prev) {
    const dt = (at - prev.at) / 1000;
    state.rates = new Map();
    for (const s of p.subscriptions) {
      const k = subKey(s.topic, s.subscription);
      if (!s.flow || !prev.created.has(s.topic) || !prev.acked.has(k)) continue;
      const rin = (s.flow.created - prev.created.get(s.topic)) / dt, rout = (s.flow.acked - prev.acked.get(k)) / dt;
      if (rin >= 0 && rout >= 0) state.rates.set(k, { rin, rout, dt });
    }
  }
  state.flowPrev = cur;
}

const fmtRate = (v) => (v === undefined ? "–" : v < 10 ? v.toFixed(1) : String(Math.round(v)));

function queryKey() {
  return [state.qOffset, state.qLimit, $("qsort").value, $("qfilter").value.trim()].join("\u0000");
}

// queues shows one page of subscriptions (the server filters, sorts and
// pages: 10,000 subscriptions never become 10,000 rows). A count that
// missed clusters never replaces a complete one: the last complete count
// stays, marked stale, and the banner names the clusters.
async function queues() {
  clearTimeout(state.qtimer);
  const q = new URLSearchParams({ offset: state.qOffset, limit: state.qLimit, sort: $("qsort").value });
  const f = $("qfilter").value.trim();
  if (f) q.set("filter", f);
  const key = queryKey();
  try {
    const p = await api("GET", "/v1/admin/queues?" + q);
    rates(p);
    state.alarms = p.alarms || [];
    state.queuesLive = p.live;
    let shown = p, stale = false;
    state.queueProblem = null;
    const missing = p.missing_clusters || [];
    if (p.partial && state.good && state.good.key === key) {
      shown = state.good.answer;
      stale = true;
      state.queueProblem = { missing, cls: "bad", text: "the count at " + fmtTime(p.missing_at || p.counted_at) + " missed " + missing.join(", ") +
        " (its numbers would be too small); the table keeps the last complete count, of " + fmtTime(shown.counted_at) + "." };
    } else if (p.partial) {
      stale = true;
      state.queueProblem = { missing, cls: "bad", text: "the counts lack " + missing.join(", ") + ", which did not answer: they are smaller than the truth." };
    } else if (missing.length) {
      stale = true;
      state.queueProblem = { missing, cls: "bad", text: "the count at " + fmtTime(p.missing_at) + " missed " + missing.join(", ") +
        "; the table shows the last complete count, of " + fmtTime(p.counted_at) + "." };
    } else {
      state.good = { key, answer: p };
      const age = (Date.parse(p.answered_at) - Date.parse(p.counted_at)) / 1000;
      if (!p.live && age > Math.max(60, 2 * p.step_seconds)) {
        stale = true;
        state.queueProblem = { cls: "warn", text: "the queue counts are " + ago(age) + " old (counted " + fmtTime(p.counted_at) + ")." };
      }
    }
    drawQueues(shown, stale);
    $("qinfo").textContent = p.live ? "(counted now by this router, which does not lead: no history, and dead-letter alarms are checked by the leading router only)" :
      "counted " + fmtTime(p.counted_at) + " · one sample per " + p.step_seconds + " s";
    if (state.sub) consumers();
  } catch (e) {
    if (e.message === "unauthorized") return;
    $("qinfo").textContent = "refresh failed: " + e.message;
    if (e.network) for (const tr of $("queues").tBodies[0].rows) tr.classList.add("stale");
  }
  banners();
  if (sessionStorage.getItem(TOKEN)) state.qtimer = setTimeout(queues, 5000);
}

function drawQueues(p, stale) {
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  const alarmed = new Set(state.alarms.map((a) => subKey(a.topic, a.subscription)));
  for (const s of p.subscriptions) {
    const k = subKey(s.topic, s.subscription);
    const r = state.rates.get(k) || {};
    const lag = s.oldest_ready_at ? el("td", { class: "num lag", title: "oldest ready message produced " + fmtTime(s.oldest_ready_at) }, ago(s.lag_seconds)) :
      el("td", { class: "num lag muted" }, "–");
    const tr = el("tr", { class: "pick" + (stale ? " stale" : ""), "data-topic": s.topic, "data-sub": s.subscription, onclick: () => pickSub(s.topic, s.subscription) },
      el("td", {}, s.topic), el("td", {}, s.subscription), el("td", { class: "num depth" }, s.depth), el("td", { class: "num parked" }, s.parked),
      el("td", { class: "num inflight" }, s.in_flight), el("td", { class: "num dead" + (alarmed.has(k) ? " h-bad" : "") }, s.dead), lag,
      el("td", { class: "num rin" }, fmtRate(r.rin)), el("td", { class: "num rout" }, fmtRate(r.rout)),
      el("td", {}, spark(s.history.depth)), el("td", {}, spark(s.history.in_flight)), el("td", {}, spark(s.history.dead, "dead")));
    if (state.sub && state.sub.topic === s.topic && state.sub.sub === s.subscription) tr.classList.add("sel");
    body.append(tr);
  }
  const last = Math.min(p.offset + p.subscriptions.length, p.total);
  $("qpage").textContent = " " + (p.total ? p.offset + 1 : 0) + "-" + last + " of " + p.total + " ";
  $("qprev").disabled = p.offset === 0;
  $("qnext").disabled = last >= p.total;
}

// --- one subscription: its consumers, dead letters by code and one by one

const subPath = (s) => "/v1/topics/" + encodeURIComponent(s.topic) + "/subscriptions/" + encodeURIComponent(s.sub);
const deadPath = (s) => subPath(s) + "/dead-letters";

async function pickSub(topic, sub) {
  state.sub = { topic, sub };
  state.redrive = null;
  state.dl = { cursor: "", back: [], next: "" };
  $("dlconfirm").hidden = true;
  $("dlmsg").textContent = "";
  $("dlact").textContent = "";
  $("dlpurge").disabled = false;
  $("dlsub").textContent = topic + "/" + sub;
  for (const tr of $("queues").tBodies[0].rows) tr.classList.toggle("sel", tr.dataset.topic === topic && tr.dataset.sub === sub);
  await Promise.all([consumers(), codes(), deadLetters()]);
}

async function consumers() {
  const s = state.sub;
  const body = $("consumers").tBodies[0];
  try {
    const c = await api("GET", subPath(s) + "/consumers");
    if (state.sub !== s) return;
    body.replaceChildren();
    const now = Date.now();
    for (const x of c.consumers) {
      body.append(el("tr", { "data-consumer": x.consumer }, el("td", {}, x.consumer || "(no name given)"), el("td", { class: "num inflight" }, x.in_flight),
        el("td", {}, timeEl(x.oldest_lease_at), " (" + ago((now - Date.parse(x.oldest_lease_at)) / 1000) + " ago)")));
    }
    if (!c.consumers.length) body.append(el("tr", {}, el("td", { colspan: 3, class: "muted" }, "no deliveries in flight")));
    const cm = c.missing_clusters || [];
    $("coninfo").textContent = "now" + (cm.length ? " · without " + cm.join(", ") + ", which did not answer" : "");
    $("coninfo").className = cm.length ? "err" : "muted";
  } catch (e) { $("coninfo").textContent = e.message; }
}

async function codes() {
  const s = state.sub;
  const body = $("codes").tBodies[0];
  try {
    const c = await api("GET", deadPath(s) + "/codes");
    body.replaceChildren();
    for (const x of c.codes) {
      body.append(el("tr", { "data-code": x.error_code }, el("td", {}, x.error_code || "(none)"), el("td", { class: "num" }, x.count),
        el("td", {}, el("button", { "data-act": "dry-run", onclick: () => dryRun({ error_code: x.error_code }, x.error_code || "(none)") }, "redrive: dry run"))));
    }
    if (c.codes.length > 1 || (c.codes.length === 1 && c.codes[0].error_code === "")) {
      body.append(el("tr", {}, el("td", {}, "all"), el("td", { class: "num" }, c.total),
        el("td", {}, el("button", { "data-act": "dry-run-all", onclick: () => dryRun({ all: true }, "all") }, "redrive: dry run"))));
    }
    if (!c.codes.length) body.append(el("tr", {}, el("td", { colspan: 3, class: "muted" }, "no dead letters")));
    // Counts that missed clusters are smaller than the truth: say so, in red.
    const cm = c.missing_clusters || [];
    if (cm.length) body.append(el("tr", { class: "stale" }, el("td", { colspan: 3, class: "err" }, "without " + cm.join(", ") + ", which did not answer: the counts are smaller than the truth")));
  } catch (e) { $("dlmsg").textContent = e.message; }
}

// dryRun asks how many a redrive would make ready; the Redrive button
// then asks for a confirmation and redrives for real.
async function dryRun(sel, label) {
  $("dlconfirm").hidden = true;
  try {
    const r = await api("POST", deadPath(state.sub) + "/redrive", Object.assign({ dry_run: true }, sel));
    state.redrive = { sel, label, n: r.would_redrive };
    $("dlmsg").className = "";
    $("dlmsg").textContent = "dry run: " + r.would_redrive + " dead letters of " + label + " would be made ready again.";
    $("dlconfirm").textContent = "Redrive " + r.would_redrive;
    $("dlconfirm").hidden = r.would_redrive === 0;
  } catch (e) { $("dlmsg").className = "err"; $("dlmsg").textContent = e.message; }
}

async function redrive() {
  const rd = state.redrive;
  if (!rd) return;
  const ok = await confirmAction({
    title: "Redrive " + rd.n + " dead letters of " + state.sub.topic + "/" + state.sub.sub + "?",
    text: "The dead letters of " + rd.label + " become ready again with their attempts reset: consumers receive them again.",
    ok: "Redrive",
  });
  if (!ok) return;
  $("dlconfirm").hidden = true;
  try {
    const r = await api("POST", deadPath(state.sub) + "/redrive", rd.sel);
    $("dlmsg").className = "ok";
    $("dlmsg").textContent = "redriven: " + r.redriven;
  } catch (e) { $("dlmsg").className = "err"; $("dlmsg").textContent = e.message; }
  state.redrive = null;
  afterDeadChange();
}

function afterDeadChange() {
  codes();
  deadLetters();
  queues();
}

// deadLetters lists one page of the subscription's dead letters, newest
// first; "older" follows the router's cursor, "newer" goes back.
async function deadLetters() {
  const s = state.sub;
  const q = new URLSearchParams({ limit: 20 });
  if (state.dl.cursor) q.set("cursor", state.dl.cursor);
  const body = $("deadletters").tBodies[0];
  try {
    const p = await api("GET", deadPath(s) + "?" + q);
    if (state.sub !== s) return;
    state.dl.next = p.next_cursor || "";
    body.replaceChildren();
    for (const d of p.dead_letters) {
      const retry = el("button", { "data-act": "retry", onclick: () => retryOne(d) }, "retry…");
      retry.disabled = !!d.in_flight; // a redrive leaves a leased dead letter alone
      const acts = el("td", {},
        el("button", { "data-act": "trace", onclick: () => traceKey(d.key, d.topic || s.topic, d.order_key) }, "trace"), " ", retry, " ",
        el("button", { "data-act": "delete", class: "danger", onclick: () => deleteOne(d) }, "delete…"));
      const err = d.last_error || "";
      body.append(el("tr", { "data-id": d.id }, el("td", { class: "num" }, d.id), el("td", { class: "wrap" }, d.key),
        el("td", {}, d.error_code || "(none)"), el("td", { class: "wrap", title: err }, err.length > 160 ? err.slice(0, 160) + "…" : err),
        el("td", { class: "num" }, d.attempts), el("td", {}, timeEl(d.dead_at), d.in_flight ? " · leased to a dead-letter handler" : ""), acts));
    }
    if (!p.dead_letters.length) body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no dead letters")));
    $("dlinfo").textContent = "page " + (state.dl.back.length + 1) + ", newest first" +
      ((p.missing_clusters || []).length ? " · without " + p.missing_clusters.join(", ") + ", which did not answer" : "");
    $("dlinfo").className = (p.missing_clusters || []).length ? "err" : "muted";
    $("dlprev").disabled = state.dl.back.length === 0;
    $("dlnext").disabled = !state.dl.next;
  } catch (e) { $("dlinfo").textContent = e.message; }
}

async function retryOne(d) {
  const ok = await confirmAction({
    title: "Retry dead letter " + d.id + "?",
    text: "Message " + JSON.stringify(d.key) + " (" + (d.error_code || "no error code") + ") becomes ready again for " +
      state.sub.topic + "/" + state.sub.sub + ", its attempts reset.",
    ok: "Retry",
  });
  if (!ok) return;
  try {
    const r = await api("POST", deadPath(state.sub) + "/redrive", { ids: [d.id] });
    $("dlact").className = "ok";
    $("dlact").textContent = "retried " + d.id + ": " + r.redriven + " made ready";
  } catch (e) { $("dlact").className = "err"; $("dlact").textContent = e.message; }
  afterDeadChange();
}

async function deleteOne(d) {
  const ok = await confirmAction({
    title: "Delete dead letter " + d.id + "?",
    text: "The dead letter of message " + JSON.stringify(d.key) + " is removed from " + state.sub.topic + "/" + state.sub.sub +
      " for good; the message stays dead and its trace keeps its history.",
    ok: "Delete",
  });
  if (!ok) return;
  try {
    const r = await api("POST", deadPath(state.sub) + "/delete", { ids: [d.id] });
    $("dlact").className = "ok";
    $("dlact").textContent = "deleted " + d.id + ": " + r.deleted;
  } catch (e) { $("dlact").className = "err"; $("dlact").textContent = e.message; }
  afterDeadChange();
}

async function purgeAll() {
  const s = state.sub;
  if (!s) return;
  const name = s.topic + "/" + s.sub;
  const ok = await confirmAction({
    title: "Purge every dead letter of " + name + "?",
    text: "All its dead letters are deleted for good, on every cluster; nothing can bring them back.",
    ok: "Purge all", typed: name,
  });
  if (!ok) return;
  try {
    const r = await api("DELETE", deadPath(s));
    $("dlact").className = "ok";
    $("dlact").textContent = "purged: " + r.purged;
  } catch (e) { $("dlact").className = "err"; $("dlact").textContent = e.message; }
  state.dl = { cursor: "", back: [], next: "" };
  afterDeadChange();
}

// --- retention and the archive cluster: every 15 s

async function retention() {
  clearTimeout(state.rtimer);
  try {
    const r = await api("GET", "/v1/admin/retention");
    const tb = $("tiers").tBodies[0];
    tb.replaceChildren();
    for (const t of r.tiers || []) {
      tb.append(el("tr", { "data-tier": t.tier }, el("td", {}, t.tier), el("td", {}, (t.from ? t.from + " to " : "up to ") + t.to), el("td", {}, t.where)));
    }
    state.archive = r.archive_state;
    const a = $("archive");
    a.className = r.archive_state === "ok" ? "ok" : r.archive_state === "unreachable" ? "err" : "muted";
    a.dataset.state = r.archive_state || "";
    a.textContent = r.archive_state === "ok" ? "Archive cluster: connected." :
      r.archive_state === "unreachable" ? "Archive cluster: unreachable — the warm and cold jobs wait; traces of warm months cannot be answered." :
        "No archive cluster configured: months past the hot window stay on their clusters.";
    const jb = $("retjobs").tBodies[0];
    jb.replaceChildren();
    for (const name of Object.keys(r.jobs || {}).sort()) {
      const j = r.jobs[name];
      jb.append(el("tr", { "data-job": name }, el("td", {}, name), el("td", { class: "num" }, j.runs), el("td", { class: "num" + (j.failures ? " h-bad" : "") }, j.failures),
        el("td", {}, timeEl(j.last_run)), el("td", {}, timeEl(j.last_ok)), el("td", { class: "num" }, j.rows), el("td", { class: "wrap err" }, j.last_error || "")));
    }
    if (!Object.keys(r.jobs || {}).length) jb.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no pass recorded on this router")));
    const hb = $("held").tBodies[0];
    hb.replaceChildren();
    for (const b of r.blocked || []) {
      hb.append(el("tr", {}, el("td", {}, b.cluster), el("td", {}, b.month),
        el("td", {}, b.reason + (b.live_deliveries ? " (" + b.live_deliveries + (b.live_deliveries >= 1000 ? "+" : "") + " live deliveries)" : ""))));
    }
    if (!(r.blocked || []).length) hb.append(el("tr", {}, el("td", { colspan: 3, class: "muted" }, "no month held hot past its window")));
    $("retinfo").textContent = (r.enabled ? "" : "turned off · ") + "hot " + r.hot_months + " months, warm " + r.warm_months + " months · " +
      (r.leading ? "this router runs the jobs" : "this router does not lead: the jobs' records are on the leading router");
  } catch (e) {
    if (e.message === "unauthorized") return;
    $("retinfo").textContent = "refresh failed: " + e.message;
  }
  banners();
  if (sessionStorage.getItem(TOKEN)) state.rtimer = setTimeout(retention, 15000);
}

// --- trace

function traceKey(key, topic, orderKey) {
  $("trkey").value = key || "";
  $("trtopic").value = topic || "";
  $("trorder").value = orderKey || "";
  $("trtx").value = "";
  trace();
  $("trout").scrollIntoView();
}

function table(heads, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))), el("tbody", {}, ...rows));
}

// trace asks with the key in the query (GET /v1/messages/trace?key=…):
// in a path, keys such as "." and ".." would be removed by the browser.
async function trace() {
  const out = $("trout");
  out.replaceChildren();
  const key = $("trkey").value, topic = $("trtopic").value.trim(), order = $("trorder").value, tx = $("trtx").value.trim();
  try {
    let data;
    if (tx) data = await api("GET", "/v1/transactions/" + encodeURIComponent(tx));
    else if (key && topic) {
      const q = new URLSearchParams({ key, topic });
      if (order) q.set("order_key", order);
      data = await api("GET", "/v1/messages/trace?" + q);
    } else throw new Error("give a key and its topic, or a transaction id");
    if (data.message && data.events) {
      const m = data.message;
      out.append(el("p", { class: "tracehead" }, "message ", JSON.stringify(m.key), " · id " + m.id + " · status " + m.status + " · produced ", timeEl(m.produced_at),
        " · cluster " + (data.cluster || "?") + " · read from " + data.read_from + (data.tier ? " · tier " + data.tier : "")));
      out.append(el("h3", {}, "Deliveries"));
      out.append(table(["subscription", "state", "attempts", "consumer", "error", "next attempt"], (data.deliveries || []).map((d) =>
        el("tr", {}, el("td", {}, d.subscription), el("td", {}, d.state), el("td", { class: "num" }, d.attempts), el("td", {}, d.consumer || ""),
          el("td", {}, [d.error_code, d.last_error].filter(Boolean).join(" ")), el("td", {}, d.next_attempt_at ? timeEl(d.next_attempt_at) : "")))));
      out.append(el("h3", {}, "Events"));
      out.append(table(["at", "event", "subscription", "consumer", "attempt", "error"], data.events.map((ev) =>
        el("tr", {}, el("td", {}, timeEl(ev.at)), el("td", {}, ev.type), el("td", {}, ev.subscription || ""), el("td", {}, ev.consumer || ""),
          el("td", {}, ev.attempt || ""), el("td", {}, [ev.error_code, ev.error].filter(Boolean).join(" "))))));
    }
    if (data.messages) {
      out.append(el("p", {}, data.messages.length + " messages" + (data.complete === false ? " (some clusters did not answer)" : "")));
      out.append(table(["key", "topic", "id", "vshard", "cluster", "status", "produced"], data.messages.map((m) =>
        el("tr", {}, el("td", {}, m.key), el("td", {}, m.topic), el("td", {}, m.id), el("td", { class: "num" }, m.vshard),
          el("td", {}, m.cluster || ""), el("td", {}, m.status || ""), el("td", {}, timeEl(m.produced_at))))));
    }
    out.append(el("details", {}, el("summary", {}, "the answer as JSON"), el("pre", {}, JSON.stringify(data, null, 2))));
  } catch (e) { out.append(el("p", { class: "err" }, e.message)); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("click", signIn);
  $("token").addEventListener("keydown", (e) => { if (e.key === "Enter") signIn(); });
  $("signout").addEventListener("click", () => signOut(""));
  $("rsplan").addEventListener("click", plan);
  $("rsstart").addEventListener("click", startJob);
  $("rsmode").addEventListener("change", () => { $("rsstart").disabled = true; state.plan = null; });
  $("rsarg").addEventListener("input", () => { $("rsstart").disabled = true; state.plan = null; });
  let typing = null; // one request once typing pauses, not one per key
  $("qfilter").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => { state.qOffset = 0; queues(); }, 250); });
  $("qsort").addEventListener("change", () => { state.qOffset = 0; queues(); });
  $("qprev").addEventListener("click", () => { state.qOffset = Math.max(0, state.qOffset - state.qLimit); queues(); });
  $("qnext").addEventListener("click", () => { state.qOffset += state.qLimit; queues(); });
  $("dlconfirm").addEventListener("click", redrive);
  $("dlpurge").addEventListener("click", purgeAll);
  $("dlnext").addEventListener("click", () => { if (state.dl.next) { state.dl.back.push(state.dl.cursor); state.dl.cursor = state.dl.next; deadLetters(); } });
  $("dlprev").addEventListener("click", () => { if (state.dl.back.length) { state.dl.cursor = state.dl.back.pop(); deadLetters(); } });
  $("trgo").addEventListener("click", trace);
  if (sessionStorage.getItem(TOKEN)) start();
});
