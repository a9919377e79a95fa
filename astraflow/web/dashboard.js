// AstraFlow's live dashboard: charts and tables from /events (server-sent events).
// A `snapshot` event carries every kept point of every series and the tables; each `update`
// carries the points series gained since and the tables as they are now. Series are named
// `<kind>/<policy or team>`; KINDS says which chart each kind goes to and how it is labelled.
"use strict";

const KINDS = {
  reward: { chart: "reward", label: (p) => p },
  heldout: { chart: "heldout", label: (p) => (p === "team" ? "team accuracy" : `${p} accuracy`) },
  role_reward: { chart: "heldout", label: (p) => `${p} role reward`, dash: true },
  version: { chart: "version", label: (p) => p, stepped: true },
  staleness: { chart: "staleness", label: (p) => p, stepped: true },
  wait_s: { chart: "trainer", label: (p) => `${p} wait` },
  train_s: { chart: "trainer", label: (p) => `${p} train`, dash: true },
  tokens_per_s: { chart: "tokens", label: (p) => p },
  weight_bytes: { chart: "bytes", label: (p) => p, scatter: true },
  publish_s: { chart: "latency", label: (p) => `${p} publish`, scatter: true },
  weight_latency: { chart: "latency", label: (p) => `${p} at a node`, scatter: true, triangle: true },
  logp_gap: { chart: "mismatch", label: (p) => `${p} |Δ log p| mean` },
  logp_gap_p99: { chart: "mismatch", label: (p) => `${p} |Δ log p| p99`, dash: true },
  masked_frac: { chart: "mismatch", label: (p) => `${p} masked tokens`, scatter: true, triangle: true },
};
const AXES = {
  reward: ["trainer step", "mean reward"], heldout: ["version", "held-out"], version: ["s since start", "version"],
  staleness: ["trainer step", "versions"], trainer: ["trainer step", "s"], tokens: ["s since start", "tokens/s"],
  bytes: ["version", "bytes"], latency: ["version", "s"], mismatch: ["trainer step", "nats · fraction"],
};
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
const colorOf = {};  // policy (or "team") -> its colour, the same on every chart
function color(who) {
  if (!(who in colorOf)) colorOf[who] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[who];
}

function tint(hex) {  // the colour halfway to white: a policy's second series on the same chart
  const n = parseInt(hex.slice(1), 16);
  const mix = (v) => Math.round(v + (255 - v) * 0.5);
  return `rgb(${mix(n >> 16)}, ${mix((n >> 8) & 255)}, ${mix(n & 255)})`;
}

const charts = {};
function chart(id) {
  if (charts[id]) return charts[id];
  const [x, y] = AXES[id];
  charts[id] = new Chart(document.getElementById(`chart-${id}`), {
    type: "line",
    data: { datasets: [] },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
      interaction: { mode: "nearest", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },  // below the plot: it covers no data
      scales: {
        x: { type: "linear", title: { display: true, text: x } },
        y: { type: "linear", title: { display: true, text: y }, beginAtZero: id !== "reward" && id !== "heldout" },
      },
    },
  });
  return charts[id];
}

const datasets = {};  // series name -> its Chart.js dataset
function dataset(name) {
  if (datasets[name]) return datasets[name];
  const [kind, who] = name.split("/", 2);
  const k = KINDS[kind];
  if (!k) return null;
  const c = k.dash || k.triangle ? tint(color(who || "")) : color(who || "");
  const ds = {
    label: k.label(who || ""), data: [], borderColor: c, backgroundColor: c, borderWidth: 1.5,
    pointRadius: k.scatter ? 3 : 0, showLine: !k.scatter, stepped: k.stepped ? "before" : false,
    borderDash: k.dash ? [5, 3] : [], pointStyle: k.triangle ? "triangle" : "circle",
  };
  chart(k.chart).data.datasets.push(ds);
  datasets[name] = ds;
  return ds;
}

function addSeries(series) {
  const touched = new Set();
  for (const [name, points] of Object.entries(series)) {
    const ds = dataset(name);
    if (!ds) continue;
    for (const [x, y] of points) ds.data.push({ x, y });
    if (ds.data.length > 5000) ds.data.splice(0, ds.data.length - 5000);
    touched.add(KINDS[name.split("/")[0]].chart);
  }
  for (const id of touched) charts[id].update("none");
}

function text(el, value) { el.textContent = value; return el; }
function cell(tr, value, cls) {
  const td = document.createElement("td");
  text(td, value);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function badge(td, state) {
  td.textContent = "";
  const b = text(document.createElement("span"), state);
  b.className = `badge state-${state}`;
  td.appendChild(b);
}
function fill(tableId, rows, render) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows.map((r) => { const tr = document.createElement("tr"); render(tr, r); return tr; }));
}
function age(s) { return s < 1 ? "now" : `${s.toFixed(0)} s ago`; }

function tables(s) {
  text(document.getElementById("job"), s.job);
  const st = document.getElementById("state");
  st.className = `badge state-${s.state.replace(" ", "-")}`;
  text(st, s.state);
  text(document.getElementById("versions"),
       Object.entries(s.versions).map(([p, v]) => `${p} v${v.version}`).join(" · "));
  text(document.getElementById("records"), `${s.records} records read`);
  text(document.getElementById("pool-summary"),
       `${s.pool.alive} of ${s.pool.nodes.length} alive · ${s.pool.tokens_per_s} tokens/s (last 5 s window) · gone after ${s.alive_s} s without a heartbeat`);
  fill("pool", s.pool.nodes, (tr, n) => {
    tr.dataset.node = n.node;
    tr.dataset.state = n.state;
    cell(tr, n.node); cell(tr, n.policy); cell(tr, n.version); cell(tr, n.behind); cell(tr, n.tokens_per_s);
    badge(cell(tr, "", "state"), n.state);
    cell(tr, age(n.last_seen_s));
  });
  fill("components", s.components, (tr, n) => {
    tr.dataset.node = n.node;
    cell(tr, n.node); cell(tr, n.role); cell(tr, n.policy); cell(tr, n.version);
    badge(cell(tr, "", "state"), n.state);
    cell(tr, age(n.last_seen_s));
  });
  text(document.getElementById("failed"), s.failed.map((f) => `${f.node} failed: ${f.error}`).join("\n"));
  text(document.getElementById("dlq-count"), s.dead_letters.count);
  fill("dlq", s.dead_letters.latest, (tr, d) => {
    cell(tr, `${d.topic}[${d.partition}]@${d.offset}`);
    cell(tr, `${d.error_type}: ${d.error}`, "err");
    cell(tr, d.consumer);
  });
  document.getElementById("regions-card").hidden = s.regions.length === 0;
  fill("regions", s.regions, (tr, r) => {
    cell(tr, r.region); cell(tr, r.nodes); cell(tr, r.alive); cell(tr, r.max_behind); cell(tr, age(r.max_last_seen_s));
  });
}

function connect() {
  const events = new EventSource("/events");
  const link = document.getElementById("link");
  let finished = false;  // the job's end is on its topics: nothing more will come
  const show = (s) => {
    addSeries(s.series);
    tables(s);
    finished = s.state === "done";
  };
  events.addEventListener("snapshot", (e) => {
    for (const ds of Object.values(datasets)) ds.data.length = 0;
    show(JSON.parse(e.data));
    text(link, finished ? "job done" : "live");
  });
  events.addEventListener("update", (e) => {
    show(JSON.parse(e.data));
    if (finished) text(link, "job done");
  });
  events.onerror = () => {
    if (finished) {  // the server closed after the job ended: what the page shows is final
      events.close();
      text(link, "job done · the dashboard has stopped");
    } else {
      text(link, "reconnecting…");  // EventSource reconnects by itself
    }
  };
}

// What a test (or a curious user in the console) reads: the charts and their points.
window.astraflow = {
  charts,
  points: (name) => (datasets[name] ? datasets[name].data.length : 0),
  series: () => Object.keys(datasets),
};
connect();
