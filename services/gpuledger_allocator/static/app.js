// The dashboard's frame: which view the address names (#/, #/node/<node>, #/node/<node>/card/<index>),
// loading it, and following the ledger's event stream (/api/events) to load it again when the ledger
// moves. The plots' history (/api/history) is asked at most every HISTORY_EVERY_MS while live.
"use strict";
const HISTORY_EVERY_MS = 3000;
let route = null;
let trend = { key: "", at: 0, data: null };
let loading = 0; // which load is the latest: an older answer is dropped

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "node" && parts[1]) {
    if (parts[2] === "card" && parts[3] !== undefined) return { view: "card", node: parts[1], index: Number(parts[3]) };
    return { view: "node", node: parts[1] };
  }
  return { view: "cluster" };
}

function crumbs(r) {
  const items = [link("#/", "cluster")];
  if (r.node) items.push(" › ", link(`#/node/${encodeURIComponent(r.node)}`, r.node));
  if (r.view === "card") items.push(" › ", element("span", "", `card ${r.index}`));
  $("crumbs").replaceChildren(...items);
}

function mount() {
  route = parseRoute();
  trend = { key: "", at: 0, data: null };
  document.body.dataset.view = route.view;
  crumbs(route);
  const main = $("view");
  if (route.view === "cluster") clusterView.mount(main, load);
  else if (route.view === "node") nodeView.mount(main, route.node);
  else cardView.mount(main, route.node, route.index);
  load();
}

async function history(node) {
  const hours = $("hours").value;
  const key = `${node}\u0000${hours}`;
  if (trend.key !== key || Date.now() - trend.at > HISTORY_EVERY_MS) {
    trend = { key, at: Date.now(), data: await getJson(`api/history?${new URLSearchParams({ node, hours })}`) };
  }
  return trend.data;
}

async function load() {
  const mine = ++loading;
  const r = route;
  try {
    if (r.view === "cluster") {
      const [data, hist] = await Promise.all([getJson(clusterView.query()), history("")]);
      if (mine === loading) clusterView.update(data, hist);
    } else {
      const url = `api/nodes/${encodeURIComponent(r.node)}`;
      const [data, hist] = await Promise.all([getJson(url), r.view === "node" ? history(r.node) : null]);
      if (mine !== loading) return;
      if (r.view === "node") nodeView.update(data, hist);
      else cardView.update(data);
    }
    $("view").classList.remove("failed");
    if (!document.body.dataset.ready) document.body.dataset.ready = String(performance.now());
  } catch (err) {
    if (mine !== loading) return;
    $("view").classList.add("failed");
    $("summary").textContent = `could not load: ${err.message}`;
  }
}

let pending = null;
function soon() { if (!pending) pending = setTimeout(() => { pending = null; load(); }, 300); }

function follow() {
  const events = new EventSource("api/events");
  events.onopen = () => { $("live").className = "on"; soon(); };
  events.onmessage = soon;
  events.onerror = () => { $("live").className = "off"; };
}

window.addEventListener("hashchange", mount);
$("hours").addEventListener("change", () => { trend.key = ""; load(); });
mount();
follow();
