// MiniServe pages, the parts both share (the playground at / and the monitor at /monitor load
// this first): DOM helpers, the API key field, the job API with its errors in plain words, a
// job's event stream that survives a dropped connection, and an agent step drawn in words.
// No dependencies, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
const TERMINAL_EVENTS = ["done", "error", "cancelled", "timeout", "expired"];
const TERMINAL_STATES = ["succeeded", "failed", "cancelled", "timeout", "expired"];
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
const secs = (v) => (v === undefined || v === null ? "–" : fmt(v, v < 10 ? 3 : 1) + " s");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–");
const authHeader = () => (keyInput.value ? { Authorization: "Bearer " + keyInput.value } : {});

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

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
  if (!response.ok) throw new ApiError(errorText(body, response.status), response.status);
  return body;
}

const postJson = (path, body) =>
  api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

// Read one SSE connection, calling onEvent per event; returns when the server closes it.
async function readEvents(jobId, after, signal, onEvent) {
  const response = await fetch(`/jobs/${jobId}/events`, {
    headers: { ...authHeader(), "Last-Event-ID": String(after) }, signal });
  if (!response.ok) {
    throw new ApiError(errorText(await response.json().catch(() => ({})), response.status), response.status);
  }
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}

// Why a connection ended, in words: the server's own 5xx message, or that nothing answered.
const lostBecause = (err) => (err instanceof ApiError ? err.message
  : err ? "the web server did not answer" : "the server closed the stream");

// Follow a job's events with fetch (so a key can go in the header). A dropped connection (a
// web restart, a Redis blip answered with a 503) is reopened every RECONNECT_MS with
// Last-Event-ID = the last seq seen, so no event is lost or shown twice; onNote says what
// happened: ("lost", why, last seq) once per outage, then ("resumed", seconds down, last seq).
// A 4xx (no such job, a wrong key) is the answer and is thrown.
function streamJob(jobId, onEvent, onNote = () => {}) {
  const controller = new AbortController();
  let last = 0, ended = false, lostAt = null;
  const seen = (event) => {
    if (lostAt !== null) { onNote("resumed", (performance.now() - lostAt) / 1000, last); lostAt = null; }
    if (event.seq !== undefined) last = event.seq;  // a `queued` place-in-line frame has none
    if (TERMINAL_EVENTS.includes(event.type)) ended = true;
    onEvent(event);
  };
  const finished = (async () => {
    while (!ended && !controller.signal.aborted) {
      let failure = null;
      try {
        await readEvents(jobId, last, controller.signal, seen);
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof ApiError && err.status < 500) throw err;
        failure = err;
      }
      if (ended || controller.signal.aborted) return;
      if (lostAt === null) { lostAt = performance.now(); onNote("lost", lostBecause(failure), last); }
      await new Promise((r) => setTimeout(r, RECONNECT_MS));
    }
  })();
  return { finished, close: () => controller.abort() };
}

// A stream note in words, for a status line.
function streamNoteText(kind, detail, seq) {
  return kind === "lost" ? `connection lost (${detail}); reconnecting, will resume after event ${seq}…`
    : `reconnected after ${fmt(detail, 1)} s; resumed after event ${seq}, nothing lost`;
}

// One agent step in words: what the model wrote, the tool it chose, what a safeguard changed,
// the arguments and the result. Drawn from a tool_step event or a trace entry (same shape).
function stepView(step) {
  const args = (a) => (a ? JSON.stringify(a) : "–");
  const item = el("li", { class: "step" + (step.error ? " step-failed" : "") },
    el("div", { class: "step-title" }, `step ${step.step}: `, step.tool_name ? `tool ${step.tool_name}` : "no usable tool call"),
    el("details", {}, el("summary", {}, "model's raw output"), el("pre", {}, step.raw_output || "")));
  if (step.safeguard_applied) {
    item.append(el("div", { class: "safeguard" }, `safeguard ${(step.safeguards || []).join(", ")} changed the call: `,
      step.model_tool_name ? `the model chose ${step.model_tool_name} ${args(step.model_arguments)}, ` : "the model chose no tool, ",
      `it ran ${step.tool_name} ${args(step.arguments)} instead`));
  }
  if (step.tool_name) item.append(el("div", { class: "args" }, "arguments ", el("code", {}, args(step.arguments))));
  if (step.result) item.append(el("div", { class: "result" }, "result ", el("code", {}, step.result)));
  if (step.error) item.append(el("div", { class: "error" }, `error (${step.error_kind ?? "tool"}): ${step.error}`));
  return item;
}

// The user's text a job answers: its last user message (chat, agent) or its prompt.
function jobPrompt(job) {
  const messages = (job.request && job.request.messages) || [];
  const user = [...messages].reverse().find((m) => m.role === "user");
  return user ? String(user.content) : String((job.request && job.request.prompt) || "");
}

// A job with its numbers: its result, or (cancelled, timed out) its partial output.
async function jobOutcome(jobId) {
  const job = await api("/jobs/" + jobId);
  const partial = (job.error && typeof job.error.partial === "object" && job.error.partial) || {};
  const payload = job.result || partial;
  return { job, text: payload.text, usage: payload.usage || job.usage || {},
           timings: { ...(payload.timings || {}), ...job.timings }, method: payload.method, model: payload.model };
}
