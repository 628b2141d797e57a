// MiniServe monitor, cluster view: routing decisions and two live charts over the last five
// minutes (common/chart.js, a plain <canvas>): tokens/s with queue depth, and each job's time
// to first token. All from the /overview poll: the workers' heartbeats and the job rows.
"use strict";

const WINDOW_S = 300;       // the chart shows the last five minutes
const RATE_OVER_S = 10;     // tokens/s is averaged over this (heartbeats arrive every 5 s)
const samples = [];         // {t, tokens, depth}: tokens is a monotonic total across workers
const lastCount = {};       // worker name -> its last token_events (a restart resets it)
const firstTokens = new Map();  // job id -> {t, ttft, method}: the TTFT chart's dots
const METHOD_COLOURS = ["#2f6fdf", "#c23b3b", "#1f8a4c", "#b7791f", "#7b3fbf", "#0f8b8d"];
let tokensTotal = 0;

function sampleCluster(data) {
  for (const w of data.workers) {
    const n = (w.info || {}).token_events;
    if (typeof n !== "number") continue;
    const before = lastCount[w.name];
    if (before !== undefined && n >= before) tokensTotal += n - before;
    lastCount[w.name] = n;
  }
  const shared = Object.values(data.queues).reduce((a, b) => a + b, 0);
  const own = data.workers.reduce((a, w) => a + (w.waiting || 0), 0);
  const t = Date.now() / 1000;
  samples.push({ t, tokens: tokensTotal, depth: shared + own });
  while (samples.length && samples[0].t < t - WINDOW_S - RATE_OVER_S) samples.shift();
}

function series() {
  const out = [];
  let j = 0;
  for (let i = 0; i < samples.length; i++) {
    while (samples[i].t - samples[j].t > RATE_OVER_S) j++;
    const dt = samples[i].t - samples[j].t;
    out.push({ t: samples[i].t, rate: dt > 0 ? (samples[i].tokens - samples[j].tokens) / dt : 0, depth: samples[i].depth });
  }
  return out;
}

const minuteTicks = (now) => [0, 1, 2, 3, 4, 5].map((m) => ({ at: now - m * 60, label: m ? `-${m} min` : "now" }));

function drawThroughput(now) {
  const pts = series().filter((p) => p.t >= now - WINDOW_S);
  drawChart(document.getElementById("cluster-chart"), {
    x0: now - WINDOW_S, x1: now, xTicks: minuteTicks(now), left: {}, right: {},
    series: [{ points: pts.map((p) => [p.t, p.rate]), colour: "#2f6fdf" },
             { points: pts.map((p) => [p.t, p.depth]), colour: "#b7791f", axis: "right" }],
  });
  const last = pts[pts.length - 1];
  document.getElementById("chart-now").textContent = last
    ? `tokens/s ${last.rate.toFixed(1)} · waiting ${last.depth}` : "";
}

// Each job's time to first token, at the moment of its first token: kept across polls (the
// overview lists only the latest jobs), dropped once out of the window.
function sampleTtft(jobs) {
  for (const j of jobs) {
    const ttft = j.timings.ttft_s;
    if (ttft === undefined || j.started_at === null || j.started_at === undefined) continue;
    firstTokens.set(j.id, { t: j.started_at + ttft, ttft, method: j.method || j.type });
  }
  const oldest = Date.now() / 1000 - WINDOW_S;
  for (const [id, p] of firstTokens) if (p.t < oldest) firstTokens.delete(id);
}

function drawTtft(now) {
  const methods = [...new Set([...firstTokens.values()].map((p) => p.method))].sort();
  const colour = (m) => METHOD_COLOURS[methods.indexOf(m) % METHOD_COLOURS.length];
  drawChart(document.getElementById("ttft-chart"), {
    x0: now - WINDOW_S, x1: now, xTicks: minuteTicks(now).filter((_, i) => i % 2 === 0), left: { min: 0.01 },
    series: methods.map((m) => ({ kind: "dots", colour: colour(m),
      points: [...firstTokens.values()].filter((p) => p.method === m).map((p) => [p.t, p.ttft]) })),
  });
  document.getElementById("ttft-legend").replaceChildren("time to first token, s (one dot per job): ",
    ...methods.map((m) => {
      const ttfts = [...firstTokens.values()].filter((p) => p.method === m).map((p) => p.ttft).sort((a, b) => a - b);
      return el("span", { class: "method", "data-method": m, "data-jobs": ttfts.length },
        el("span", { class: "swatch", style: `background: ${colour(m)}` }),
        `${m}: ${ttfts.length} jobs, median ${secs((ttfts[(ttfts.length - 1) >> 1] + ttfts[ttfts.length >> 1]) / 2)}`);
    }));
}

function renderRouting(routing) {
  const d = routing.decisions || {};
  const total = Object.values(d).reduce((a, b) => a + b, 0);
  const cells = Object.entries(d).map(([name, n]) =>
    el("div", { class: "queue", "data-decision": name }, name.replace("_", " "), el("b", {}, n)));
  const share = total ? Math.round((100 * (d.routed || 0)) / total) + "% routed to a cache holder" : "no generation jobs yet";
  document.getElementById("routing").replaceChildren(...cells, el("span", { class: "muted" }, share));
}

function renderCluster(data) {
  sampleCluster(data);
  sampleTtft(data.jobs);
  renderRouting(data.routing || {});
  const now = Date.now() / 1000;
  drawThroughput(now);
  drawTtft(now);
}
window.renderCluster = renderCluster;
