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

// One agent step in words: what the model wrote, the tool it chose, what a safeguard changed.
function stepView(step) {
  const args = (a) => (a ? JSON.stringify(a) : "–");
  const item = el("li", { class: "step" + (step.error ? " step-failed" : "") },
    el("div", { class: "step-title" }, `step ${step.step}: `, step.tool_name ? `tool ${step.tool_name}` : "no usable tool call"),
    el("details", {}, el("summary", {}, "model's raw output"), el("pre", {}, step.raw_output || "")));
  if (step.safeguard_applied) {
    item.append(el("div", { class: "safeguard" }, `safeguard ${step.safeguards.join(", ")} changed the call: `,
      step.model_tool_name ? `the model chose ${step.model_tool_name} ${args(step.model_arguments)}, ` : "the model chose no tool, ",
      `it ran ${step.tool_name} ${args(step.arguments)} instead`));
  }
  if (step.tool_name) item.append(el("div", { class: "args" }, "arguments ", el("code", {}, args(step.arguments))));
  if (step.result) item.append(el("div", { class: "result" }, "result ", el("code", {}, step.result)));
  if (step.error) item.append(el("div", { class: "error" }, `error (${step.error_kind ?? "tool"}): ${step.error}`));
  return item;
}

function jobBody(text, agent) {
  if (agent) {
    const s = samplingBody();
    return { type: "agent", prompt: text, max_new_tokens: s.max_new_tokens, max_steps: 3 };
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
  turn.append(el("div", { class: "stats" }, statsLine(outcome) + calls));
  return outcome.job.state === "succeeded" ? turn.querySelector(".text").textContent : null;
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || running) return;
  const agent = $("agent-mode").checked;
  addTurn("user", text);
  const turn = addTurn(agent ? "agent" : "assistant", "");
  if (agent) turn.insertBefore(el("ol", { class: "steps" }), turn.querySelector(".text"));
  $("prompt").value = "";
  setBusy(true);
  try {
    const job = await postJson("/jobs", jobBody(text, agent));
    turn.dataset.jobId = job.id;
    const stream = streamJob(job.id, (e) => onEvent(turn, e), (msg) => note(turn, msg));
    running = { jobId: job.id, stream };
    await stream.finished;
    const answer = await finishTurn(turn, job.id, agent);
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
