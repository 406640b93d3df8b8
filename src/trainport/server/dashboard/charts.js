// trainport dashboard: line charts drawn by uPlot (fetched at setup, see
// scripts/fetch-dashboard-vendor.sh). Where the library is missing, each chart is a table
// of its values and the page says why. Hover shows values in the legend; drag zooms the
// x axis, a double click zooms back out.
(() => {
"use strict";

const PALETTE = ["#1f5fae", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207", "#4d7c0f", "#be185d", "#334155"];

function chartsAvailable() {
  return typeof window.uPlot === "function";
}

function chartsMissingReason() {
  return window.TRAINPORT_CHARTS_MISSING || "the charting library did not load";
}

// Seconds as a short duration: 45 s, 3m 20s, 1h 05m.
function fmtSeconds(s) {
  if (s == null || !isFinite(s)) return "";
  const a = Math.abs(s), sign = s < 0 ? "-" : "";
  if (a < 60) return sign + (a < 10 && a % 1 ? a.toFixed(1) : Math.round(a)) + " s";
  if (a < 3600) return `${sign}${Math.floor(a / 60)}m ${String(Math.round(a % 60)).padStart(2, "0")}s`;
  return `${sign}${Math.floor(a / 3600)}h ${String(Math.floor(a % 3600 / 60)).padStart(2, "0")}m`;
}

function fmtNumber(v) {
  if (v == null || !isFinite(v)) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

function fmtBytes(v) {
  if (v == null || !isFinite(v)) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${Number(v.toPrecision(3))} ${units[i]}`;
}

// One series' points as [x, y] pairs, sorted by x, the last value kept where xs repeat.
function cleanPoints(points) {
  const byX = new Map();
  for (const [x, y] of points) if (x != null && isFinite(x)) byX.set(x, y);
  return [...byX.entries()].sort((a, b) => a[0] - b[0]);
}

// A chart of several series on one x axis.
//   spec = { title, id, xLabel, xFormat, yFormat, width, height,
//            series: [{ label, points: [[x, y], ...] }] }
// Returns a <div class="chart" data-chart=id data-series="label,label"> holding it.
function lineChart(spec) {
  const series = spec.series.map((s) => ({ label: s.label, points: cleanPoints(s.points) }));
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.chart = spec.id || spec.title;
  box.dataset.series = series.map((s) => s.label).join(",");
  const title = document.createElement("h3");
  title.textContent = spec.title;
  box.append(title);
  const xFormat = spec.xFormat || fmtNumber, yFormat = spec.yFormat || fmtNumber;
  if (!chartsAvailable()) {
    box.append(valueTable(series, spec.xLabel, xFormat, yFormat));
    return box;
  }
  const tables = series.map((s) => [s.points.map((p) => p[0]), s.points.map((p) => p[1])]);
  const data = tables.length === 1 ? tables[0] : window.uPlot.join(tables);
  const opts = {
    width: spec.width || 360,
    height: spec.height || 200,
    scales: { x: { time: false } },
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    series: [
      { label: spec.xLabel, value: (u, v) => (v == null ? "-" : xFormat(v)) },
      ...series.map((s, i) => ({
        label: s.label,
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        spanGaps: true,
        points: { show: true, size: 5 },
        value: (u, v) => (v == null ? "-" : yFormat(v)),
      })),
    ],
    axes: [
      { label: spec.xLabel, values: (u, vals) => vals.map(xFormat), size: 40, labelSize: 18 },
      { values: (u, vals) => vals.map(yFormat), size: 58 },
    ],
  };
  const holder = document.createElement("div");
  box.append(holder);
  box.uplot = new window.uPlot(opts, data, holder);
  return box;
}

// The chart's values as a table (no charting library).
function valueTable(series, xLabel, xFormat, yFormat) {
  const table = document.createElement("table");
  table.className = "values";
  const head = table.createTHead().insertRow();
  for (const h of [xLabel, ...series.map((s) => s.label)]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const body = table.createTBody();
  for (const x of xs.slice(-50)) {
    const row = body.insertRow();
    row.insertCell().textContent = xFormat(x);
    for (const s of series) {
      const hit = s.points.find((p) => p[0] === x);
      row.insertCell().textContent = hit ? yFormat(hit[1]) : "";
    }
  }
  return table;
}

window.trainportCharts = { lineChart, chartsAvailable, chartsMissingReason, fmtSeconds, fmtNumber, fmtBytes };
})();
