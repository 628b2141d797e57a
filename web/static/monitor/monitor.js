// MiniServe monitor: polls /overview, shows one job with its live events. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = Number(document.body.dataset.refreshMs) || 1500;
const TERMINAL = ["succeeded", "failed", "cancelled", "timeout"];
let selected = null;      // job id shown in the detail view
let follower = null;      // {close()} of the live event stream
let keyInput = $("api-key");

keyInput.value = localStorage.getItem("miniserve-key") || "";
keyInput.addEventListener("change", () => localStorage.setItem("miniserve-key", keyInput.value));

function headers() {
  return keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  const body = await response.json();
  if (!response.ok) throw new Error((body.error && body.error.message) || response.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

const fmt = (v, digits = 2) => (v === undefined || v === null ? "–" : Number(v).toFixed(digits));
const secs = (v) => (v === undefined || v === null ? "–" : fmt(v, v < 10 ? 3 : 1) + " s");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–");

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

function renderQueues(queues) {
  $("queues").replaceChildren(...Object.entries(queues).map(([name, n]) =>
    el("div", { class: "queue", "data-queue": name }, name, el("b", {}, n))));
}

function renderJobs(jobs, counts) {
  $("counts").textContent = Object.entries(counts).map(([s, n]) => `${s}: ${n}`).join(" · ");
  const body = $("jobs").tBodies[0];
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
      el("td", { class: "num" }, fmt(t.decode_tokens_per_s, 1)));
    row.addEventListener("click", () => showJob(j.id));
    return row;
  }));
}

async function refresh() {
  const params = new URLSearchParams({ limit: "50" });
  if ($("filter-type").value) params.set("type", $("filter-type").value);
  if ($("filter-state").value) params.set("state", $("filter-state").value);
  try {
    const data = await api("/overview?" + params);
    renderWorkers(data.workers);
    renderQueues(data.queues);
    renderJobs(data.jobs, data.counts);
    if (window.renderCluster) window.renderCluster(data);
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    if (selected) await refreshDetail();
  } catch (err) {
    $("status").textContent = "error: " + err.message;
  }
}

// ---- job detail ------------------------------------------------------------------------
async function refreshDetail() {
  const job = await api("/jobs/" + selected);
  const partial = (job.error && typeof job.error.partial === "object" && job.error.partial) || {};
  job.usage = job.usage || partial.usage;  // a cancelled or timed-out job: its output so far
  job.timings = { ...(partial.timings || {}), ...job.timings };
  $("detail-state").textContent = job.state;
  $("detail-state").className = "state state-" + job.state;
  $("cancel").disabled = TERMINAL.includes(job.state);
  const fields = { type: job.type, queue: job.queue, worker: job.worker || "–", attempt: `${job.attempt}/${job.max_attempts}`,
    created: clock(job.created_at), started: clock(job.started_at), finished: clock(job.finished_at),
    "queue wait": secs(job.timings.queue_wait_s), TTFT: secs(job.timings.ttft_s), total: secs(job.timings.job_total_s),
    "tokens/s": fmt(job.timings.decode_tokens_per_s, 1), usage: JSON.stringify(job.usage || {}),
    method: (job.result && job.result.method) || job.request.method || "–" };
  $("detail-fields").replaceChildren(...Object.entries(fields).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const payload = job.result || job.error;
  $("result").textContent = payload ? JSON.stringify(payload, null, 2) : "(not finished)";
  const trace = (job.result && job.result.trace) || (job.error && job.error.trace) || [];
  $("trace-box").hidden = !trace.length;
  $("trace").replaceChildren(...trace.map((step) => el("li", {}, el("pre", {}, JSON.stringify(step, null, 2)))));
}

function addEvent(event) {
  const text = event.type === "token" ? JSON.stringify(event.data.text) : JSON.stringify(event.data);
  $("events").append(el("li", { class: "event event-" + event.type, value: event.seq },
    el("b", {}, event.type), " ", text.length > 300 ? text.slice(0, 300) + "…" : text));
  $("event-count").textContent = $("events").children.length;
  if (event.type === "token") $("output").textContent += event.data.text;
  $("events").scrollTop = $("events").scrollHeight;
}

function follow(jobId) {
  const url = `/jobs/${jobId}/events`;
  if (!keyInput.value) {  // EventSource cannot send a header: used when no key is needed
    const source = new EventSource(url);
    const onEvent = (message) => {
      const event = JSON.parse(message.data);
      addEvent(event);
      if (TERMINAL.includes({ done: "succeeded", error: "failed" }[event.type] || event.type)) source.close();
    };
    for (const type of ["state", "token", "tool_step", "stats", "done", "error", "cancelled", "timeout"]) {
      source.addEventListener(type, onEvent);
    }
    return source;
  }
  const controller = new AbortController();
  (async () => {  // the same stream read with fetch, so the key goes in the Authorization header
    const response = await fetch(url, { headers: headers(), signal: controller.signal });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (data) addEvent(JSON.parse(data));
      }
    }
  })().catch(() => {});
  return { close: () => controller.abort() };
}

async function showJob(jobId) {
  if (follower) follower.close();
  selected = jobId;
  $("detail").hidden = false;
  $("detail-id").textContent = jobId;
  $("events").replaceChildren();
  $("output").textContent = "";
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
