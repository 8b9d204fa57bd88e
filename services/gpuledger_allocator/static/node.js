// The node view: its totals and fragmentation, plots of its last hours, and each card with its
// share layout (who holds what of its memory and compute; a card in MIG mode: its slices, mig.js)
// and its state, from /api/nodes/<node>.
"use strict";

// a card's memory as parts: each holder's grant (a whole card: all of it), foreign use, free
function memoryParts(card) {
  const parts = card.holders.map((hd, i) => ({
    label: `${ownerText(hd.owner)}${hd.container ? ` [${hd.container}]` : ""}${hd.over ? " OVER GRANT" : ""}`,
    value: hd.exclusive ? card.memory_mib : hd.mem_mib, color: PALETTE[i % PALETTE.length], cls: hd.over ? "over" : "",
  }));
  if (card.foreign_mib) parts.push({ label: "foreign", value: card.foreign_mib, cls: "foreign" });
  parts.push({ label: "free", value: card.free_mem_mib, cls: "free", always: true });
  return parts;
}

function computeParts(card) {
  const parts = card.holders.map((hd, i) => ({
    label: `${ownerText(hd.owner)}${hd.container ? ` [${hd.container}]` : ""}`,
    value: hd.exclusive ? 1000 : hd.core_milli, color: PALETTE[i % PALETTE.length],
  }));
  parts.push({ label: "free", value: card.free_core_milli, cls: "free", always: true });
  return parts;
}

const mibUnit = (v) => `${gib(v)} (${count(v)} MiB)`;
const milliUnit = (v) => `${(v / 10).toFixed(v % 10 ? 1 : 0)} %`;

function cardTile(node, card) {
  const state = cardState(card);
  const over = card.holders.filter((x) => x.over).length;
  const tile = h("a", `card state-${state}${over ? " over" : ""}`);
  tile.href = `#/node/${encodeURIComponent(node.name)}/card/${card.index}`;
  tile.dataset.node = node.name;
  tile.dataset.index = card.index;
  const model = element("span", "model", card.model);
  model.title = card.model;
  const badge = element("span", "badge", state);
  badge.title = stateText(card);
  tile.append(h("div", "card-head", element("b", "index", `card ${card.index}`), badge), model);
  if (card.health_reason) tile.append(element("div", "reason", card.health_reason));
  if (card.mode === "mig") tile.append(migBar(card));
  else tile.append(shareBar("memory", memoryParts(card), card.memory_mib, mibUnit), shareBar("compute", computeParts(card), 1000, milliUnit));
  const names = card.holders.map((x) => ownerText(x.owner));
  tile.append(element("div", "holders", names.length ? `${names.length} holder${names.length > 1 ? "s" : ""}: ${names.join(", ")}` : "no holders"));
  if (over) tile.append(element("div", "over-grant", `${over} over their memory grant`));
  return tile;
}

const nodeView = {
  mount(main, name) {
    this.name = name;
    const head = h("section", "panel node-head"); head.id = "node-head";
    const plots = h("section", "panel"); plots.id = "plots";
    const grid = h("section", "cards"); grid.id = "cards";
    main.replaceChildren(head, plots, grid);
  },

  update(data, history) {
    const { node, row } = data;
    const facts = [
      ["cards", `${row.cards} (${row.models.join(", ")})`],
      ["memory granted", `${gib(row.granted_mib)} of ${gib(row.memory_mib)}; used ${gib(row.used_mib)}`],
      ["compute granted", `${pct(row.granted_core_milli, row.core_milli)} % (${cards(row.granted_core_milli)} of ${cards(row.core_milli)})`],
      ["holders", `${row.holders}${row.over ? `, ${row.over} over their memory grant` : ""}`],
      ["fragmentation", `${cards(row.frag_milli)}: ${pct(row.frag_milli, row.free_milli)} % of its free ${cards(row.free_milli)}`],
      ["namespaces", row.namespaces.join(", ") || "none"],
    ];
    const dl = h("dl", "facts", ...facts.flatMap(([k, v]) => { const dd = element("dd", "", v); dd.dataset.fact = k; return [element("dt", "", k), dd]; }));
    const title = element("h2", "", `Node ${node.name}${node.stale ? " (stale: no heartbeat)" : ""}`);
    $("node-head").replaceChildren(title, node.unreadable ? element("p", "problem", node.unreadable) : dl);
    if (history) $("plots").replaceChildren(element("h2", "", `${node.name} over the last ${history.hours} h (a sample every ${history.step_s} s)`), historyPlots(history));
    $("cards").replaceChildren(...node.cards.map((c) => cardTile(node, c)));
    $("summary").textContent = `${node.name}: ${node.cards.length} cards, ${row.holders} holders`;
  },
};
