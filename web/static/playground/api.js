// MiniServe playground, parts its views share: the settings form as a request body (with the
// model picker once several models are served), a job's numbers in one line, and the tabs.
// The DOM helpers, the job API and the event stream are in /static/common/ui.js.
"use strict";

// The settings form as POST /jobs fields; a value the page cannot even send is thrown here.
function samplingBody() {
  const body = {
    temperature: Number($("temperature").value), top_p: Number($("top_p").value),
    top_k: Number($("top_k").value), max_new_tokens: Number($("max_new_tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const stops = $("stop").value.split("\n").filter((s) => s.length);
  if (stops.length) body.stop = stops;
  if (!$("model-box").hidden && $("model").value) body.model = $("model").value;
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

// The model picker: shown once the cluster serves several models (GET /v1/models, polled);
// a chosen id then goes with every request as `model`. "cluster default" (and a single
// model) sends none: the cluster's default answers.
const MODELS_POLL_MS = 10000;
async function refreshModels() {
  try {
    const ids = ["", ...(await api("/v1/models")).data.map((m) => m.id)], pick = $("model");
    if ([...pick.options].map((o) => o.value).join() !== ids.join()) {
      const keep = pick.value;
      pick.replaceChildren(...ids.map((id) => el("option", { value: id }, id || "cluster default")));
      pick.value = ids.includes(keep) ? keep : "";
    }
    $("model-box").hidden = ids.length < 3;
  } catch (err) { /* the last list stays; a request then shows the API's own error */ }
}
refreshModels();
setInterval(refreshModels, MODELS_POLL_MS);
keyInput.addEventListener("change", refreshModels);

function statsLine(outcome) {
  const u = outcome.usage, t = outcome.timings;
  const timed = t.ttft_s !== undefined;  // an agent job's result has usage but no timings
  const parts = [...(timed ? [`TTFT ${secs(t.ttft_s)}`, `decode ${fmt(t.decode_tokens_per_s, 1)} tokens/s`] : []),
    `prompt ${u.prompt_tokens ?? "–"} tokens (cached ${u.cached_tokens ?? 0})`,
    `answer ${u.completion_tokens ?? "–"} tokens`,
    `drafted ${u.draft_tokens ?? 0}, accepted ${u.accepted_draft_tokens ?? 0}`];
  if (outcome.method) parts.unshift(outcome.method);
  if (outcome.model && !$("model-box").hidden) parts.unshift(outcome.model);
  return parts.join(" · ");
}

// The header's connection line: a dropped stream and its resumption, in words.
function connectionNote(kind, detail, seq) {
  $("connection").textContent = streamNoteText(kind, detail, seq);
  $("connection").className = "connection " + kind;
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
