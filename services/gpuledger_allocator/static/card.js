// The card view: the card's facts, its share layout (memory and compute, with a legend and units;
// a card in MIG mode: its memory slices and placements, mig.js), its holders (namespace, pod,
// container, granted and used memory and compute, isolation, since when), its MIG layout (each
// placement: instance, holder, fault), and its health and remediation history, which the
// allocator asks of the node's inventory (asked again when the card's state changes).
"use strict";
let cardHistory = { key: "", data: null };

const cardView = {
  mount(main, node, index) {
    this.node = node; this.index = index;
    const head = h("section", "panel"); head.id = "card-head";
    const layout = h("section", "panel"); layout.id = "layout";
    const holders = h("section", "panel"); holders.id = "holders";
    const mig = h("section", "panel"); mig.id = "mig";
    const history = h("section", "panel history"); history.id = "history";
    main.replaceChildren(head, layout, holders, mig, history);
  },

  update(data) {
    const node = data.node;
    const card = node.cards.find((c) => c.index === this.index);
    if (!card) { $("card-head").replaceChildren(element("p", "problem", `card ${this.index} is not on ${node.name}`)); return; }
    const facts = [["model", card.model], ["uuid", card.uuid], ["state", stateText(card)], ["memory", mibUnit(card.memory_mib)],
      ["PCI bus", card.pci_bus_id || "-"], ["NUMA node", card.numa ?? "-"], ["processes", `${card.processes} (${card.foreign_processes} foreign, ${gib(card.foreign_mib)})`]];
    const dl = h("dl", "facts", ...facts.flatMap(([k, v]) => { const dd = element("dd", "", String(v)); dd.dataset.fact = k; return [element("dt", "", k), dd]; }));
    $("card-head").replaceChildren(h("h2", `state-${cardState(card)}`, `Card ${card.index} on `, link(`#/node/${encodeURIComponent(node.name)}`, node.name)), dl);
    if (card.mode === "mig") $("layout").replaceChildren(element("h2", "", "Share layout: MIG slices"), migBar(card));
    else $("layout").replaceChildren(element("h2", "", "Share layout"), shareBar("memory", memoryParts(card), card.memory_mib, mibUnit),
      shareBar("compute", computeParts(card), 1000, milliUnit));
    $("holders").replaceChildren(element("h2", "", "Holders"), this.holders(card));
    $("mig").replaceChildren(element("h2", "", "MIG layout"), this.mig(card));
    this.history(node.name, card);
    $("summary").textContent = `${node.name} card ${card.index}: ${card.holders.length} holders`;
  },

  holders(card) {
    const cols = ["namespace", "pod or owner", "container", "memory granted", "memory used", "compute granted", "compute used", "isolation", "state", "since"];
    const rows = card.holders.map((x) => {
      const pod = x.owner.kind === "pod";
      const tr = h("tr", x.over ? "over" : "",
        element("td", "", pod ? x.owner.namespace : "-"), element("td", "", pod ? x.owner.name || x.owner.id : `${x.owner.kind}:${x.owner.id}`),
        element("td", "", x.container || "-"), element("td", "num", x.exclusive ? `whole card (${gib(card.memory_mib)})` : mibUnit(x.mem_mib)),
        element("td", "num", (x.used_mib === null || x.used_mib === undefined ? "n/m" : mibUnit(x.used_mib)) + (x.over ? " OVER GRANT" : "")),
        element("td", "num", x.exclusive ? "100 %" : milliUnit(x.core_milli)),
        element("td", "num", x.used_core_milli === null || x.used_core_milli === undefined ? "n/m" : milliUnit(x.used_core_milli)),
        element("td", "", x.isolation || "-"), element("td", "", x.state), element("td", "", `${when(x.since)} (${since(x.since)})`));
      tr.dataset.allocation = x.allocation_id;
      return tr;
    });
    const table = h("table", "holders", h("thead", "", h("tr", "", ...cols.map((c) => element("th", "", c)))),
      h("tbody", "", ...(rows.length ? rows : [h("tr", "", element("td", "note", "no holders"))])));
    return h("div", "", h("div", "table-wrap", table),
      element("p", "note", "n/m: not measured (use needs the node's inventory to attribute processes to pods; compute used is the pods' share of the card's SM time in NVML's samples, not sampled on MIG cards)."));
  },

  // the card's MIG placements as the ledger holds them (docs/mig.md): profile, where on the card, uuid,
  // who made it, who holds it, a fault
  mig(card) {
    if (card.mode !== "mig") return element("p", "note", "Not in MIG mode: the card is shared whole (see the share layout).");
    const placed = migPlacements(card);
    if (!placed.length) return element("p", "note", "In MIG mode, with no instances.");
    const made = { static: "by the operator", "on demand": "on demand", "to be made": "not yet (held; made when its pod starts)" };
    const cols = ["profile", "placement (start, size)", "uuid", "made", "holder", "fault"];
    const rows = placed.map((p) => {
      const tr = h("tr", p.fault ? "fault" : "", element("td", "", p.profile), element("td", "num", `${p.start}, ${p.size}`),
        element("td", "", p.uuid || "-"), element("td", "", made[p.made]),
        element("td", "", p.holder ? `${ownerText(p.holder.owner)}${p.holder.container ? ` [${p.holder.container}]` : ""}` : "free"),
        element("td", p.fault ? "problem" : "", p.fault ? `${p.fault}${p.remedy ? ` [${p.remedy}]` : ""}` : "-"));
      tr.dataset.placement = `${p.profile}@${p.start}`;
      return tr;
    });
    return h("table", "mig", h("thead", "", h("tr", "", ...cols.map((c) => element("th", "", c)))), h("tbody", "", ...rows));
  },

  history(nodeName, card) {
    const key = [nodeName, card.uuid, card.health, card.remedy, card.health_reason].join("\u0000");
    if (cardHistory.key !== key) { cardHistory = { key, data: null }; askHistory(nodeName, card.uuid, key); }
    drawHistory($("history"), cardHistory.data, nodeName);
  },
};

async function askHistory(nodeName, uuid, key) {
  let data;
  try {
    data = await getJson(`api/nodes/${encodeURIComponent(nodeName)}/cards/${encodeURIComponent(uuid)}/history`);
  } catch (err) {
    data = { problem: `history unavailable: ${err.message}`, history: [] };
  }
  if (cardHistory.key !== key) return; // another card, or the card moved on meanwhile: asked again
  cardHistory.data = data;
  const box = $("history");
  if (box) drawHistory(box, data, nodeName);
}

// the timeline, from text only (textContent: nothing the inventory says is read as HTML)
function drawHistory(box, data, nodeName) {
  box.replaceChildren(element("h2", "", "Health and remediation history"));
  const events = (data && data.history) || [];
  if (!data) box.appendChild(element("p", "note", "asking the node's inventory…"));
  else if (data.problem) box.appendChild(element("p", "note problem", data.problem));
  else if (!events.length) box.appendChild(element("p", "note", "no faults or repairs recorded"));
  if (events.length) {
    const list = element("ol", "timeline");
    for (const e of events) {
      const item = element("li", "step");
      item.dataset.what = e.what;
      item.append(element("time", "", when(e.at)), element("span", "what", e.what), element("span", "reason", e.reason || ""), element("span", "by", e.by || ""));
      list.appendChild(item);
    }
    box.appendChild(list);
  }
  const more = element("p", "note", "in full: ");
  more.appendChild(element("code", "", `gpuledger health --node ${nodeName}`));
  box.appendChild(more);
}
