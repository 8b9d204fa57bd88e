// The dashboard: every node and card, filled bars for memory and compute, holders on hover and
// click, health colours and a card's repair (draining, resetting, retired, with its fault's reason);
// refreshed from /api/cluster whenever the ledger's event stream moves. A card's details show its
// history (faults, remediation stages, back in service), which the allocator asks of the node's
// inventory (/api/nodes/<node>/cards/<uuid>/history), asked again when the card's state changes.
"use strict";
const $ = (id) => document.getElementById(id);
let cluster = [];
let selected = null;
let history = { key: "", data: null }; // the open card's history: for which card and state, and the answer

function pct(used, total) { return total > 0 ? Math.round((100 * used) / total) : 0; }

function holderText(h) {
  const who = h.owner.kind === "pod" && h.owner.name ? `${h.owner.namespace}/${h.owner.name}` : `${h.owner.kind}:${h.owner.id}`;
  const share = h.exclusive ? "whole card" : `${h.mem_mib} MiB, ${h.core_milli / 10}%`;
  // what its processes use of the card, where the inventory attributes them (docs/audit.md)
  const used = h.used_mib === null || h.used_mib === undefined ? "" : `, uses ${h.used_mib} MiB${h.over ? " OVER GRANT" : ""}`;
  return `${who}${h.container ? "[" + h.container + "]" : ""} (${share}${used}, ${h.state})`;
}

// the ledger's remedy (docs/remediation.md) as the dashboard names it
const REPAIRS = { drain: "draining", reset: "resetting", retired: "retired" };

// "healthy", "unhealthy" (no new work, its holders stay) or the card's repair
function cardState(card) { return REPAIRS[card.remedy] || card.health; }

function stateText(card) {
  const state = cardState(card);
  return card.health_reason ? `${state}: ${card.health_reason}` : state;
}

function escape(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

function cardElement(node, card) {
  const el = document.createElement("div");
  const state = cardState(card);
  const over = card.holders.filter((h) => h.over).length;
  el.className = "card" + (state === "healthy" ? "" : " unhealthy") + (card.remedy ? ` repair ${state}` : "") + (over ? " over" : "");
  el.dataset.node = node.name;
  el.dataset.index = card.index;
  const memUsed = card.memory_mib - card.free_mem_mib;
  const coreUsed = 1000 - card.free_core_milli;
  const holders = card.holders.map(holderText).join("\n") || "free";
  el.title = state === "healthy" ? holders : `${stateText(card)}\n${holders}`;
  const why = state === "healthy" ? "" : `<div class="state" title="${escape(stateText(card))}">${escape(stateText(card))}</div>`;
  el.innerHTML = `
    <div class="label"><b>card ${card.index}</b><span>${escape(card.model)}</span><span class="health">${escape(state)}</span></div>${why}
    <div class="bar mem" title="memory ${memUsed}/${card.memory_mib} MiB"><div style="width:${pct(memUsed, card.memory_mib)}%"></div></div>
    <div class="bar core" title="compute ${coreUsed / 10}%"><div style="width:${pct(coreUsed, 1000)}%"></div></div>
    <div class="label"><span class="mem-text">${memUsed}/${card.memory_mib} MiB</span><span class="holders">${card.holders.length} holder(s)</span>${over ? `<span class="over-grant" title="holders using more memory than granted">${over} over grant</span>` : ""}</div>`;
  el.addEventListener("click", () => { selected = [node.name, card.index]; showDetails(); });
  return el;
}

function render() {
  const nodeFilter = $("filter-node").value.trim();
  const modelFilter = $("filter-model").value.trim();
  const main = $("nodes");
  main.replaceChildren();
  let nodes = 0, cards = 0, used = 0;
  for (const node of cluster) {
    if (nodeFilter && !node.name.includes(nodeFilter)) continue;
    const shown = node.cards.filter((c) => !modelFilter || c.model.includes(modelFilter));
    if (!shown.length) continue;
    const el = document.createElement("section");
    el.className = "node" + (node.stale ? " stale" : "");
    el.dataset.node = node.name;
    el.innerHTML = `<h2>${escape(node.name)}${node.stale ? " (stale)" : ""}</h2>`;
    for (const card of shown) {
      el.appendChild(cardElement(node, card));
      cards += 1;
      if (card.holders.length) used += 1;
    }
    main.appendChild(el);
    nodes += 1;
  }
  $("summary").textContent = `${nodes} node(s), ${cards} card(s), ${used} in use`;
  showDetails();
}

function showDetails() {
  const box = $("details");
  const node = selected && cluster.find((n) => n.name === selected[0]);
  const card = node && node.cards.find((c) => c.index === selected[1]);
  if (!card) { box.hidden = true; return; }
  const rows = card.holders.map((h) => `<tr><td>${escape(holderText(h))}</td><td>${escape(h.allocation_id)}</td></tr>`).join("");
  box.innerHTML = `<button id="close" title="close">×</button><b>${escape(node.name)} card ${card.index}</b> ${escape(card.uuid)}<br>` +
    `${escape(card.model)}, ${escape(stateText(card))}, ${card.free_mem_mib} MiB and ${card.free_core_milli / 10}% compute free` +
    `<table>${rows || "<tr><td>no holders</td></tr>"}</table><div id="history" class="history"></div>`;
  box.hidden = false;
  $("close").addEventListener("click", () => { selected = null; box.hidden = true; });
  showHistory(node, card);
}

// --- a card's history: asked when its details open, and again when its state changes -----------

function showHistory(node, card) {
  const key = [node.name, card.uuid, card.health, card.remedy, card.health_reason].join("\u0000");
  if (history.key !== key) { history = { key, data: null }; askHistory(node.name, card.uuid, key); }
  drawHistory($("history"), history.data, node.name);
}

async function askHistory(nodeName, uuid, key) {
  let data;
  try {
    const reply = await fetch(`api/nodes/${encodeURIComponent(nodeName)}/cards/${encodeURIComponent(uuid)}/history`);
    data = await reply.json().catch(() => ({ error: `HTTP ${reply.status}` }));
    if (!reply.ok) data = { problem: `history unavailable: ${data.error || reply.status}`, history: [] };
  } catch (err) {
    data = { problem: "history unavailable: the allocator did not answer", history: [] };
  }
  if (history.key !== key) return; // another card, or the card moved on meanwhile: asked again
  history.data = data;
  const box = $("history");
  if (box) drawHistory(box, data, nodeName);
}

function when(at) { return at ? new Date(at * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "-"; }

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

// the timeline, from text only (textContent: nothing the inventory says is read as HTML)
function drawHistory(box, data, nodeName) {
  box.replaceChildren(element("b", "", "history"));
  const events = (data && data.history) || [];
  if (!data) box.appendChild(element("p", "note", "asking the node's inventory…"));
  else if (data.problem) box.appendChild(element("p", "note problem", data.problem));
  else if (!events.length) box.appendChild(element("p", "note", "no faults or repairs recorded"));
  if (events.length) {
    const list = element("ol", "timeline");
    for (const e of events) {
      const item = element("li", "step");
      item.dataset.what = e.what;
      item.append(element("time", "", when(e.at)), element("span", "what", e.what), element("span", "reason", e.reason || ""),
        element("span", "by", e.by || ""));
      list.appendChild(item);
    }
    box.appendChild(list);
  }
  const more = element("p", "note", "in full: ");
  more.appendChild(element("code", "", `gpuledger health --node ${nodeName}`));
  box.appendChild(more);
}

async function refresh() {
  const reply = await fetch("api/cluster");
  if (!reply.ok) return;
  cluster = (await reply.json()).nodes;
  render();
}

let pending = null;
function soon() { if (!pending) pending = setTimeout(() => { pending = null; refresh(); }, 100); }

function follow() {
  const events = new EventSource("api/events");
  events.onopen = () => { $("live").className = "on"; soon(); };
  events.onmessage = soon;
  events.onerror = () => { $("live").className = "off"; };
}

$("filter-node").addEventListener("input", render);
$("filter-model").addEventListener("input", render);
refresh();
follow();
