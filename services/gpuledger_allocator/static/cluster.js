// The cluster view: totals, cards per model, plots of the last hours, and the node list (a page
// at a time, filtered by the allocator: name, model, namespace, state), from /api/summary.
"use strict";
const NODE_STATES = ["healthy", "unhealthy", "draining", "resetting", "retired", "over-grant", "stale"];

const clusterView = {
  filters: { q: "", model: "", namespace: "", state: "", page: 0, size: 50 },

  query() {
    const f = this.filters;
    const params = new URLSearchParams({ q: f.q, model: f.model, namespace: f.namespace, state: f.state, page: f.page, size: f.size });
    return `api/summary?${params}`;
  },

  mount(main, changed) {
    const search = element("input");
    Object.assign(search, { id: "q", type: "search", placeholder: "node name contains…", value: this.filters.q });
    const model = h("select", "", new Option("any model", ""));
    model.id = "f-model";
    const namespace = h("select", "", new Option("any namespace", ""));
    namespace.id = "f-namespace";
    const state = h("select", "", new Option("any state", ""), ...NODE_STATES.map((s) => new Option(s, s)));
    state.id = "f-state";
    state.value = this.filters.state;
    let typing = null;
    const set = (key, value) => { this.filters[key] = value; this.filters.page = 0; changed(); };
    search.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => set("q", search.value.trim()), 150); });
    model.addEventListener("change", () => set("model", model.value));
    namespace.addEventListener("change", () => set("namespace", namespace.value));
    state.addEventListener("change", () => set("state", state.value));
    const prev = element("button", "", "‹ previous"), next = element("button", "", "next ›");
    prev.id = "prev"; next.id = "next";
    prev.addEventListener("click", () => { this.filters.page = Math.max(0, this.filters.page - 1); changed(); });
    next.addEventListener("click", () => { this.filters.page += 1; changed(); });
    const tiles = h("section", "tiles"); tiles.id = "tiles";
    const models = h("section", "panel"); models.id = "models";
    const plots = h("section", "panel"); plots.id = "plots";
    const filters = h("div", "filters", h("label", "", "search ", search), h("label", "", "model ", model),
      h("label", "", "namespace ", namespace), h("label", "", "state ", state));
    const list = h("section", "panel", element("h2", "", "Nodes"), filters, h("div", "table-wrap", this.table()),
      h("div", "pager", prev, element("span", "", ""), next));
    list.id = "node-list";
    main.replaceChildren(tiles, plots, models, list);
    this.el = { search, model, namespace, state, prev, next, tiles, models, plots, pager: list.querySelector(".pager span") };
  },

  table() {
    const head = h("tr", "", ...["node", "models", "cards", "state", "memory granted / total", "compute granted",
      "holders", "fragmentation", "namespaces"].map((t) => element("th", "", t)));
    const body = element("tbody"); body.id = "node-rows";
    return h("table", "nodes", h("thead", "", head), body);
  },

  update(data, history) {
    const t = data.totals;
    this.tiles(t);
    this.options(this.el.model, data.models.map((m) => m.model), this.filters.model);
    this.options(this.el.namespace, data.namespaces, this.filters.namespace);
    this.el.models.replaceChildren(element("h2", "", "Cards per model"), this.modelTable(data.models));
    if (history) this.el.plots.replaceChildren(element("h2", "", `The cluster over the last ${history.hours} h`), historyPlots(history));
    const rows = data.nodes.map((n) => this.row(n));
    $("node-rows").replaceChildren(...(rows.length ? rows : [h("tr", "", h("td", "note", "no node matches"))]));
    const first = data.page * data.size;
    this.el.pager.textContent = data.matched ? `nodes ${count(first + 1)}–${count(first + data.nodes.length)} of ${count(data.matched)}` : "no nodes";
    this.el.pager.id = "page-text";
    this.el.prev.disabled = data.page === 0;
    this.el.next.disabled = first + data.nodes.length >= data.matched;
    $("summary").textContent = `${count(t.nodes)} nodes, ${count(t.cards)} cards, ${count(t.holders)} holders`;
  },

  options(select, values, chosen) {
    const have = [...select.options].slice(1).map((o) => o.value);
    if (have.join("\n") !== values.join("\n")) select.replaceChildren(select.options[0], ...values.map((v) => new Option(v, v)));
    select.value = chosen;
  },

  tiles(t) {
    const bad = (t.states.unhealthy || 0) + (t.states.draining || 0) + (t.states.resetting || 0) + (t.states.retired || 0);
    const tile = (label, value, detail, id) => {
      const el = h("div", "tile", element("span", "label", label), element("b", "value", value), element("span", "detail", detail));
      el.dataset.tile = id;
      return el;
    };
    this.el.tiles.replaceChildren(
      tile("Nodes", count(t.nodes), t.stale ? "some stale" : "all reporting", "nodes"),
      tile("Cards", count(t.cards), `${count(t.states.healthy || 0)} healthy, ${count(bad)} not`, "cards"),
      tile("Memory granted", gib(t.granted_mib), `of ${gib(t.memory_mib)} (${pct(t.granted_mib, t.memory_mib)} %); used ${gib(t.used_mib)}`, "memory"),
      tile("Compute granted", `${pct(t.granted_core_milli, t.core_milli)} %`, `${cards(t.granted_core_milli)} of ${cards(t.core_milli)}`, "compute"),
      tile("Holders", count(t.holders), `${count(t.over)} over their memory grant`, "holders"),
      tile("Fragmentation", cards(t.frag_milli), `${Math.round((100 * t.frag_milli) / (t.free_milli || 1))} % of the free GPU (${cards(t.free_milli)})`, "fragmentation"));
  },

  modelTable(models) {
    const head = h("tr", "", ...["model", "nodes", "cards", "idle", "not healthy", "memory granted / total"].map((x) => element("th", "", x)));
    const rows = models.map((m) => h("tr", "", element("td", "model", m.model), element("td", "num", count(m.nodes)),
      element("td", "num", count(m.cards)), element("td", "num", count(m.idle)), element("td", "num", count(m.not_healthy)),
      element("td", "num", `${gib(m.granted_mib)} / ${gib(m.memory_mib)}`)));
    return h("table", "models", h("thead", "", head), h("tbody", "", ...rows));
  },

  row(n) {
    const bad = Object.entries(n.states).filter(([s]) => s !== "healthy").map(([s, k]) => `${k} ${s}`);
    const state = n.unreadable ? "unreadable" : bad.length ? bad.join(", ") : "healthy";
    const tr = h("tr", n.stale ? "stale" : "",
      h("td", "name", link(`#/node/${encodeURIComponent(n.name)}`, n.name)),
      element("td", "model", n.models.join(", ")), element("td", "num", n.cards),
      element("td", `state ${bad.length || n.unreadable ? "bad" : ""}`, state + (n.over ? `, ${n.over} over grant` : "") + (n.stale ? ", stale" : "")),
      element("td", "num", `${gib(n.granted_mib)} / ${gib(n.memory_mib)}`),
      element("td", "num", `${pct(n.granted_core_milli, n.core_milli)} %`),
      element("td", "num", n.holders),
      element("td", "num", `${cards(n.frag_milli)} (${pct(n.frag_milli, n.free_milli)} %)`),
      element("td", "ns", n.namespaces.join(", ")));
    tr.dataset.node = n.name;
    return tr;
  },
};
