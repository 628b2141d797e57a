// MiniServe playground, chat view: a multi-turn conversation streamed token by token from
// POST /jobs, or (agent mode) an agent job whose tool steps are drawn as they arrive.
"use strict";

const chatTurns = [];   // {role, content} turns sent with the next message
let running = null;   // {jobId, stream} of the answer being written

function addTurn(role, text) {
  const turn = el("li", { class: "turn " + role }, el("div", { class: "who" }, role),
    el("div", { class: "text" }, text));
  $("conversation").append(turn);
  turn.scrollIntoView({ block: "end" });
  return turn;
}

function note(turn, text, kind = "note") {
  turn.append(el("div", { class: kind, role: kind === "error" ? "alert" : "status" }, text));
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop-button").disabled = !busy;
}

function jobBody(text, agent) {
  if (agent) {
    const s = samplingBody();
    return { type: "agent", prompt: text, max_new_tokens: s.max_new_tokens, max_steps: 3,
             ...(s.model ? { model: s.model } : {}) };
  }
  return { ...samplingBody(), generation_method: $("method").value,
           messages: [...chatTurns, { role: "user", content: text }] };
}

function onEvent(turn, event) {
  const out = turn.querySelector(".text");
  if (event.type === "token") out.textContent += event.data.text;
  else if (event.type === "tool_step") {
    turn.querySelector(".steps").append(stepView(event.data));
    out.textContent = "";  // the model's next output starts afresh
  } else if (event.type === "waiting" && event.data.waiting) note(turn, "waiting for the worker's engine loop…");
  else if (event.type === "error" || event.type === "timeout") {
    note(turn, `${event.type === "timeout" ? "timed out" : "failed"}: ${event.data.message || event.data.code || ""}`, "error");
  } else if (event.type === "cancelled") note(turn, "stopped: the job was cancelled");
}

async function finishTurn(turn, jobId, agent) {
  const outcome = await jobOutcome(jobId);
  turn.dataset.state = outcome.job.state;
  if (agent && outcome.text !== undefined) turn.querySelector(".text").textContent = outcome.text;
  const payload = outcome.job.result || outcome.job.error || {};
  const calls = agent && payload.model_calls !== undefined ? ` · ${payload.model_calls} model calls` : "";
  turn.append(el("div", { class: "stats" }, statsLine(outcome) + calls + " · ",
    el("a", { href: "/monitor#job=" + jobId }, "in the monitor")));
  return outcome.job.state === "succeeded" ? turn.querySelector(".text").textContent : null;
}

function answerTurn(agent) {
  const turn = addTurn(agent ? "agent" : "assistant", "");
  if (agent) turn.insertBefore(el("ol", { class: "steps" }), turn.querySelector(".text"));
  return turn;
}

// Stream a job into its turn (from event 0: a finished job is replayed), then its numbers.
async function follow(turn, jobId, agent) {
  turn.dataset.jobId = jobId;
  const stream = streamJob(jobId, (e) => onEvent(turn, e), (kind, detail, seq) => {
    note(turn, streamNoteText(kind, detail, seq));
    connectionNote(kind, detail, seq);
  });
  running = { jobId, stream };
  await stream.finished;
  return finishTurn(turn, jobId, agent);
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || running) return;
  const agent = $("agent-mode").checked;
  addTurn("user", text);
  const turn = answerTurn(agent);
  $("prompt").value = "";
  setBusy(true);
  try {
    const job = await postJson("/jobs", jobBody(text, agent));
    const answer = await follow(turn, job.id, agent);
    if (answer !== null) chatTurns.push({ role: "user", content: text }, { role: "assistant", content: answer });
  } catch (err) {
    turn.dataset.state = "rejected";
    note(turn, err.message, "error");
  } finally {
    running = null;
    setBusy(false);
    $("prompt").focus();
  }
}

// /#job=<id> (each job in the monitor links here): that job's prompt and answer, replayed from
// its event stream and followed live while it runs. It starts a new chat.
async function openJob(jobId) {
  if (running) return;
  selectTab($("tab-chat"));
  chatTurns.length = 0;
  $("conversation").replaceChildren();
  setBusy(true);
  let turn = null;
  try {
    const job = await api("/jobs/" + jobId);
    addTurn("user", jobPrompt(job));
    turn = answerTurn(job.type === "agent");
    await follow(turn, jobId, job.type === "agent");
  } catch (err) {
    turn = turn || addTurn("assistant", "");
    turn.dataset.state = "rejected";
    note(turn, err.message, "error");
  } finally {
    running = null;
    setBusy(false);
  }
}

function jobFromHash() {
  const match = location.hash.match(/^#job=([0-9a-f]+)$/);
  if (match) openJob(match[1]);
}

$("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
});
$("stop-button").addEventListener("click", async () => {
  if (!running) return;
  $("stop-button").disabled = true;
  try { await api(`/jobs/${running.jobId}/cancel`, { method: "POST" }); } catch (err) { /* shown by the stream */ }
});
$("clear").addEventListener("click", () => {
  if (running) return;
  chatTurns.length = 0;
  $("conversation").replaceChildren();
});
window.addEventListener("hashchange", jobFromHash);
jobFromHash();
