// A line chart on a plain <canvas>, shared by the monitor (the cluster over the last minutes)
// and the playground (each method's output over time). No library, no CDN.
"use strict";

const CHART_PAD = { l: 44, r: 44, t: 10, b: 22 };

// Draw `series` ({points: [[x, y]...], colour, axis: "left" | "right", kind: "line" | "step" |
// "dots"}) over x in [x0, x1], with xTicks ([{at, label}]). Each axis runs from 0 to its own
// largest value (at least its `min`, default 1) rounded up to four round steps; `left` and
// `right` ({min, digits}) label them, and a null `right` leaves that side blank. The canvas
// is redrawn at the device's pixel ratio, so it stays sharp.
function drawChart(canvas, { x0, x1, xTicks = [], left = {}, right = null, series = [] }) {
  const ctx = canvas.getContext("2d"), dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight, pad = CHART_PAD;
  canvas.width = width * dpr; canvas.height = height * dpr;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const top = (axis) => niceTop(Math.max(axis.min ?? 1, ...series.filter((s) => (s.axis || "left") === axis.side)
    .flatMap((s) => s.points.map((p) => p[1]))));
  const axes = { left: { ...left, side: "left" }, right: right && { ...right, side: "right" } };
  for (const axis of Object.values(axes)) if (axis) axis.max = top(axis);
  const x = (v) => pad.l + ((v - x0) / Math.max(x1 - x0, 1e-9)) * (width - pad.l - pad.r);
  const y = (v, axis) => height - pad.b - (v / axis.max) * (height - pad.t - pad.b);
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#dcdfe6"; ctx.fillStyle = "#6b7080"; ctx.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const gy = y((axes.left.max * k) / 4, axes.left);
    ctx.beginPath(); ctx.moveTo(pad.l, gy); ctx.lineTo(width - pad.r, gy); ctx.stroke();
    ctx.textAlign = "right"; ctx.fillText(tick(axes.left, k), pad.l - 4, gy + 4);
    if (axes.right) { ctx.textAlign = "left"; ctx.fillText(tick(axes.right, k), width - pad.r + 4, gy + 4); }
  }
  ctx.textAlign = "center";
  for (const t of xTicks) ctx.fillText(t.label, x(t.at), height - 6);
  for (const s of series) drawSeries(ctx, s, x, (v) => y(v, axes[s.axis || "left"]));
}

// The axis top: four gridline steps of a round size (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 × 10^k).
function niceTop(v) {
  const raw = v / 4, unit = 10 ** Math.floor(Math.log10(raw));
  return 4 * unit * [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].find((m) => m * unit >= raw);
}

function tick(axis, k) {
  const v = (axis.max * k) / 4;
  const step = axis.max / 4, exact = (d) => Math.abs(Math.round(step * 10 ** d) - step * 10 ** d) < 1e-6;
  return v.toFixed(axis.digits ?? [0, 1, 2, 3, 4].find(exact) ?? 4);
}

function drawSeries(ctx, s, x, y) {
  ctx.strokeStyle = ctx.fillStyle = s.colour;
  if (s.kind === "dots") {
    for (const [px, py] of s.points) { ctx.beginPath(); ctx.arc(x(px), y(py), 3, 0, 2 * Math.PI); ctx.fill(); }
    return;
  }
  ctx.lineWidth = 2; ctx.beginPath();
  let before = null;  // a step line stays flat until the next value arrives
  s.points.forEach(([px, py], i) => {
    if (i === 0) ctx.moveTo(x(px), y(py));
    else { if (s.kind === "step") ctx.lineTo(x(px), y(before)); ctx.lineTo(x(px), y(py)); }
    before = py;
  });
  ctx.stroke(); ctx.lineWidth = 1;
}
