// MiniServe playground, compare view: one prompt through several generation methods at once,
// a column each, a live chart of text streamed over time (plain <canvas>), then a table.
"use strict";

const COLOURS = ["#2f6fdf", "#c23b3b", "#1f8a4c", "#b7791f", "#7b3fbf", "#0f8b8d"];
let lanes = [];        // {method, jobId, column, samples: [{t, chars}], state, outcome}
let startedAt = 0, drawing = false;

function chosenMethods() {
  return [...document.querySelectorAll("#compare-methods input:checked")].map((i) => i.value);
}

function laneColumn(method, colour) {
  return el("div", { class: "column", "data-method": method, style: `border-top-color: ${colour}` },
    el("h3", {}, method), el("pre", { class: "text" }), el("div", { class: "stats muted" }, "submitting…"));
}

function drawChart() {
  const canvas = $("compare-chart"), ctx = canvas.getContext("2d");
  const dpr = window.devicePixelRatio || 1, width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = width * dpr; canvas.height = height * dpr;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const pad = { l: 44, r: 10, t: 10, b: 22 };
  const all = lanes.flatMap((l) => l.samples);
  const running = lanes.some((l) => !l.outcome);
  const maxT = Math.max(1, running ? performance.now() - startedAt : 0, ...all.map((s) => s.t)), maxC = Math.max(1, ...all.map((s) => s.chars));
  const x = (t) => pad.l + (t / maxT) * (width - pad.l - pad.r);
  const y = (c) => height - pad.b - (c / maxC) * (height - pad.t - pad.b);
  ctx.strokeStyle = "#dcdfe6"; ctx.fillStyle = "#6b7080"; ctx.font = "11px system-ui";
  ctx.strokeRect(pad.l, pad.t, width - pad.l - pad.r, height - pad.t - pad.b);
  ctx.fillText(`${maxC} chars`, 2, pad.t + 8);
  ctx.fillText(`${(maxT / 1000).toFixed(1)} s`, width - pad.r - 30, height - 6);
  ctx.fillText("0", pad.l - 10, height - 6);
  lanes.forEach((lane, i) => {
    ctx.strokeStyle = COLOURS[i % COLOURS.length]; ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(x(0), y(0));
    let chars = 0;  // a step line: flat until each chunk arrives, nothing drawn before it
    for (const s of lane.samples) { ctx.lineTo(x(s.t), y(chars)); ctx.lineTo(x(s.t), y(s.chars)); chars = s.chars; }
    if (!lane.outcome) ctx.lineTo(x(performance.now() - startedAt), y(chars));
    ctx.stroke();
  });
}

function animate() {
  drawChart();
  if (lanes.some((l) => !l.outcome)) requestAnimationFrame(animate); else drawing = false;
}

async function runLane(lane, body) {
  const text = lane.column.querySelector(".text"), stats = lane.column.querySelector(".stats");
  try {
    const job = await postJson("/jobs", { ...body, generation_method: lane.method });
    lane.jobId = job.id;
    lane.column.dataset.jobId = job.id;
    stats.textContent = "running…";
    const stream = streamJob(job.id, (e) => {
      if (e.type !== "token") return;
      text.textContent += e.data.text;
      lane.samples.push({ t: performance.now() - startedAt, chars: text.textContent.length });
    }, (msg) => { stats.textContent = msg; });
    await stream.finished;
    lane.outcome = await jobOutcome(job.id);
    lane.state = lane.outcome.job.state;
    stats.textContent = statsLine(lane.outcome);
  } catch (err) {
    lane.outcome = { usage: {}, timings: {} };
    lane.state = "rejected";
    stats.textContent = err.message;
    stats.className = "stats error";
  }
  lane.column.dataset.state = lane.state;
}

function renderTable() {
  const first = lanes.find((l) => l.state === "succeeded");
  const reference = first ? first.outcome.text : null;
  $("compare-table").tBodies[0].replaceChildren(...lanes.map((lane) => {
    const u = lane.outcome.usage, t = lane.outcome.timings;
    const same = lane.state !== "succeeded" || reference === null ? "–" : lane.outcome.text === reference ? "yes" : "no";
    return el("tr", { "data-method": lane.method },
      el("td", {}, lane.method), el("td", {}, lane.state), el("td", { class: "num" }, secs(t.ttft_s)),
      el("td", { class: "num" }, fmt(t.decode_tokens_per_s, 1)), el("td", { class: "num" }, u.completion_tokens ?? "–"),
      el("td", { class: "num cached" }, u.prompt_tokens === undefined ? "–" : `${u.prompt_tokens} / ${u.cached_tokens ?? 0}`),
      el("td", { class: "num" }, u.draft_tokens ? `${u.accepted_draft_tokens ?? 0} / ${u.draft_tokens}` : "–"),
      el("td", { class: "same" }, same));
  }));
  const agree = lanes.filter((l) => l.state === "succeeded").every((l) => l.outcome.text === reference);
  const cached = lanes.filter((l) => l.outcome.usage.cached_tokens).map((l) => `${l.method} reused ${l.outcome.usage.cached_tokens}`);
  $("compare-status").textContent = (agree ? "all finished texts are identical" : "the texts differ") +
    (cached.length ? ` · prefix cache hit: ${cached.join(", ")} prompt tokens` : " · no cached prompt tokens");
}

async function compare() {
  const methods = chosenMethods();
  let body;
  try {
    body = { ...samplingBody(), prompt: $("compare-prompt").value.trim(), prefix: $("compare-prefix").value.trim() || undefined };
  } catch (err) {
    $("compare-status").textContent = err.message;
    return;
  }
  if (!methods.length || !body.prompt) {
    $("compare-status").textContent = !methods.length ? "choose at least one method" : "prompt: write one";
    return;
  }
  $("compare-run").disabled = $("compare-again").disabled = true;
  $("compare-status").textContent = `running ${methods.length} methods…`;
  lanes = methods.map((method, i) => ({ method, samples: [], column: laneColumn(method, COLOURS[i % COLOURS.length]) }));
  $("compare-columns").replaceChildren(...lanes.map((l) => l.column));
  $("compare-legend").replaceChildren(...lanes.map((l, i) =>
    el("span", {}, el("span", { class: "swatch", style: `background: ${COLOURS[i % COLOURS.length]}` }), l.method)));
  $("compare-table").tBodies[0].replaceChildren();
  startedAt = performance.now();
  if (!drawing) { drawing = true; requestAnimationFrame(animate); }
  await Promise.all(lanes.map((lane) => runLane(lane, body)));
  drawChart();
  renderTable();
  $("compare-run").disabled = $("compare-again").disabled = false;
}

$("compare-form").addEventListener("submit", (e) => { e.preventDefault(); compare(); });
$("compare-again").addEventListener("click", compare);
