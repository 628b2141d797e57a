// MiniServe playground, inside the worker: the paged KV pool of one worker, one cell per
// block, drawn from the heartbeat snapshot the worker's engine loop publishes (GET /workers).
// The page never asks the engine itself: the loop is the pool's only owner.
"use strict";

const POOL_POLL_MS = 1000;  // the data changes with each heartbeat (every few seconds)
const CELL_CLASS = { ".": "free", u: "used", s: "shared", c: "cached" };

function renderPool(map) {
  const grid = $("pool-grid");
  if (grid.children.length !== map.length) {
    grid.replaceChildren(...[...map].map((_, i) => el("span", { class: "cell", title: `block ${i}` })));
  }
  const counts = { free: 0, used: 0, shared: 0, cached: 0 };
  [...map].forEach((ch, i) => {
    const state = CELL_CLASS[ch] || "free";
    counts[state] += 1;
    const cell = grid.children[i];
    if (cell.dataset.state !== state) { cell.dataset.state = state; cell.className = "cell " + state; }
  });
  $("pool-summary").textContent = `${map.length} blocks: in use ${counts.used} · shared ${counts.shared}` +
    ` · cached ${counts.cached} · free ${counts.free}`;
}

function renderBatch(stats) {
  const paged = stats.paged || {}, blocks = paged.blocks || {}, prefix = stats.prefix_cache || {};
  const rows = {
    "sequences running / waiting": `${paged.running ?? "–"} / ${paged.waiting ?? "–"}`,
    "last step's batch (largest)": `${paged.batch_size ?? "–"} (${paged.max_batch_size ?? "–"})`,
    "block size": `${blocks.block_size ?? "–"} tokens`,
    "prefix hits (paged)": `${blocks.prefix_hit_tokens ?? 0} of ${blocks.prefix_query_tokens ?? 0} prompt tokens`,
    "prefix_cache entries": prefix.entries ?? "–",
    "evictions": blocks.evictions ?? 0,
  };
  $("worker-batch").replaceChildren(...Object.entries(rows).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

async function refreshPool() {
  if ($("view-worker").hidden) return;
  try {
    const { workers } = await api("/workers");
    const pick = $("worker-pick"), names = workers.map((w) => w.name);
    if ([...pick.options].map((o) => o.value).join() !== names.join()) {
      const keep = pick.value;
      pick.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
      if (names.includes(keep)) pick.value = keep;
    }
    const worker = workers.find((w) => w.name === pick.value);
    if (!worker) { $("pool-summary").textContent = "no worker is running"; return; }
    const stats = worker.info.cache_stats || {};
    $("worker-seen").textContent = `heartbeat ${fmt(worker.age_s, 1)} s ago`;
    const map = (stats.paged || {}).block_map;
    if (map) renderPool(map); else $("pool-summary").textContent = "this worker has not loaded its model yet";
    renderBatch(stats);
  } catch (err) {
    $("pool-summary").textContent = err.message;
  }
}

setInterval(refreshPool, POOL_POLL_MS);
$("tab-worker").addEventListener("click", refreshPool);
