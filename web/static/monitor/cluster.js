// MiniServe monitor, cluster view: routing decisions and a live chart of tokens/s and queue
// depth over the last minutes, drawn on a plain <canvas> (no library, no CDN).
"use strict";

const WINDOW_S = 300;       // the chart shows the last five minutes
const RATE_OVER_S = 10;     // tokens/s is averaged over this (heartbeats arrive every 5 s)
const samples = [];         // {t, tokens, depth}: tokens is a monotonic total across workers
const lastCount = {};       // worker name -> its last token_events (a restart resets it)
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

function drawChart() {
  const canvas = document.getElementById("cluster-chart");
  const ctx = canvas.getContext("2d");
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * dpr; canvas.height = height * dpr;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const pad = { l: 44, r: 44, t: 10, b: 22 };
  const now = Date.now() / 1000, pts = series();
  const maxRate = Math.max(1, ...pts.map((p) => p.rate)) * 1.15;
  const maxDepth = Math.max(1, ...pts.map((p) => p.depth)) * 1.15;
  const x = (t) => pad.l + ((t - (now - WINDOW_S)) / WINDOW_S) * (width - pad.l - pad.r);
  const y = (v, max) => height - pad.b - (v / max) * (height - pad.t - pad.b);
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#dcdfe6"; ctx.fillStyle = "#6b7080";
  for (let k = 0; k <= 4; k++) {
    const gy = y((maxRate * k) / 4, maxRate);
    ctx.beginPath(); ctx.moveTo(pad.l, gy); ctx.lineTo(width - pad.r, gy); ctx.stroke();
    ctx.textAlign = "right"; ctx.fillText(((maxRate * k) / 4).toFixed(0), pad.l - 4, gy + 4);
    ctx.textAlign = "left"; ctx.fillText(((maxDepth * k) / 4).toFixed(0), width - pad.r + 4, gy + 4);
  }
  ctx.textAlign = "center";
  for (let m = 0; m <= 5; m++) ctx.fillText(m === 0 ? "now" : `-${m} min`, x(now - m * 60), height - 6);
  const line = (key, max, color) => {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    pts.filter((p) => p.t >= now - WINDOW_S).forEach((p, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(p.t), y(p[key], max)));
    ctx.stroke(); ctx.lineWidth = 1;
  };
  line("rate", maxRate, "#2f6fdf");
  line("depth", maxDepth, "#b7791f");
  const last = pts[pts.length - 1];
  document.getElementById("chart-now").textContent = last
    ? `tokens/s ${last.rate.toFixed(1)} · waiting ${last.depth}` : "";
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
  renderRouting(data.routing || {});
  drawChart();
}
window.renderCluster = renderCluster;
