// Farm's dashboard: the fleet, its live charts and its jobs, kept current by the head's server-sent events.
// Every figure from the head is put in the page as text (never as markup): node and job names are users' input.
// Reading needs the head's API token unless the head runs with --open-read: every request carries it once signed
// in (the events too, read through fetch: EventSource cannot send a header).
"use strict";

const WINDOW_S = 15 * 60;
const CHARTED_MAX = 24;  // the head's /api/history default: the busiest nodes, when there are more
// Okabe and Ito's palette, which colour-blind readers can tell apart too; past eight nodes the lines dash as well.
const COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
const DASHES = [null, [6, 3], [2, 3], [8, 3, 2, 3]];
function lineStyle(i) {  // the i-th line of a chart
  const dash = DASHES[Math.floor(i / COLOURS.length) % DASHES.length];
  return {stroke: COLOURS[i % COLOURS.length], dash: dash || undefined};
}

const state = {
  fleet: null,            // the latest /api/fleet (or tick's fleet)
  jobs: [],               // the latest jobs list
  history: null,          // {t: [...], nodes: [{id, name, cpu, farm_cpu, owner_cpu, power, memory, gpu_memory?}]}
  charts: {},             // uPlot instances by metric
  chartNodes: "",         // the node ids the charts were built for
  job: null,              // the job shown on a job page
  token: sessionStorage.getItem("farm.token") || "",
  locked: false,          // a read was refused without a token: the head shows nothing until signed in
  ticks: 0,
};

class Locked extends Error {}

// ---- small helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const num = (v, digits = 0) => Number(v).toLocaleString("en-US", {minimumFractionDigits: digits,
                                                                   maximumFractionDigits: digits});
function watts(v) { return v >= 1000 ? `${num(v / 1000, 2)} kW` : `${num(v, 1)} W`; }
function joules(v) {
  if (v >= 3.6e6) return `${num(v / 3.6e6, 2)} kWh`;
  if (v >= 1e3) return `${num(v / 1e3, 2)} kJ`;
  return `${num(v, v < 1 ? 3 : v < 100 ? 2 : 1)} J`;  // a small shard's joules still show
}
function ago(ts) {
  if (!ts) return "-";
  const s = Math.max(Date.now() / 1000 - ts, 0);
  if (s < 120) return `${Math.round(s)}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  return `${Math.round(s / 3600)}h ago`;
}
function duration(s) { return s < 60 ? `${num(s, 1)} s` : `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`; }

// An estimate is shown as one: "est." beside the figure, its source and scope on hover. Counter figures stand alone.
function estBadge(estimate, source, scope) {
  if (!estimate) return null;
  const what = source === "mixed" ? "mixed sources, some estimated" : source + (scope ? `, ${scope}` : "");
  return h("span", {class: "est", title: `estimate: ${what}`, "data-source": source}, "est.");
}
function figure(text, estimate, source, scope) {
  return h("span", {class: "figure", title: source ? `source: ${source}${scope ? `, ${scope}` : ""}` : null},
           text, estBadge(estimate, source, scope));
}

// A node's CPU split into its owner's share and Farm's (each in percent of the whole machine): a node busy with its
// owner's work is not shown as Farm's.
function cpuSplit(n) {
  return h("div", {class: "cpu-split", title: `whole machine ${num(n.cpu_percent)}%`},
    h("div", {class: "split-bar", role: "img", "aria-label": `owner ${num(n.owner_cpu_percent)}%, Farm ${
      num(n.farm_cpu_percent)}%`},
      h("span", {class: "owner", style: `width:${Math.min(n.owner_cpu_percent, 100)}%`}),
      h("span", {class: "farm", style: `left:${Math.min(n.owner_cpu_percent, 100)}%;width:${
        Math.min(n.farm_cpu_percent, 100)}%`})),
    h("div", {class: "split-text"}, h("span", {class: "owner-share"}, `owner ${num(n.owner_cpu_percent)}%`), " · ",
      h("span", {class: "farm-share"}, `Farm ${num(n.farm_cpu_percent)}%`)));
}

function gpuMemoryText(memory) {
  const used = memory.reduce((sum, m) => sum + m.used_bytes, 0);
  const total = memory.reduce((sum, m) => sum + m.total_bytes, 0);
  return `${num(used / 2 ** 30, 1)}/${num(total / 2 ** 30)} GiB`;
}

// The jobs running on a node, each a link to its page.
function jobLinks(jobs) {
  if (!jobs || !jobs.length) return null;
  return h("div", {class: "node-jobs"}, jobs.map((j, i) => [i ? ", " : "",
    h("a", {href: `#/jobs/${encodeURIComponent(j.id)}`, "data-job": j.id}, j.name)]));
}

// A backend's idle draw: the figure, or "not metered" with why (an estimate of 0 W is no reading).
function idleDraw(b) {
  if (b.idle_unmetered) return h("span", {class: "dim idle-unmetered", title: b.idle_unmetered}, "not metered");
  return b.idle_w == null ? null : figure(watts(b.idle_w), b.idle_estimate, b.idle_source);
}

// A running job's rate so far and the time left at it.
function rateText(j) {
  if (j.rate_items_per_s == null) return null;
  return `${num(j.rate_items_per_s, 1)} items/s · ${j.eta_s < 1 ? "finishing" : `about ${duration(j.eta_s)} left`}`;
}

function stateCell(value, prefix = "state") { return h("span", {class: `state ${prefix}-${value}`}, value); }

function progressBar(job) {
  const pct = Math.round(job.progress * 100);
  const cls = job.state === "succeeded" ? "bar done" : (job.state === "failed" || job.state === "cancelled")
    ? "bar failed" : "bar";
  return h("div", {},
    h("div", {class: cls, role: "progressbar", "aria-valuenow": pct, "aria-valuemin": 0, "aria-valuemax": 100},
      h("span", {style: `width:${pct}%`})),
    h("div", {class: "progress-text"}, `${num(job.items_done)}/${num(job.items)} items · ${pct}%`));
}

function authHeaders() { return state.token ? {Authorization: `Bearer ${state.token}`} : {}; }

async function api(path, options = {}) {
  const headers = {...(options.headers || {}), ...authHeaders()};
  const response = await fetch(path, {...options, headers});
  if (response.status === 401 && !state.token && (options.method || "GET") === "GET") {
    lock();  // reading needs the token here: ask for it, once, and read nothing more until then
    throw new Locked("sign in with the API token");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response.status === 204 ? null : response.json();
}

// ---- routing: #/ is the fleet, #/jobs/ID a job

function route() {
  const match = location.hash.match(/^#\/(jobs|nodes)\/([^/]+)$/);
  if (!match) return {page: "fleet"};
  return {page: match[1] === "jobs" ? "job" : "node", id: decodeURIComponent(match[2])};
}

async function show() {
  const where = route();
  destroyCharts();
  const view = document.getElementById("view");
  if (state.locked) {
    view.replaceChildren(h("div", {id: "locked", class: "locked"},
      h("p", {}, "This head shows its fleet and jobs to holders of its API token."),
      h("p", {class: "dim"}, "Sign in with it (api_token in the head's head.json): it is kept in this tab only."),
      h("button", {id: "signin-locked", onclick: openSignIn}, "Sign in")));
    return;
  }
  if (where.page === "job") {
    view.replaceChildren(h("p", {class: "dim"}, "loading…"));
    await loadJob(where.id);
  } else if (where.page === "node") {
    view.replaceChildren(h("p", {class: "dim"}, "loading…"));
    await loadNode(where.id);
  } else {
    view.replaceChildren(fleetSkeleton());
    renderFleet();
    try {
      await loadHistory();
    } catch (error) {
      if (!(error instanceof Locked)) throw error;
    }
  }
}

function lock() {
  if (state.locked) return;
  state.locked = true;
  renderAuth();
  show();
}

// ---- the fleet page

function fleetSkeleton() {
  return h("div", {id: "fleet-page"},
    h("div", {class: "cards", id: "totals"}),
    h("h2", {}, "Backends"), h("div", {class: "chips", id: "backends"}),
    h("h2", {}, "Nodes"), h("div", {class: "table-wrap"}, h("table", {id: "nodes"})),
    h("h2", {}, "Last 15 minutes"),
    h("div", {class: "charts"},
      CHARTS.map(c => h("div", {class: "chart", id: c.id, hidden: c.onlyWhere || null}, h("h3", {}, c.title)))),
    h("p", {class: "dim", id: "chart-note"}),
    h("h2", {}, "Perf/W by model"),
    h("p", {class: "dim"}, "Items per joule of each model on each backend, over the latest jobs' measured shards: " +
      "never one figure across models, whose items are not alike. A model's rows differ in what Setup says."),
    h("div", {class: "table-wrap"}, h("table", {id: "models"})),
    h("h2", {}, "Jobs"), h("div", {class: "table-wrap"}, h("table", {id: "jobs"})));
}

function card(label, value, sub, id) {
  return h("div", {class: "card", id}, h("div", {class: "label"}, label), h("div", {class: "value"}, value),
           sub ? h("div", {class: "sub"}, sub) : null);
}

function renderFleet() {
  if (route().page !== "fleet" || !state.fleet) { renderJobs(); return; }
  const {totals, nodes, backends} = state.fleet;
  const byState = totals.by_state, act = totals.by_activity;
  document.getElementById("totals").replaceChildren(
    card("Nodes", num(totals.nodes),
         ["ready", "joining", "draining", "offline"].filter(s => byState[s]).map(s => `${byState[s]} ${s}`)
           .join(" · ") || "none yet", "total-nodes"),
    card("Activity", `${act.working || 0} working`,
         `${act.idle || 0} idle · ${act.busy || 0} owner busy`, "total-activity"),
    card("Utilisation", `${num(totals.cpu_percent)}%`, `Farm ${num(totals.farm_cpu_percent)}% · owners ${
      num(totals.owner_cpu_percent)}% (mean CPU of live nodes)`, "total-cpu"),
    card("Power", figure(watts(totals.power_w), totals.power_estimate, totals.power_source),
         "live nodes, latest heartbeats", "total-power"),
    card("Shards running", num(totals.shards_running), null, "total-shards"),
    card("Energy spent", figure(joules(totals.energy_j), totals.energy_estimate, totals.energy_source),
         `${num(totals.items_done)} items done` + (totals.marginal_j == null ? "" :
           ` · ${joules(totals.marginal_j)} above idle`), "total-energy"));
  renderModels(state.fleet.models || []);

  document.getElementById("backends").replaceChildren(...(backends.length ? backends.map(b =>
    h("span", {class: "chip", "data-backend": b.backend},
      h("b", {}, b.backend), ` ${b.nodes} node${b.nodes === 1 ? "" : "s"} (${b.ready} ready) · ${b.devices} device${
        b.devices === 1 ? "" : "s"}`)) : [h("span", {class: "dim"}, "no backends yet")]));

  // No perf/W column: a node's items over its joules would average unlike models (see the node's page, by model).
  const head = h("tr", {}, ["Node", "State", "Activity", "Backends", "CPU: owner · Farm", "Memory", "Power",
    "Shards running", "Items done", "Energy", "Heartbeat", ""].map((c, i) => h("th", {class: i >= 5 && i < 10 ?
      "num" : null}, c)));
  const rows = nodes.map(n => { const live = n.state !== "offline"; return h("tr", {"data-node": n.name,
      "data-node-id": n.id, class: live ? null : "dim"},
    h("td", {}, h("a", {href: `#/nodes/${encodeURIComponent(n.id)}`}, h("b", {}, n.name)),
      h("div", {class: "dim"}, n.id)),
    h("td", {class: "node-state", title: n.drain ? "drained by an operator" : null}, stateCell(n.state),
      n.drain ? h("div", {class: "dim"}, "by an operator") : null),
    h("td", {class: "node-activity", title: n.busy ? `owner busy: ${n.busy}` : null},
      stateCell(n.activity, "act"), n.busy ? h("div", {class: "dim"}, n.busy) : null, jobLinks(n.jobs)),
    h("td", {}, n.backends.map(b => h("div", {class: b.available ? null : "dim",
      title: b.available ? b.detail : b.reason}, `${b.name} (${b.device})${b.available ? "" : ": unavailable"}`,
      idleDraw(b) && h("span", {class: "dim"}, " idle ", idleDraw(b))))),
    // An offline node's last figures are stale: they are not shown as if current.
    h("td", {class: "node-cpu"}, live ? cpuSplit(n) : "-"),
    h("td", {class: "num node-memory"}, live ? `${num(n.memory_percent)}%` : "-", live && n.gpu_memory.length ?
      h("div", {class: "dim node-gpu-memory"}, `GPU ${gpuMemoryText(n.gpu_memory)}`) : null),
    h("td", {class: "num node-power"}, live && n.power.length ? figure(watts(n.power_w), n.power_estimate,
      n.power_source, n.power.length === 1 ? n.power[0].scope : "") : "-"),
    h("td", {class: "num node-shards"}, num(n.shards_running)),
    h("td", {class: "num node-items"}, num(n.items_done)),
    h("td", {class: "num"}, n.energy_source ? figure(joules(n.energy_j), n.energy_estimate, n.energy_source) : "-",
      n.marginal_j == null ? null : h("div", {class: "dim node-marginal"}, `${joules(n.marginal_j)} above idle`)),
    h("td", {}, ago(n.last_heartbeat)),
    h("td", {}, live ? drainButton(n) : null)); });
  document.getElementById("nodes").replaceChildren(h("thead", {}, head),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", {colspan: 12, class: "empty"},
      "No nodes yet: join one with the command `farm head start` printed."))));
  renderJobs();
}

function renderModels(models, id = "models") {
  const head = h("tr", {}, ["Model", "Backend", "Setup", "Jobs", "Items", "Energy", "Perf/W (items/J)"]
    .map((c, i) => h("th", {class: i >= 3 ? "num" : null}, c)));
  const rows = models.map(m => h("tr", {"data-model": m.model, "data-backend": m.backend},
    h("td", {}, m.model), h("td", {}, m.backend),
    h("td", {class: "model-setup", title: "what sets this row apart from the model's others"}, m.setup || "-"),
    h("td", {class: "num"}, num(m.jobs)),
    h("td", {class: "num"}, num(m.items)),
    h("td", {class: "num"}, figure(joules(m.energy_j), m.energy_estimate, m.energy_source)),
    h("td", {class: "num model-perf"}, figure(num(m.items_per_j, 1), m.energy_estimate, m.energy_source))));
  const table = document.getElementById(id);
  if (!table) return;
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows.length ? rows :
    h("tr", {}, h("td", {colspan: 7, class: "empty"}, "No measured shards yet."))));
}

// An operator's drain: no new shards for the node, what runs there finishes. Like cancel, it needs the API token.
function drainButton(node) {
  const verb = node.drain ? "undrain" : "drain";
  return h("button", {class: "node-drain", "data-action": verb, disabled: !state.token,
    title: state.token ? (node.drain ? "Let this node take shards again" : "Give this node no new shards")
      : `Sign in with the API token to ${verb}`, onclick: () => setDrain(node, verb)},
    node.drain ? "Undrain" : "Drain");
}

async function setDrain(node, verb) {
  if (verb === "drain" && !confirm(`Drain node ${node.name} (${node.id})? It takes no new shards until undrained.`)) {
    return;
  }
  try {
    const updated = await api(`api/nodes/${encodeURIComponent(node.id)}/${verb}`, {method: "POST"});
    const shown = state.fleet.nodes.find(n => n.id === updated.id);
    if (shown) Object.assign(shown, {drain: updated.drain, state: updated.state});
    renderFleet();
  } catch (error) {
    alert(`${verb} ${node.name}: ${error.message}`);
  }
}

function renderJobs() {
  const table = document.getElementById("jobs");
  if (!table) return;
  const head = h("tr", {}, ["Job", "State", "Progress", "Shards", "Energy", "Items/s", "Items/J", "Submitted"]
    .map((c, i) => h("th", {class: i >= 3 && i < 7 ? "num" : null}, c)));
  const rows = state.jobs.map(j => h("tr", {"data-job": j.id, "data-job-name": j.name, "data-state": j.state},
    h("td", {}, h("a", {href: `#/jobs/${encodeURIComponent(j.id)}`}, j.name), h("div", {class: "dim"}, j.id)),
    h("td", {class: "job-state", title: j.error || null}, stateCell(j.state)),
    h("td", {class: "job-progress"}, progressBar(j), rateText(j) && h("div", {class: "dim job-eta"}, rateText(j))),
    h("td", {class: "num"}, `${j.shards_done}/${j.shards}`, j.shards_running ?
      h("div", {class: "dim"}, `${j.shards_running} running`) : null),
    h("td", {class: "num"}, j.energy_sources.length ? figure(joules(j.energy_j), j.energy_estimate,
      j.energy_sources.join(", ")) : "-", j.marginal_j == null ? null :
      h("div", {class: "dim"}, `${joules(j.marginal_j)} above idle`)),
    h("td", {class: "num"}, j.items_per_s ? num(j.items_per_s) : "-"),
    h("td", {class: "num"}, j.items_per_j ? figure(num(j.items_per_j, 1), j.energy_estimate,
      j.energy_sources.join(", ")) : "-"),
    h("td", {}, ago(j.created_at))));
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows.length ? rows :
    h("tr", {}, h("td", {colspan: 8, class: "empty"}, "No jobs yet: `farm submit SPEC.yaml`."))));
}

// ---- live charts (uPlot): one series per node over the ticks of the last 15 minutes

async function loadHistory() {
  state.history = await api("api/history");
  buildCharts();
}

function destroyCharts() {
  for (const chart of Object.values(state.charts)) chart.destroy();
  state.charts = {};
  state.chartNodes = "";
}

// The fleet's charts: one series per node. GPU memory is charted only where a node reported it (NVML): without one,
// the chart is absent rather than a chart of nothing.
const CHARTS = [
  {metric: "farm_cpu", id: "chart-farm-cpu", title: "Farm's CPU (% of the machine) per node", unit: "%",
   range: [0, 100]},
  {metric: "owner_cpu", id: "chart-owner-cpu", title: "The owner's CPU (% of the machine) per node", unit: "%",
   range: [0, 100]},
  {metric: "power", id: "chart-power", title: "Power (W) per node", unit: "W", range: null},
  {metric: "memory", id: "chart-memory", title: "Memory (% of the machine's) per node", unit: "%", range: [0, 100]},
  {metric: "gpu_memory", id: "chart-gpu-memory", title: "GPU memory (% of the node's GPUs) per node", unit: "%",
   range: [0, 100], onlyWhere: true},
];

function chartNodes(metric) { return state.history.nodes.filter(n => n[metric] !== undefined); }

function chartData(metric) {
  return [state.history.t, ...chartNodes(metric).map(n => n[metric])];
}

function buildCharts() {
  if (route().page !== "fleet" || !state.history) return;
  destroyCharts();
  const nodes = state.history.nodes;
  state.chartNodes = nodes.map(n => n.id).join(",");
  for (const {metric, id, unit, range, onlyWhere} of CHARTS) {
    const box = document.getElementById(id);
    box.querySelectorAll(".uplot, .note").forEach(el => el.remove());
    const charted = chartNodes(metric);
    box.hidden = Boolean(onlyWhere) && !charted.length;
    if (box.hidden) continue;
    const width = Math.max(box.clientWidth - 16, 300);
    const opts = {
      width, height: 220,
      scales: {x: {time: true}, y: range ? {range: () => range} : {range: (u, lo, hi) => [0, Math.max(hi * 1.1, 1)]}},
      axes: [{}, {values: (u, ticks) => ticks.map(v => `${num(v)}${unit === "%" ? "%" : ""}`), size: 50}],
      series: [{}, ...charted.map(n => ({label: n.name, ...lineStyle(nodes.indexOf(n)), width: 1.5,
        points: {show: false},
        value: (u, v) => v == null ? "-" : `${num(v, 1)} ${unit}`}))],
      legend: {live: true},
    };
    state.charts[metric] = new uPlot(opts, chartData(metric), box);
    state.charts[metric].root.dataset.points = String(state.history.t.length);
    if (!nodes.length) box.append(h("p", {class: "note"}, "No live nodes in the last 15 minutes."));
  }
  const note = document.getElementById("chart-note");
  note.textContent = state.history.nodes_total > nodes.length ?
    `Showing the ${nodes.length} busiest of ${state.history.nodes_total} nodes.` : "";
}

function appendSample(sample) {
  if (route().page !== "fleet") return;  // the fleet's charts only: a node page is drawn anew at each tick
  const history = state.history;
  if (!history || sample.t <= history.t[history.t.length - 1]) return;  // already in the history fetched
  const charted = new Set(history.nodes.map(n => n.id));
  const unseen = Object.keys(sample.values).some(id => !charted.has(id));
  const newGpu = Object.keys(sample.gpu_memory || {}).some(id => charted.has(id) &&
    !history.nodes.find(n => n.id === id).gpu_memory);
  if ((unseen && history.nodes.length < CHARTED_MAX) || newGpu) {
    loadHistory();  // a node joined (or first reported GPU memory): its series needs a place on the charts
    return;
  }
  history.t.push(sample.t);
  const farm = sample.farm_cpu || {}, gpu = sample.gpu_memory || {};
  for (const n of history.nodes) {
    const values = sample.values[n.id];
    n.cpu.push(values ? values[0] : null);
    n.farm_cpu.push(farm[n.id] ?? null);
    n.owner_cpu.push(values && farm[n.id] != null ? Math.max(values[0] - farm[n.id], 0) : null);
    n.power.push(values ? values[1] : null);
    n.memory.push(sample.memory ? sample.memory[n.id] ?? null : null);
    if (n.gpu_memory) n.gpu_memory.push(gpu[n.id] ?? null);
  }
  const series = ["cpu", "farm_cpu", "owner_cpu", "power", "memory", "gpu_memory"];
  while (history.t.length && history.t[0] < sample.t - WINDOW_S) {
    history.t.shift();
    for (const n of history.nodes) for (const metric of series) if (n[metric]) n[metric].shift();
  }
  for (const [metric, chart] of Object.entries(state.charts)) {
    chart.setData(chartData(metric));
    chart.root.dataset.points = String(history.t.length);
  }
}

window.addEventListener("resize", () => {
  for (const [metric, chart] of Object.entries(state.charts)) {
    const box = document.getElementById(CHARTS.find(c => c.metric === metric)?.id || metric);  // or a node chart's
    if (box) chart.setSize({width: Math.max(box.clientWidth - 16, 300), height: 220});
  }
});

// ---- the job page

async function loadJob(id) {
  try {
    state.job = await api(`api/jobs/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof Locked) return;
    document.getElementById("view").replaceChildren(h("p", {}, h("a", {href: "#/"}, "← fleet")),
      h("p", {class: "error"}, String(error.message)));
    return;
  }
  renderJob();
  await loadLog(id);
}

// The job's log: its events and what its shards printed (their output and tracebacks). It is the job's own data:
// reading it needs the API token, as `farm logs` does. Fetched after the last line already shown.
async function loadLog(id) {
  if (!state.log || state.log.id !== id) state.log = {id, lines: [], after: 0};
  const log = state.log;
  if (state.token) {
    try {
      const lines = await api(`api/jobs/${encodeURIComponent(id)}/logs` + (log.after ? `?after=${log.after}` : ""));
      if (state.log !== log) return;  // another job's page meanwhile
      log.lines.push(...lines);
      if (lines.length) log.after = lines[lines.length - 1].id;
      log.error = "";
    } catch (error) {
      log.error = String(error.message);
    }
  }
  renderLog();
}

function logText(line) {
  const stamp = new Date(line.ts * 1000).toLocaleTimeString([], {hour12: false});
  const lead = `${stamp} ${line.level.padEnd(7)} ${line.shard == null ? "" : `[shard ${line.shard}] `}`;
  return line.message.split("\n").map((text, i) => (i ? " ".repeat(lead.length) : lead) + text).join("\n");
}

function renderLog() {
  const box = document.getElementById("job-log");
  if (!box || !state.log) return;
  if (!state.token) {
    box.replaceChildren(h("span", {class: "dim"}, "Sign in with the API token to read the job's log."));
    return;
  }
  box.replaceChildren(...state.log.lines.map(line => h("div", {class: `log-line log-${line.level}`,
    "data-shard": line.shard == null ? "" : String(line.shard)}, logText(line))));
  if (state.log.error) box.append(h("div", {class: "error"}, state.log.error));
}

// ---- the node page

async function loadNode(id) {
  let node;
  try {
    node = await api(`api/nodes/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof Locked) return;
    document.getElementById("view").replaceChildren(h("p", {}, h("a", {href: "#/"}, "← fleet")),
      h("p", {class: "error"}, String(error.message)));
    return;
  }
  if (route().page !== "node") return;
  const hw = node.hardware;
  const gpuMemory = node.gpu_memory.map(m => h("tr", {"data-device": m.device}, h("td", {}, m.device),
    h("td", {class: "num"}, `${num(m.used_bytes / 2 ** 30, 1)} GiB`), h("td", {class: "num"},
      `${num(m.total_bytes / 2 ** 30, 1)} GiB`), h("td", {class: "num"}, m.percent == null ? "-" :
      `${num(m.percent)}%`)));
  const meta = [
    ["State", stateCell(node.state)], ["Activity", stateCell(node.activity, "act")],
    ["Owner", node.busy ? `busy: ${node.busy}` : "idle"],
    ["Jobs", jobLinks(node.jobs)],
    ["CPU", cpuSplit(node)], ["Memory", `${num(node.memory_percent)}%`],
    ["GPU memory", node.gpu_memory.length ? gpuMemoryText(node.gpu_memory) : null],
    ["Power", node.power.length ? figure(watts(node.power_w), node.power_estimate, node.power_source) : "-"],
    ["Shards", `${num(node.shards_running)} running · ${num(node.shards_done)} done`],
    ["Items done", num(node.items_done)],
    ["Energy", node.energy_source ? figure(joules(node.energy_j), node.energy_estimate, node.energy_source) : "-"],
    ["Machine", `${hw.cpu_model}, ${hw.cpu_cores} cores, ${hw.os}/${hw.arch}` +
      (hw.gpus.length ? ` · ${hw.gpus.join(", ")}` : "") + (hw.apple_chip ? ` · ${hw.apple_chip}` : "")],
    ["Heartbeat", ago(node.last_heartbeat)],
  ].filter(([, value]) => value !== null);
  const backends = node.backends.map(b => h("tr", {"data-backend": b.name},
    h("td", {}, b.name), h("td", {}, b.device), h("td", {}, b.available ? "available" : `unavailable: ${b.reason}`),
    h("td", {}, b.detail || "-"),
    h("td", {class: "num"}, idleDraw(b) || "-")));
  const power = node.power.map(p => h("tr", {}, h("td", {}, p.device),
    h("td", {class: "num"}, figure(watts(p.watts), p.estimate, p.source, p.scope))));
  document.getElementById("view").replaceChildren(h("div", {id: "node-page", "data-node": node.name},
    h("p", {}, h("a", {href: "#/"}, "← fleet")),
    h("h1", {}, `${node.name} `, h("span", {class: "dim"}, node.id)),
    h("div", {class: "meta"}, meta.map(([label, value]) => h("div", {}, h("span", {class: "label"}, label), value))),
    h("p", {}, live(node) ? drainButton(node) : null),
    h("h2", {}, "Backends"),
    h("div", {class: "table-wrap"}, h("table", {id: "node-backends"}, h("thead", {}, h("tr", {},
      ["Backend", "Device", "State", "Detail", "Idle draw"].map((c, i) => h("th", {class: i === 4 ? "num" : null}, c)))),
      h("tbody", {}, backends))),
    h("h2", {}, "Last 15 minutes"),
    h("div", {class: "charts"},
      NODE_CHARTS.map(c => h("div", {class: "chart", id: c.id}, h("h3", {}, c.title)))),
    h("h2", {}, "Power now, by device"),
    h("div", {class: "table-wrap"}, h("table", {id: "node-power"}, h("tbody", {}, power.length ? power :
      h("tr", {}, h("td", {class: "empty"}, "no power readings"))))),
    gpuMemory.length ? h("h2", {}, "GPU memory now, by device") : null,
    gpuMemory.length ? h("div", {class: "table-wrap"}, h("table", {id: "node-gpu-memory"}, h("thead", {},
      h("tr", {}, ["Device", "Used", "Total", "In use"].map((c, i) => h("th", {class: i ? "num" : null}, c)))),
      h("tbody", {}, gpuMemory))) : null,
    h("h2", {}, "Perf/W by model on this node"),
    h("p", {class: "dim"}, "Items per joule of each model on each backend of this node, over the latest jobs: " +
      "never one figure across models."),
    h("div", {class: "table-wrap"}, h("table", {id: "node-models"}))));
  renderModels(node.models, "node-models");
  buildNodeCharts(node.history.nodes[0], node.history.t);
}

// A node's own charts, from what the head sampled of it: its CPU, Farm's share and its owner's, and its power.
const NODE_CHARTS = [
  {id: "node-chart-cpu", title: "CPU (% of the machine): Farm's and the owner's", unit: "%",
   lines: [["farm_cpu", "Farm"], ["owner_cpu", "owner"]]},
  {id: "node-chart-power", title: "Power (W)", unit: "W", lines: [["power", "power"]]},
];

function buildNodeCharts(series, t) {
  destroyCharts();
  for (const {id, unit, lines} of NODE_CHARTS) {
    const box = document.getElementById(id);
    if (!series) {
      box.append(h("p", {class: "note"}, "Not live in the last 15 minutes."));
      continue;
    }
    const opts = {
      width: Math.max(box.clientWidth - 16, 300), height: 220,
      scales: {x: {time: true}, y: {range: (u, lo, hi) => unit === "%" ? [0, 100] : [0, Math.max(hi * 1.1, 1)]}},
      axes: [{}, {values: (u, ticks) => ticks.map(v => `${num(v)}${unit === "%" ? "%" : ""}`), size: 50}],
      series: [{}, ...lines.map(([, label], i) => ({label, ...lineStyle(i), width: 1.5, points: {show: false},
        value: (u, v) => v == null ? "-" : `${num(v, 1)} ${unit}`}))],
    };
    state.charts[id] = new uPlot(opts, [t, ...lines.map(([metric]) => series[metric])], box);
    state.charts[id].root.dataset.points = String(t.length);
  }
}

function live(node) { return node.state !== "offline"; }

function renderJob() {
  const job = state.job;
  if (!job || route().page !== "job") return;
  const cancel = job.cancellable ? h("button", {class: "danger", id: "cancel-job", disabled: !state.token,
    title: state.token ? "Cancel this job" : "Sign in with the API token to cancel", onclick: () => cancelJob(job)},
    "Cancel job") : null;
  const meta = [
    ["State", stateCell(job.state)], ["Kind", job.kind], ["Items", `${num(job.items_done)}/${num(job.items)}`],
    ["Energy", job.energy_sources.length ? figure(joules(job.energy_j), job.energy_estimate,
      job.energy_sources.join(", ")) : "-"],
    ["Above idle", job.marginal_j == null ? null : figure(joules(job.marginal_j), job.energy_estimate,
      job.energy_sources.join(", "))],
    ["Rate", rateText(job)],
    ["Items/s", job.items_per_s ? num(job.items_per_s) : "-"],
    ["Items/J", job.items_per_j ? figure(num(job.items_per_j, 1), job.energy_estimate,
      job.energy_sources.join(", ")) : "-"],
    ["Wall time", job.metrics.wall_s ? duration(job.metrics.wall_s) : "-"],
    ["Accuracy", job.metrics.accuracy != null ? `${num(job.metrics.accuracy * 100, 1)}%` : null],
    ["Results", h("span", {id: "job-results"}, job.output, h("div", {class: "dim"},
      `from anywhere: farm results ${job.id} --out DIR`))],
  ].filter(([, value]) => value !== null);
  const head = h("tr", {}, ["#", "State", "Node", "Device", "Items", "Seconds", "Waiting for input", "Energy",
    "Above idle", "Items/J", "Peak memory", "Tries", "Error"].map((c, i) => h("th", {class: i >= 4 && i < 12 ? "num"
    : null}, c)));
  const rows = job.shards_detail.map(s => h("tr", {"data-shard": s.index, "data-node": s.node_name},
    h("td", {}, s.index),
    h("td", {}, stateCell(s.state)),
    h("td", {class: "shard-node"}, s.node_name || "-"),
    h("td", {class: "shard-device"}, s.device || s.backend ? `${s.device || "-"} (${s.backend || "-"})` : "-"),
    h("td", {class: "num"}, num(s.items)),
    h("td", {class: "num"}, s.seconds ? num(s.seconds, 3) : "-"),
    // Of its measured seconds, the share it waited for its next batch (reading, decoding); the title says what
    // came before them on its node (farm/core/phases.py)
    h("td", {class: "num shard-input", title: s.before_s != null ? `before its measured time: ${s.before}` : null},
      s.input_wait_s != null && s.seconds ? `${num(100 * s.input_wait_s / s.seconds)}%` : "-"),
    h("td", {class: "num shard-energy"}, s.energy_source ? figure(joules(s.energy_j), s.energy_estimate,
      s.energy_source, s.energy_scope) : "-"),
    h("td", {class: "num shard-marginal"}, s.energy_source && s.marginal_j != null ? figure(joules(s.marginal_j),
      s.energy_estimate, s.energy_source, s.energy_scope) : "-"),
    h("td", {class: "num"}, s.energy_source && s.energy_j > 0 ? num(s.items / s.energy_j, 1) : "-"),
    h("td", {class: "num"}, s.peak_memory_bytes ? `${num(s.peak_memory_bytes / 2 ** 20)} MiB` : "-"),
    h("td", {class: "num"}, s.attempts),
    h("td", {class: "error"}, s.error)));
  document.getElementById("view").replaceChildren(h("div", {id: "job-page", "data-job": job.id},
    h("p", {}, h("a", {href: "#/"}, "← fleet")),
    h("h1", {}, `${job.name} `, h("span", {class: "dim"}, job.id)),
    h("div", {class: "meta"}, meta.map(([label, value]) => h("div", {}, h("span", {class: "label"}, label), value))),
    h("div", {id: "job-progress"}, progressBar(job)),
    job.error ? h("p", {class: "error"}, job.error) : null,
    h("p", {}, cancel, h("span", {class: "error", id: "cancel-error"})),
    h("h2", {}, "Shards: placement, time and energy"),
    h("div", {class: "table-wrap"}, h("table", {id: "shards"}, h("thead", {}, head), h("tbody", {}, rows))),
    h("h2", {}, "The scheduler's explanation"),
    h("pre", {class: "explain", id: "explanation"}, job.explanation || "No scheduling round has run yet."),
    h("h2", {}, "Log: events, and what each shard printed"),
    h("pre", {class: "explain job-log", id: "job-log"})));
  renderLog();
}

async function cancelJob(job) {
  if (!confirm(`Cancel job ${job.name} (${job.id})?`)) return;
  try {
    state.job = await api(`api/jobs/${encodeURIComponent(job.id)}/cancel`, {method: "POST"});
    renderJob();
  } catch (error) {
    document.getElementById("cancel-error").textContent = ` ${error.message}`;
  }
}

// ---- sign in: the API token, kept in this tab's sessionStorage

function renderAuth() {
  const box = document.getElementById("auth");
  box.replaceChildren(state.token ?
    h("span", {}, "signed in · ", h("button", {id: "signout", onclick: signOut}, "Sign out")) :
    h("span", {}, state.locked ? "signed out · " : "read-only · ",
      h("button", {id: "signin-open", onclick: openSignIn}, "Sign in")));
}

function openSignIn() {
  document.getElementById("signin-error").textContent = "";
  document.getElementById("signin").showModal();
}

// After a sign-in or out: the live stream again with the new credentials, and everything read afresh.
function reload() {
  renderAuth();
  if (stream) stream.abort();
  show();
  api("api/fleet").then(fleet => { state.fleet = fleet; renderFleet(); }).catch(() => {});
  api("api/jobs").then(jobs => { state.jobs = jobs; renderFleet(); }).catch(() => {});
}

function signOut() {
  state.token = "";
  sessionStorage.removeItem("farm.token");
  renderJob();
  renderFleet();  // the drain buttons follow the sign-in
  reload();
}

document.getElementById("signin-cancel").addEventListener("click", () => document.getElementById("signin").close());
document.getElementById("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = document.getElementById("token-input").value.trim();
  const response = await fetch("api/auth", {headers: {Authorization: `Bearer ${token}`}});
  if (response.status !== 204) {
    let why = "";
    try { why = (await response.json()).error || ""; } catch (_) { /* not JSON */ }
    document.getElementById("signin-error").textContent = why.startsWith("too many")
      ? `${why}.` : "That token is not this head's API token.";
    return;
  }
  state.token = token;
  state.locked = false;
  sessionStorage.setItem("farm.token", token);
  document.getElementById("token-input").value = "";
  document.getElementById("signin").close();
  renderJob();
  renderFleet();
  reload();
});

// ---- live updates

let stream = null;  // the AbortController of the open event stream

// Server-sent events through fetch, with the token: each event's lines up to a blank one; reconnects after 2 s (a
// head restart), at once after a sign-in or out.
async function connect() {
  const live = document.getElementById("live");
  for (;;) {
    stream = new AbortController();
    try {
      const response = await fetch("api/events", {headers: authHeaders(), signal: stream.signal});
      if (response.status === 401) {
        live.className = "live off";
        live.textContent = "signed out";
        if (!state.token) lock();
        await new Promise(resolve => stream.signal.addEventListener("abort", resolve));  // until a sign-in
        continue;
      }
      if (!response.ok) throw new Error(response.statusText);
      live.className = "live on";
      live.textContent = "live";
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const lines = buffer.slice(0, end).split("\n");
          buffer = buffer.slice(end + 2);
          const data = lines.filter(l => l.startsWith("data: ")).map(l => l.slice(6)).join("\n");
          if (lines.includes("event: tick") && data) onTick(JSON.parse(data));
        }
      }
    } catch (_) { /* the head went away, or a sign-in ended this stream */ }
    if (stream.signal.aborted) continue;
    live.className = "live off";
    live.textContent = "reconnecting…";
    await new Promise(resolve => setTimeout(resolve, 2000));
  }
}

function onTick(update) {
  const live = document.getElementById("live");
  state.ticks += 1;
  live.className = "live on";
  live.textContent = `live · ${new Date(update.sample.t * 1000).toLocaleTimeString()}`;
  live.dataset.ticks = String(state.ticks);
  state.fleet = update.fleet;
  state.jobs = update.jobs;
  renderFleet();
  appendSample(update.sample);
  // A job page follows its job until it finishes (the fetch that sees it finished is the last one).
  if (route().page === "job" && state.job && !state.job.finished) loadJob(state.job.id);
  if (route().page === "node") loadNode(route().id);
}

window.addEventListener("hashchange", show);
reload();
connect();
