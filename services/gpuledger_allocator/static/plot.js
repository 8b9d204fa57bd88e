// Line plots in plain SVG: a y axis from 0 with its unit, time along x (UTC), a legend of the series.
// A value not reported (null) leaves a gap; each line says how many points it has (data-points).
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const PLOT = { w: 460, h: 190, left: 44, right: 10, top: 10, bottom: 26 };

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(value)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function clock(at) { return new Date(at * 1000).toISOString().slice(11, 16); }

// one plot: {title, unit (the y axis's), at: [seconds], series: [{name, values, color, dash}], format(v)}
function linePlot(spec) {
  const { w, h: height, left, right, top, bottom } = PLOT;
  const at = spec.at || [];
  const values = spec.series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const ymax = niceMax(Math.max(0, ...values));
  const t0 = at.length ? at[0] : 0, t1 = at.length ? at[at.length - 1] : 1;
  const x = (t) => left + (t1 > t0 ? ((t - t0) / (t1 - t0)) * (w - left - right) : (w - left - right) / 2);
  const y = (v) => top + (1 - v / ymax) * (height - top - bottom);
  const root = svg("svg", { viewBox: `0 0 ${w} ${height}`, class: "plot", role: "img", "aria-label": `${spec.title} (${spec.unit})` });
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    root.append(svg("line", { x1: left, x2: w - right, y1: y(v), y2: y(v), class: "grid" }));
    root.append(svg("text", { x: left - 4, y: y(v) + 4, class: "tick y" }, spec.format ? spec.format(v) : String(v)));
  }
  if (at.length) {
    const marks = at.length > 1 ? [t0, (t0 + t1) / 2, t1] : [t0];
    marks.forEach((t, i) => {
      const anchor = marks.length === 1 ? "middle" : i === 0 ? "start" : i === marks.length - 1 ? "end" : "middle";
      root.append(svg("text", { x: x(t), y: height - 8, class: "tick x", "text-anchor": anchor }, `${clock(t)}Z`));
    });
  } else {
    root.append(svg("text", { x: w / 2, y: height / 2, class: "empty" }, "no samples yet"));
  }
  for (const s of spec.series) {
    let d = "", pen = "M", points = 0;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) { pen = "M"; return; }
      d += `${pen}${x(at[i]).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
      points += 1;
    });
    const line = svg("path", { d: d.trim(), class: "line", stroke: s.color, "stroke-dasharray": s.dash || "none", "data-series": s.name, "data-points": points });
    root.append(line);
    const last = s.values.length - 1;
    if (last >= 0 && s.values[last] !== null && s.values[last] !== undefined) {
      root.append(svg("circle", { cx: x(at[last]), cy: y(s.values[last]), r: 2.5, fill: s.color }));
    }
  }
  const legend = h("ul", "plot-legend");
  for (const s of spec.series) {
    const sw = element("i", "swatch line-swatch");
    sw.style.borderColor = s.color;
    if (s.dash) sw.style.borderStyle = "dashed";
    const shown = s.values.filter((v) => v !== null && v !== undefined);
    const latest = shown[shown.length - 1];
    const now = shown.length ? `${spec.format ? spec.format(latest) : latest} ${spec.unit}` : "not measured";
    legend.append(h("li", "", sw, element("span", "", s.name), element("span", "now", `${now}`)));
  }
  const fig = h("figure", "plot-box", element("figcaption", "", `${spec.title} (${spec.unit})`), root, legend);
  fig.dataset.plot = spec.id || spec.title;
  return fig;
}

// the four plots of a history answer (/api/history): memory, compute, holders, fragmentation
function historyPlots(data) {
  const gibs = (list) => list.map((v) => (v === null ? null : v / 1024));
  const cardsOf = (list) => list.map((v) => (v === null ? null : v / 1000));
  const one = short;
  return h("div", "plots",
    linePlot({ id: "memory", title: "Memory", unit: "GiB", at: data.at, format: one, series: [
      { name: "capacity", values: gibs(data.memory_mib), color: "#6b7280", dash: "4 3" },
      { name: "granted", values: gibs(data.granted_mib), color: "#2563eb" },
      { name: "used (processes)", values: gibs(data.used_mib), color: "#ea580c" }] }),
    linePlot({ id: "compute", title: "Compute", unit: "cards", at: data.at, format: one, series: [
      { name: "capacity", values: cardsOf(data.core_milli), color: "#6b7280", dash: "4 3" },
      { name: "granted", values: cardsOf(data.granted_core_milli), color: "#9333ea" },
      { name: "used (SM time)", values: cardsOf(data.used_core_milli), color: "#ea580c" }] }),
    linePlot({ id: "holders", title: "Holders", unit: "allocations", at: data.at, format: short, series: [
      { name: "holders", values: data.holders, color: "#16a34a" }] }),
    linePlot({ id: "fragmentation", title: "Fragmentation", unit: "cards", at: data.at, format: one, series: [
      { name: "free", values: cardsOf(data.free_milli), color: "#6b7280", dash: "4 3" },
      { name: "fragment (default policy)", values: cardsOf(data.frag_milli), color: "#dc2626" }] }));
}
