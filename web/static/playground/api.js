// MiniServe playground, shared parts: the job API (submit, stream, cancel, read), the settings
// form as a request body, and small DOM helpers. No dependencies, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
const TERMINAL_EVENTS = ["done", "error", "cancelled", "timeout"];
const RECONNECT_MS = 1000;
const keyInput = $("api-key");
keyInput.value = localStorage.getItem("miniserve-key") || "";
keyInput.addEventListener("change", () => localStorage.setItem("miniserve-key", keyInput.value));

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

const fmt = (v, digits = 2) => (v === undefined || v === null ? "–" : Number(v).toFixed(digits));
const secs = (v) => (v === undefined || v === null ? "–" : fmt(v, 3) + " s");
const authHeader = () => (keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {});

class ApiError extends Error {}

// The API's own error in plain words: its message, and the field it names when it names one.
function errorText(body, status) {
  const e = (body && body.error) || body || {};
  const details = (e.details || []).map((d) => `${d.field}: ${d.message}`);
  const message = details.length ? details.join("; ") : e.message || `HTTP ${status}`;
  return e.field && !message.includes(e.field) ? `${e.field}: ${message}` : message;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...authHeader(), ...(options.headers || {}) } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(errorText(body, response.status));
  return body;
}

const postJson = (path, body) =>
  api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

// The settings form as POST /jobs fields; a value the page cannot even send is thrown here.
function samplingBody() {
  const body = {
    temperature: Number($("temperature").value), top_p: Number($("top_p").value),
    top_k: Number($("top_k").value), max_new_tokens: Number($("max_new_tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const stops = $("stop").value.split("\n").filter((s) => s.length);
  if (stops.length) body.stop = stops;
  if ($("speculative").value) body.speculative = $("speculative").value === "true";
  const text = $("guide-text").value;
  if ($("guide").value === "regex") body.guided_regex = text;
  if ($("guide").value === "schema") {
    let schema;
    try { schema = JSON.parse(text); } catch (err) { throw new ApiError("JSON schema: not valid JSON (" + err.message + ")"); }
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  }
  return body;
}

// Read one SSE connection, calling onEvent per event; returns the last seq seen.
async function readEvents(jobId, after, signal, onEvent) {
  const response = await fetch(`/jobs/${jobId}/events`, {
    headers: { ...authHeader(), "Last-Event-ID": String(after) }, signal });
  if (!response.ok) throw new ApiError(errorText(await response.json().catch(() => ({})), response.status));
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "", last = after;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return last;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      const event = JSON.parse(data);
      last = event.seq;
      onEvent(event);
    }
  }
}

// Follow a job's events with fetch (so a key can go in the header). A dropped connection is
// resumed from the last seq seen (Last-Event-ID), so no token is lost; onNote says so.
function streamJob(jobId, onEvent, onNote = () => {}) {
  const controller = new AbortController();
  let last = 0, ended = false;
  const seen = (event) => {
    if (TERMINAL_EVENTS.includes(event.type)) ended = true;
    onEvent(event);
  };
  const finished = (async () => {
    while (!ended && !controller.signal.aborted) {
      try {
        last = await readEvents(jobId, last, controller.signal, (e) => { last = e.seq; seen(e); });
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof ApiError) throw err;
      }
      if (!ended && !controller.signal.aborted) {
        onNote(`connection lost; resuming after event ${last}`);
        await new Promise((r) => setTimeout(r, RECONNECT_MS));
      }
    }
  })();
  return { finished, close: () => controller.abort() };
}

// A finished job's numbers: its result, or (cancelled, timed out) its partial output.
async function jobOutcome(jobId) {
  const job = await api("/jobs/" + jobId);
  const partial = (job.error && typeof job.error.partial === "object" && job.error.partial) || {};
  const payload = job.result || partial;
  return { job, text: payload.text, usage: payload.usage || job.usage || {},
           timings: { ...(payload.timings || {}), ...job.timings }, method: payload.method };
}

function statsLine(outcome) {
  const u = outcome.usage, t = outcome.timings;
  const timed = t.ttft_s !== undefined;  // an agent job's result has usage but no timings
  const parts = [...(timed ? [`TTFT ${secs(t.ttft_s)}`, `decode ${fmt(t.decode_tokens_per_s, 1)} tokens/s`] : []),
    `prompt ${u.prompt_tokens ?? "–"} tokens (cached ${u.cached_tokens ?? 0})`,
    `answer ${u.completion_tokens ?? "–"} tokens`,
    `drafted ${u.draft_tokens ?? 0}, accepted ${u.accepted_draft_tokens ?? 0}`];
  if (outcome.method) parts.unshift(outcome.method);
  return parts.join(" · ");
}

// Tabs: click, or the arrow keys on a focused tab.
const tabs = [...document.querySelectorAll('[role="tab"]')];
function selectTab(tab) {
  for (const t of tabs) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  tab.focus();
}
tabs.forEach((tab, i) => {
  tab.tabIndex = tab.getAttribute("aria-selected") === "true" ? 0 : -1;
  tab.addEventListener("click", () => selectTab(tab));
  tab.addEventListener("keydown", (e) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
    if (step) selectTab(tabs[(i + step + tabs.length) % tabs.length]);
  });
});
$("guide").addEventListener("change", () => {
  $("guide-box").hidden = !$("guide").value;
  $("guide-label").textContent = $("guide").value === "regex" ? "regular expression" : "JSON schema";
});
