// MiniServe playground, compare view: one prompt through several generation methods at once,
// a column each, a live chart of tokens over time per method (common/chart.js: each token
// event says how many tokens its job has generated), then a table.
"use strict";

const COLOURS = ["#2f6fdf", "#c23b3b", "#1f8a4c", "#b7791f", "#7b3fbf", "#0f8b8d"];
let lanes = [];        // {method, jobId, column, samples: [{t, tokens}], state, outcome}
let startedAt = 0, drawing = false;

function chosenMethods() {
  return [...document.querySelectorAll("#compare-methods input:checked")].map((i) => i.value);
}

function laneColumn(method, colour) {
  return el("div", { class: "column", "data-method": method, style: `border-top-color: ${colour}` },
    el("h3", {}, method), el("pre", { class: "text" }), el("div", { class: "stats muted" }, "submitting…"));
}

function drawLanes() {
  const now = performance.now() - startedAt, running = lanes.some((l) => !l.outcome);
  const end = Math.max(1000, running ? now : 0, ...lanes.flatMap((l) => l.samples.map((s) => s.t)));
  for (const lane of lanes) lane.count.textContent = lane.samples.length ? lane.samples[lane.samples.length - 1].tokens : 0;
  drawChart($("compare-chart"), {
    x0: 0, x1: end, right: null,
    xTicks: [{ at: 0, label: "0" }, { at: end / 2, label: `${(end / 2000).toFixed(1)} s` }, { at: end, label: `${(end / 1000).toFixed(1)} s` }],
    series: lanes.map((lane, i) => {
      const points = [[0, 0], ...lane.samples.map((s) => [s.t, s.tokens])];
      if (!lane.outcome) points.push([now, points[points.length - 1][1]]);
      return { points, colour: COLOURS[i % COLOURS.length], kind: "step" };
    }),
  });
}

function animate() {
  drawLanes();
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
      const t = performance.now() - startedAt;
      if (e.type === "token") {
        text.textContent += e.data.text;
        lane.samples.push({ t, tokens: e.data.tokens });
      } else if (e.type === "done" && e.data.usage) {  // an end-of-text token has no text of its own
        lane.samples.push({ t, tokens: e.data.usage.completion_tokens });
      }
    }, (kind, detail, seq) => { stats.textContent = streamNoteText(kind, detail, seq); connectionNote(kind, detail, seq); });
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
  $("compare-legend").replaceChildren("tokens over time: ", ...lanes.map((l, i) => {
    l.count = el("span", { class: "count" }, "0");
    return el("span", { "data-method": l.method }, el("span", { class: "swatch", style: `background: ${COLOURS[i % COLOURS.length]}` }),
      `${l.method} `, l.count, " tokens");
  }));
  $("compare-table").tBodies[0].replaceChildren();
  startedAt = performance.now();
  if (!drawing) { drawing = true; requestAnimationFrame(animate); }
  await Promise.all(lanes.map((lane) => runLane(lane, body)));
  drawLanes();
  renderTable();
  $("compare-run").disabled = $("compare-again").disabled = false;
}

$("compare-form").addEventListener("submit", (e) => { e.preventDefault(); compare(); });
$("compare-again").addEventListener("click", compare);
