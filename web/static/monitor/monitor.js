// MiniServe monitor: polls /overview, shows one job with its live events and its agent trace as
// readable steps. The DOM helpers, the job API and the event stream are in /static/common/ui.js.
"use strict";

const REFRESH_MS = Number(document.body.dataset.refreshMs) || 1500;
let selected = null;      // job id shown in the detail view
let follower = null;      // {close()} of the live event stream
let firstTs = null;       // the shown job's first event time: events are timed from it

function cacheCell(stats) {
  const parts = [];
  for (const [name, s] of Object.entries(stats || {})) {
    if (!s || typeof s !== "object") continue;
    const bits = [];
    if ("hits" in s && "misses" in s) {
      const total = s.hits + s.misses;
      bits.push(`hits ${s.hits} / misses ${s.misses}` + (total ? ` (${Math.round((100 * s.hits) / total)}%)` : ""));
    }
    const pool = s.blocks && typeof s.blocks === "object" ? s.blocks : null;  // the paged cache
    if (pool) {
      bits.push(`blocks ${pool.blocks_used}/${pool.num_blocks} used (peak ${pool.peak_blocks_used}, cached ${pool.blocks_cached})`);
      if (pool.prefix_query_tokens) {
        bits.push(`prefix hit tokens ${pool.prefix_hit_tokens}/${pool.prefix_query_tokens}` +
          ` (${Math.round(100 * pool.prefix_hit_tokens / pool.prefix_query_tokens)}%)`);
      }
    }
    if ("running" in s) bits.push(`running ${s.running}, waiting ${s.waiting}, batch ${s.batch_size}`);
    if ("entries" in s) bits.push(`entries ${s.entries}`);
    if ("cached_tokens" in s) bits.push(`tokens ${s.cached_tokens}`);
    if ("acceptance_rate" in s) {  // speculative decoding
      bits.push(`drafts accepted ${s.accepted_draft_tokens}/${s.draft_tokens} (${Math.round(100 * s.acceptance_rate)}%)`);
    }
    if (bits.length) parts.push(el("div", { class: "cache" }, el("b", {}, name + ": "), bits.join(", ")));
  }
  if (stats && "requests" in stats) parts.push(el("div", { class: "cache muted" }, `requests ${stats.requests}`));
  return parts.length ? parts : ["–"];
}

function renderWorkers(workers) {
  $("worker-count").textContent = workers.length;
  const body = $("workers").tBodies[0];
  body.replaceChildren(...workers.map((w) => {
    const i = w.info || {};
    const jobs = (i.current_jobs || []).map((id) => id.slice(0, 8)).join(", ") || "idle";
    const load = `${(i.current_jobs || []).length}/${i.concurrency ?? "?"} running, ${w.waiting ?? 0} waiting`;
    return el("tr", { class: "worker" },
      el("td", {}, w.name), el("td", {}, i.host ?? "–"), el("td", {}, i.model_id ?? i.model ?? "–"), el("td", {}, i.device ?? "–"), el("td", {}, i.dtype ?? "–"),
      el("td", { class: "num" }, fmt(i.load_s)), el("td", {}, `${i.pool ?? "?"} × ${i.concurrency ?? "?"}`),
      el("td", {}, jobs), el("td", { class: "load" }, load), el("td", { class: "num" }, w.routed_here ?? 0),
      el("td", { class: "num" }, fmt(w.age_s, 1) + " s ago"),
      el("td", {}, ...cacheCell(i.cache_stats)));
  }));
}

// Each queue's waiting jobs; below, those held at the fair gate by class and key
// (docs/scheduling.md): "batch: you 3 · others 40".
function renderQueues(queues, held) {
  $("queues").replaceChildren(...Object.entries(queues).map(([name, n]) => {
    const classes = Object.entries((held || {})[name] || {}).map(([cls, keys]) =>
      el("div", { class: "held", "data-class": cls }, `${cls}: ` +
        Object.entries(keys).map(([key, count]) => `${key} ${count}`).join(" · ")));
    return el("div", { class: "queue", "data-queue": name }, name, el("b", {}, n), ...classes);
  }));
}

function renderDead(dead) {
  $("dead-count").textContent = dead.length;
  $("dead-webhooks").tBodies[0].replaceChildren(...dead.map((d) => {
    const answer = d.last_answer || {};
    return el("tr", { "data-job-id": d.job_id }, el("td", {}, el("code", {}, d.job_id.slice(0, 12))),
      el("td", {}, d.url), el("td", { class: "num" }, `${d.tries} (round ${d.round})`),
      el("td", {}, answer.status !== undefined ? `HTTP ${answer.status}` : (answer.error ?? "–")),
      el("td", {}, d.dead_at ? clock(d.dead_at) : "–"));
  }));
}

function renderJobs(jobs, counts) {
  $("counts").textContent = Object.entries(counts).map(([s, n]) => `${s}: ${n}`).join(" · ");
  const body = $("jobs").tBodies[0];
  const focused = document.activeElement.closest && document.activeElement.closest("tr.job");  // kept over the redraw
  const focusedLink = focused && document.activeElement !== focused;
  body.replaceChildren(...jobs.map((j) => {
    const t = j.timings, u = j.usage;
    const row = el("tr", { class: "job" + (j.id === selected ? " selected" : ""), "data-job-id": j.id },
      el("td", {}, el("code", {}, j.id.slice(0, 12))), el("td", {}, j.type),
      el("td", { class: `state state-${j.state}` }, j.state), el("td", {}, j.method ?? "–"),
      el("td", {}, j.worker || "–"), el("td", {}, j.routing ?? "–"), el("td", {}, clock(j.created_at)), el("td", { class: "num" }, secs(t.queue_wait_s)),
      el("td", { class: "num" }, secs(t.ttft_s)), el("td", { class: "num" }, secs(t.job_total_s)),
      el("td", { class: "num" }, u.prompt_tokens === undefined ? "–" : `${u.prompt_tokens} / ${u.cached_tokens ?? 0}`),
      el("td", { class: "num" }, u.completion_tokens ?? "–"),
      el("td", { class: "num" }, u.draft_tokens ? `${u.accepted_draft_tokens ?? 0} / ${u.draft_tokens}` : "–"),
      el("td", { class: "num" }, fmt(t.decode_tokens_per_s, 1)),
      el("td", {}, el("a", { class: "playground-link", href: "/#job=" + j.id, title: "this job in the playground" }, "open")));
    row.tabIndex = 0;  // the keyboard opens a job too: Tab to its row, then Enter
    row.addEventListener("click", (e) => { if (!e.target.closest("a")) showJob(j.id); });
    row.addEventListener("keydown", (e) => { if (e.key === "Enter" && e.target === row) showJob(j.id); });
    return row;
  }));
  const again = focused && body.querySelector(`tr[data-job-id="${focused.dataset.jobId}"]`);
  if (again) (focusedLink ? again.querySelector("a") : again).focus();
}

async function refresh() {
  const params = new URLSearchParams({ limit: "50" });
  if ($("filter-type").value) params.set("type", $("filter-type").value);
  if ($("filter-state").value) params.set("state", $("filter-state").value);
  try {
    const data = await api("/overview?" + params);
    renderWorkers(data.workers);
    renderQueues(data.queues, data.held);
    renderDead(data.webhooks_dead || []);
    renderJobs(data.jobs, data.counts);
    if (window.renderCluster) window.renderCluster(data);
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    if (selected) await refreshDetail();
  } catch (err) {
    $("status").textContent = err instanceof ApiError ? "error: " + err.message
      : `the web server did not answer; retrying every ${REFRESH_MS / 1000} s`;
  }
}

// ---- job detail ------------------------------------------------------------------------
async function refreshDetail() {
  const outcome = await jobOutcome(selected), job = outcome.job;
  $("detail-state").textContent = job.state;
  $("detail-state").className = "state state-" + job.state;
  $("cancel").disabled = TERMINAL_STATES.includes(job.state);
  const fields = { type: job.type, queue: job.queue, worker: job.worker || "–", attempt: `${job.attempt}/${job.max_attempts}`,
    created: clock(job.created_at), started: clock(job.started_at), finished: clock(job.finished_at),
    "queue wait": secs(outcome.timings.queue_wait_s), TTFT: secs(outcome.timings.ttft_s), total: secs(outcome.timings.job_total_s),
    "tokens/s": fmt(outcome.timings.decode_tokens_per_s, 1), method: outcome.method || job.request.method || "–",
    ...usageWords(outcome.usage) };
  $("detail-fields").replaceChildren(...Object.entries(fields).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const payload = job.result || job.error;
  $("summary").replaceChildren(...summaryLines(job, outcome));
  $("result").textContent = payload ? JSON.stringify(payload, null, 2) : "(not finished)";
  const trace = (job.result && job.result.trace) || (job.error && job.error.trace) || [];
  $("trace-box").hidden = !trace.length;
  if ($("trace").children.length !== trace.length) $("trace").replaceChildren(...trace.map(stepView));
}

function usageWords(u) {
  if (!u || u.prompt_tokens === undefined) return {};
  return { "prompt tokens": `${u.prompt_tokens} (${u.cached_tokens ?? 0} from a cache)`,
           "answer tokens": u.completion_tokens ?? "–",
           drafts: u.draft_tokens ? `${u.accepted_draft_tokens ?? 0} of ${u.draft_tokens} accepted` : "–" };
}

// How the job ended, in words (the raw payload stays one click away).
function summaryLines(job, outcome) {
  const e = job.error || {}, r = job.result || {};
  if (job.state === "succeeded") {
    const why = { stop: "it reached a stop (end of text or a stop string)", length: "it used its token budget" }[r.finish_reason];
    return [el("p", {}, `succeeded${why ? ": " + why : ""}` + (r.model ? ` · model ${r.model}` : "") +
      (r.model_calls !== undefined ? ` · ${r.model_calls} model calls` : ""))];
  }
  if (!TERMINAL_STATES.includes(job.state)) return [el("p", { class: "muted" }, `${job.state}: not finished`)];
  const partial = outcome.usage.completion_tokens !== undefined ? ` after ${outcome.usage.completion_tokens} tokens` : "";
  return [el("p", { class: "state-" + job.state }, `${job.state}${partial}` + (e.code ? ` (${e.code})` : "") +
    (e.message || e.reason ? `: ${e.message || e.reason}` : ""))];
}

// One event in words, timed from the job's first event; a tool step is drawn as a step.
function eventWords(event) {
  const d = event.data || {};
  switch (event.type) {
    case "token": return JSON.stringify(d.text);
    case "state": return [d.state, d.worker ? `on ${d.worker}` : "", d.restart ? "(a retry)" : "",
      d.reason ? `(${String(d.reason).replace(/_/g, " ")})` : ""].filter(Boolean).join(" ");
    case "waiting": return d.waiting ? "waiting for the worker's engine loop" : "the engine loop took it";
    case "done": return [d.finish_reason && `finish: ${d.finish_reason}`, d.usage && `${d.usage.completion_tokens} tokens`,
      d.timings && `TTFT ${secs(d.timings.ttft_s)}`].filter(Boolean).join(", ") || "finished";
    case "error": case "timeout": return `${d.code ?? event.type}: ${d.message ?? ""}`;
    case "cancelled": return d.reason || "the job was cancelled";
    default: return JSON.stringify(d).slice(0, 300);
  }
}

function addEvent(event) {
  firstTs = firstTs ?? event.ts;
  const item = el("li", { class: "event event-" + event.type, value: event.seq },
    el("span", { class: "at" }, `+${fmt(event.ts - firstTs, 3)} s`), " ", el("b", {}, event.type.replace("_", " ")), " ");
  if (event.type === "tool_step") item.append(el("ol", { class: "steps" }, stepView(event.data)));
  else item.append(eventWords(event));
  $("events").append(item);
  $("event-count").textContent = $("events").children.length;
  if (event.type === "token") $("output").textContent += event.data.text;
  $("events").scrollTop = $("events").scrollHeight;
}

function follow(jobId) {
  const stream = streamJob(jobId, addEvent, (kind, detail, seq) => {
    $("stream-note").textContent = streamNoteText(kind, detail, seq);
  });
  stream.finished.catch((err) => { $("stream-note").textContent = err.message; });
  return stream;
}

async function showJob(jobId) {
  if (follower) follower.close();
  selected = jobId;
  firstTs = null;
  $("detail").hidden = false;
  $("detail-id").textContent = jobId;
  $("detail-playground").href = "/#job=" + jobId;
  $("events").replaceChildren();
  $("trace").replaceChildren();
  $("output").textContent = "";
  $("stream-note").textContent = "";
  $("event-count").textContent = "0";
  follower = follow(jobId);
  await refreshDetail();
  document.querySelectorAll("tr.job").forEach((r) => r.classList.toggle("selected", r.dataset.jobId === jobId));
}

$("cancel").addEventListener("click", async () => {
  if (!selected) return;
  $("cancel").disabled = true;
  try {
    await api(`/jobs/${selected}/cancel`, { method: "POST" });
  } catch (err) {
    $("status").textContent = "cancel failed: " + err.message;
  }
  await refreshDetail();
});
$("close-detail").addEventListener("click", () => {
  if (follower) follower.close();
  selected = null;
  $("detail").hidden = true;
});
$("filter-type").addEventListener("change", refresh);
$("filter-state").addEventListener("change", refresh);

function jobFromHash() {  // /monitor#job=<id> opens that job
  const match = location.hash.match(/^#job=([0-9a-f]+)$/);
  if (match && match[1] !== selected) showJob(match[1]);
}
window.addEventListener("hashchange", jobFromHash);
jobFromHash();
refresh();
setInterval(() => { if ($("live").checked) refresh(); }, REFRESH_MS);
