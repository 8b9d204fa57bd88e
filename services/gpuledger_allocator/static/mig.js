// A card in MIG mode (docs/mig.md) drawn as its memory slices: each instance that exists, and each
// placement a holder holds that the node has not made yet, over the slices it covers, coloured by
// its holder (as in the card's holders table) or blank when free, a fault outlined in red.
"use strict";

const migKey = (m) => `${m.profile}@${m.start}/${m.size}`;

// the card's placements by start: {profile, start, size, made, uuid, fault, remedy, holder, color}
function migPlacements(card) {
  const held = new Map();
  card.holders.forEach((x, i) => { if (x.mig) held.set(migKey(x.mig), { holder: x, color: PALETTE[i % PALETTE.length] }); });
  const made = (card.instances || []).map((m) => ({ ...m, made: m.static ? "static" : "on demand", ...(held.get(migKey(m)) || { holder: null }) }));
  const existing = new Set(made.map(migKey));
  const unmade = [...held.entries()].filter(([key]) => !existing.has(key))
    .map(([, x]) => ({ ...x.holder.mig, made: "to be made", fault: "", ...x }));
  return [...made, ...unmade].sort((a, b) => a.start - b.start || a.size - b.size);
}

// "1g.10gb@6 on demand: team-a/train [main], fault XID 94 [drain]"
function migText(p) {
  const who = p.holder ? `${ownerText(p.holder.owner)}${p.holder.container ? ` [${p.holder.container}]` : ""}` : "free";
  return `${p.profile}@${p.start} ${p.made}: ${who}${p.fault ? `, fault ${p.fault}${p.remedy ? ` [${p.remedy}]` : ""}` : ""}`;
}

// the slices bar, with a legend of the placements (hidden on a node's tiles, as the share bars' are)
function migBar(card) {
  const placed = migPlacements(card);
  const slices = card.mig_slices || Math.max(8, ...placed.map((p) => p.start + p.size));
  const bar = h("div", "mig-bar");
  bar.style.gridTemplateColumns = `repeat(${slices}, 1fr)`;
  bar.setAttribute("role", "img");
  bar.setAttribute("aria-label", `MIG, ${slices} memory slices: ${placed.map(migText).join("; ") || "no instances"}`);
  for (let i = 0; i < slices; i++) {
    const slice = element("div", "slice");
    slice.style.gridArea = `1 / ${i + 1}`;
    bar.append(slice);
  }
  const legend = h("ul", "share-legend");
  for (const p of placed) {
    const cls = `${p.holder ? "held" : "free"}${p.made === "to be made" ? " unmade" : ""}${p.fault ? " fault" : ""}`;
    const seg = element("div", `mig-inst ${cls}`, p.profile);
    seg.style.gridArea = `1 / ${p.start + 1} / 2 / span ${p.size}`;
    if (p.color) seg.style.backgroundColor = p.color;
    seg.title = migText(p);
    seg.dataset.placement = `${p.profile}@${p.start}`;
    bar.append(seg);
    const sw = element("i", `swatch ${cls}`);
    if (p.color) sw.style.backgroundColor = p.color;
    legend.append(h("li", "", sw, element("span", "who", migText(p))));
  }
  return h("figure", "share mig", element("figcaption", "", `MIG: ${slices} memory slices, ${placed.length} instance${placed.length === 1 ? "" : "s"}`), bar, legend);
}
