// shardmq operators' page: every number comes from the router's admin
// JSON endpoints, read with the token kept in sessionStorage. No data is
// written into the page as HTML: text only (textContent).
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN = "shardmq.token";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#e15759", "#bab0ac", "#ff9da7"];
const state = { qOffset: 0, qLimit: 50, sub: null, plan: null, redrive: null, colours: {}, timer: null, qtimer: null };

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

// api calls the router with the token; a 401 signs out.
async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Bearer " + sessionStorage.getItem(TOKEN) } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
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

function signOut(why) {
  sessionStorage.removeItem(TOKEN);
  clearTimeout(state.timer);
  clearTimeout(state.qtimer);
  $("app").hidden = true;
  $("login").hidden = false;
  $("signout").hidden = true;
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
}

// tick refreshes the map, the clusters and the jobs every 2 s.
async function tick() {
  clearTimeout(state.timer);
  try {
    const [map, top, jobs] = await Promise.all([
      api("GET", "/v1/admin/shardmap"), api("GET", "/v1/admin/topology"), api("GET", "/v1/admin/reshard").catch(() => ({ jobs: [] })),
    ]);
    drawMap(map, jobs.jobs || [], (top.clusters || []).map((c) => c.name));
    drawClusters(top);
    drawJobs(jobs.jobs || []);
    $("status").textContent = "live · refreshed " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.message === "unauthorized") return;
    $("status").textContent = "refresh failed: " + e.message;
  }
  if (sessionStorage.getItem(TOKEN)) state.timer = setTimeout(tick, 2000);
}

function colour(cluster) {
  if (!(cluster in state.colours)) state.colours[cluster] = PALETTE[Object.keys(state.colours).length % PALETTE.length];
  return state.colours[cluster];
}

const active = (s) => !["done", "aborted", "failed"].includes(s);

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
  for (const c of top.clusters || []) {
    const eps = c.endpoints && c.endpoints.length ? c.endpoints : [{}];
    eps.forEach((ep, i) => {
      const tr = el("tr", { "data-cluster": c.name });
      if (i === 0) {
        tr.append(el("td", { rowspan: eps.length }, c.name), el("td", { rowspan: eps.length, class: healthClass(c.state) }, c.state || ""),
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

function drawJobs(jobs) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const j of jobs.slice(0, 20)) {
    const pct = j.rows_total > 0 ? Math.min(100, Math.round((100 * j.rows_copied) / j.rows_total)) : j.state === "done" ? 100 : 0;
    const bar = el("span", { class: "bar" }, el("i"));
    bar.firstChild.style.width = pct + "%";
    const acts = el("td");
    const act = (name) => acts.append(el("button", { "data-act": name, onclick: () => jobAction(j.job, name) }, name));
    if (["pending", "copying", "catching_up"].includes(j.state)) act("pause");
    if (j.state === "paused") act("resume");
    if (active(j.state) && j.state !== "cleanup" && j.state !== "aborting") act("abort");
    body.append(el("tr", { "data-job": j.job },
      el("td", {}, j.job), el("td", { class: "state" }, j.state + (j.error ? " (" + j.error + ")" : "")),
      el("td", {}, (j.ranges || []).map((r) => r.from + "-" + r.to + "→" + r.target).join(", ")),
      el("td", {}, bar, " " + pct + "% · " + j.rows_copied + "/" + j.rows_total + " rows"),
      el("td", { class: "num" }, j.max_pause_ms + " ms"), el("td", {}, new Date(j.started_at).toLocaleTimeString()), acts));
  }
}

async function jobAction(id, action) {
  try {
    const j = await api("POST", "/v1/admin/reshard/" + encodeURIComponent(id) + "/" + action);
    $("rsmsg").textContent = id + ": " + j.state;
  } catch (e) { $("rsmsg").textContent = action + " failed: " + e.message; }
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

async function plan() {
  $("rsstart").disabled = true;
  state.plan = null;
  try {
    const body = reshardBody();
    const p = await api("POST", "/v1/admin/reshard", Object.assign({ dry_run: true }, body));
    const n = (p.ranges || []).reduce((a, r) => a + r.to - r.from + 1, 0);
    $("rsmsg").className = "";
    $("rsmsg").textContent = "plan: " + n + " vshards in " + (p.ranges || []).length + " ranges, " + (p.moves || []).length + " moves: " +
      (p.ranges || []).map((r) => r.from + "-" + r.to + "→" + r.target).join(", ");
    state.plan = { ranges: p.ranges };
    $("rsstart").disabled = n === 0;
  } catch (e) { $("rsmsg").className = "err"; $("rsmsg").textContent = e.message; }
}

async function startJob() {
  if (!state.plan) return;
  $("rsstart").disabled = true;
  try {
    const r = await api("POST", "/v1/admin/reshard", { ranges: state.plan.ranges });
    $("rsmsg").className = "ok";
    $("rsmsg").textContent = "started " + r.job + " (" + r.state + ")";
  } catch (e) { $("rsmsg").className = "err"; $("rsmsg").textContent = e.message; }
  state.plan = null;
  tick();
}

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

// queues shows one page of subscriptions (the server filters, sorts and
// pages: 10,000 subscriptions never become 10,000 rows), every 5 s.
async function queues() {
  clearTimeout(state.qtimer);
  const q = new URLSearchParams({ offset: state.qOffset, limit: state.qLimit, sort: $("qsort").value });
  const f = $("qfilter").value.trim();
  if (f) q.set("filter", f);
  try {
    const p = await api("GET", "/v1/admin/queues?" + q);
    const body = $("queues").tBodies[0];
    body.replaceChildren();
    for (const s of p.subscriptions) {
      const tr = el("tr", { class: "pick", "data-topic": s.topic, "data-sub": s.subscription, onclick: () => pickSub(s.topic, s.subscription) },
        el("td", {}, s.topic), el("td", {}, s.subscription), el("td", { class: "num depth" }, s.depth),
        el("td", { class: "num inflight" }, s.in_flight), el("td", { class: "num dead" }, s.dead),
        el("td", {}, spark(s.history.depth)), el("td", {}, spark(s.history.in_flight)), el("td", {}, spark(s.history.dead, "dead")));
      if (state.sub && state.sub.topic === s.topic && state.sub.sub === s.subscription) tr.classList.add("sel");
      body.append(tr);
    }
    const last = Math.min(p.offset + p.subscriptions.length, p.total);
    $("qpage").textContent = " " + (p.total ? p.offset + 1 : 0) + "-" + last + " of " + p.total + " ";
    $("qprev").disabled = p.offset === 0;
    $("qnext").disabled = last >= p.total;
    $("qinfo").textContent = p.live ? "(counted now; the leading router keeps the last hour)" :
      "counted " + new Date(p.counted_at).toLocaleTimeString() + " · one sample per " + p.step_seconds + " s";
  } catch (e) {
    if (e.message === "unauthorized") return;
    $("qinfo").textContent = "refresh failed: " + e.message;
  }
  if (sessionStorage.getItem(TOKEN)) state.qtimer = setTimeout(queues, 5000);
}

const subPath = (s) => "/v1/topics/" + encodeURIComponent(s.topic) + "/subscriptions/" + encodeURIComponent(s.sub) + "/dead-letters";

async function pickSub(topic, sub) {
  state.sub = { topic, sub };
  state.redrive = null;
  $("dlconfirm").hidden = true;
  $("dlmsg").textContent = "";
  for (const tr of $("queues").tBodies[0].rows) tr.classList.toggle("sel", tr.dataset.topic === topic && tr.dataset.sub === sub);
  await codes();
}

async function codes() {
  const s = state.sub;
  $("dlsub").textContent = s.topic + "/" + s.sub;
  const body = $("codes").tBodies[0];
  try {
    const c = await api("GET", subPath(s) + "/codes");
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
  } catch (e) { $("dlmsg").textContent = e.message; }
}

// dryRun asks how many a redrive would make ready; the confirm button
// then redrives for real.
async function dryRun(sel, label) {
  $("dlconfirm").hidden = true;
  try {
    const r = await api("POST", subPath(state.sub) + "/redrive", Object.assign({ dry_run: true }, sel));
    state.redrive = sel;
    $("dlmsg").className = "";
    $("dlmsg").textContent = "dry run: " + r.would_redrive + " dead letters of " + label + " would be made ready again.";
    $("dlconfirm").textContent = "Redrive " + r.would_redrive;
    $("dlconfirm").hidden = r.would_redrive === 0;
  } catch (e) { $("dlmsg").className = "err"; $("dlmsg").textContent = e.message; }
}

async function redrive() {
  $("dlconfirm").hidden = true;
  try {
    const r = await api("POST", subPath(state.sub) + "/redrive", state.redrive);
    $("dlmsg").className = "ok";
    $("dlmsg").textContent = "redriven: " + r.redriven;
  } catch (e) { $("dlmsg").className = "err"; $("dlmsg").textContent = e.message; }
  state.redrive = null;
  codes();
  queues();
}

async function trace() {
  const out = $("trout");
  out.replaceChildren();
  const key = $("trkey").value.trim(), topic = $("trtopic").value.trim(), tx = $("trtx").value.trim();
  try {
    let data;
    if (tx) data = await api("GET", "/v1/transactions/" + encodeURIComponent(tx));
    else if (key && topic) data = await api("GET", "/v1/messages/" + encodeURIComponent(key) + "/trace?" + new URLSearchParams({ topic }));
    else throw new Error("give a key and its topic, or a transaction id");
    if (data.events && data.message) {
      const t = el("table", {}, el("thead", {}, el("tr", {}, ...["at", "event", "subscription", "consumer", "attempt", "error"].map((h) => el("th", {}, h)))));
      const tb = el("tbody");
      for (const ev of data.events) {
        tb.append(el("tr", {}, el("td", {}, ev.at), el("td", {}, ev.type), el("td", {}, ev.subscription || ""), el("td", {}, ev.consumer || ""),
          el("td", {}, ev.attempt || ""), el("td", {}, [ev.error_code, ev.error].filter(Boolean).join(" "))));
      }
      t.append(tb);
      out.append(el("p", {}, "status: " + (data.message ? data.message.status : "?") + " · read from " + data.read_from), t);
    }
    if (data.messages) {
      const t = el("table", {}, el("thead", {}, el("tr", {}, ...["key", "topic", "id", "vshard", "cluster", "status", "produced"].map((h) => el("th", {}, h)))));
      const tb = el("tbody");
      for (const m of data.messages) {
        tb.append(el("tr", {}, el("td", {}, m.key), el("td", {}, m.topic), el("td", {}, m.id), el("td", { class: "num" }, m.vshard),
          el("td", {}, m.cluster || ""), el("td", {}, m.status || ""), el("td", {}, m.produced_at || "")));
      }
      t.append(tb);
      out.append(el("p", {}, data.messages.length + " messages" + (data.complete === false ? " (some clusters did not answer)" : "")), t);
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
  $("trgo").addEventListener("click", trace);
  if (sessionStorage.getItem(TOKEN)) start();
});
