// Helpers shared by the views: elements from text (never HTML from the ledger), units, states.
"use strict";
const $ = (id) => document.getElementById(id);

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined && text !== null) el.textContent = text;
  return el;
}

// an element with children (strings become text)
function h(tag, className, ...children) {
  const el = element(tag, className);
  for (const child of children) if (child !== null && child !== undefined) el.append(child);
  return el;
}

function link(href, text, className) {
  const a = element("a", className, text);
  a.href = href;
  return a;
}

// memory from MiB, in the unit that reads best: MiB, GiB or (from 10 TiB) TiB
function gib(mib) {
  if (mib === null || mib === undefined) return "n/m";
  if (mib >= 10 * 1024 * 1024) return `${(mib / 1048576).toFixed(1)} TiB`;
  return `${(mib / 1024).toFixed(mib >= 102400 ? 0 : 1)} GiB`;
}
// a number in few characters: 1.6M, 250k, 12.5
function short(v) {
  const a = Math.abs(v);
  return a >= 1e6 ? `${+(v / 1e6).toFixed(1)}M` : a >= 1e4 ? `${+(v / 1e3).toFixed(0)}k` : a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : +v.toFixed(2) + "";
}
function pct(part, whole) { return whole > 0 ? Math.round((100 * part) / whole) : 0; }
function cards(milli) { return `${(milli / 1000).toFixed(milli >= 100000 ? 0 : 1)} cards`; }
function count(n) { return n.toLocaleString("en-US"); }

function when(at) { return at ? new Date(at * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "-"; }
function since(at) {
  if (!at) return "-";
  const s = Math.max(0, Date.now() / 1000 - at);
  const ago = s < 120 ? `${Math.round(s)} s` : s < 7200 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`;
  return `${ago} ago`;
}

// the ledger's remedy (docs/remediation.md) as the dashboard names it
const REPAIRS = { drain: "draining", reset: "resetting", retired: "retired" };
function cardState(card) { return REPAIRS[card.remedy] || card.health; }
function stateText(card) { return card.health_reason ? `${cardState(card)}: ${card.health_reason}` : cardState(card); }

// who a holder is: namespace/pod for a pod, kind:id otherwise
function ownerText(owner) { return owner.kind === "pod" && owner.name ? `${owner.namespace}/${owner.name}` : `${owner.kind}:${owner.id}`; }

async function getJson(url) {
  const reply = await fetch(url);
  const body = await reply.json().catch(() => ({ error: `HTTP ${reply.status}` }));
  if (!reply.ok) throw new Error(body.error || `HTTP ${reply.status}`);
  return body;
}

// colours of a card's holders, by their place on the card
const PALETTE = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#7c3aed"];

// a bar of parts, each [label, value, colour or class], over a whole; with a legend of the parts and their units
function shareBar(title, parts, whole, unit) {
  const bar = h("div", "share-bar");
  bar.setAttribute("role", "img");
  bar.setAttribute("aria-label", `${title}: ` + parts.map((p) => `${p.label} ${unit(p.value)}`).join(", "));
  const legend = h("ul", "share-legend");
  for (const part of parts) {
    if (part.value <= 0 && !part.always) continue;
    const seg = element("div", `seg ${part.cls || ""}`);
    seg.style.width = `${(100 * Math.max(0, part.value)) / (whole || 1)}%`;
    if (part.color) seg.style.background = part.color;
    seg.title = `${part.label}: ${unit(part.value)}`;
    bar.appendChild(seg);
    const sw = element("i", `swatch ${part.cls || ""}`);
    if (part.color) sw.style.background = part.color;
    legend.appendChild(h("li", "", sw, element("span", "who", part.label), element("span", "amount", unit(part.value))));
  }
  return h("figure", "share", element("figcaption", "", title), bar, legend);
}
