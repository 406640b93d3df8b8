// trainport dashboard: plain JS, no build step. Reads /api/* of the server that served it.
"use strict";

const view = document.getElementById("view");
let timer = null;
let logState = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function fmtTime(ts) {
  return ts ? new Date(ts * 1000).toLocaleString() : "-";
}

function duration(job) {
  const start = job.TrainingStartTime || job.CreationTime;
  const end = job.TrainingEndTime || (["InProgress", "Stopping"].includes(job.TrainingJobStatus) ? Date.now() / 1000 : job.LastModifiedTime);
  const s = Math.max(0, Math.round(end - start));
  return s >= 3600 ? `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m` : s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${s}s`;
}

async function api(path) {
  const resp = await fetch("/api/" + path, { credentials: "same-origin" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(`${body.__type || resp.status}: ${body.message || ""}`);
  return body;
}

function showError(err) {
  view.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
}

function stamp() {
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

// -- the job list ---------------------------------------------------------------------------

async function renderList() {
  const data = await api("jobs");
  const rows = data.jobs.map((j) => el("tr", { "data-job": j.TrainingJobName },
    el("td", {}, el("a", { href: "#/jobs/" + encodeURIComponent(j.TrainingJobName) }, j.TrainingJobName)),
    el("td", { class: "status " + j.TrainingJobStatus }, j.TrainingJobStatus),
    el("td", {}, j.SecondaryStatus),
    el("td", {}, fmtTime(j.CreationTime)),
    el("td", {}, duration(j))));
  const table = el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ...["Name", "Status", "Secondary status", "Created", "Duration"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
  const tuning = await api("tuning");
  const tuningRows = tuning.tuningJobs.map((t) => {
    const c = t.TrainingJobStatusCounters;
    return el("tr", { "data-tuning-job": t.HyperParameterTuningJobName },
      el("td", {}, el("a", { href: "#/tuning/" + encodeURIComponent(t.HyperParameterTuningJobName) }, t.HyperParameterTuningJobName)),
      el("td", { class: "status " + t.HyperParameterTuningJobStatus }, t.HyperParameterTuningJobStatus),
      el("td", {}, t.Strategy),
      el("td", {}, `${c.Completed} completed, ${c.InProgress} running, ${c.Stopped} stopped, ${c.NonRetryableError} failed`),
      el("td", {}, fmtTime(t.CreationTime)));
  });
  const tuningTable = el("table", { id: "tuning-jobs" },
    el("thead", {}, el("tr", {}, ...["Name", "Status", "Strategy", "Children", "Created"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...tuningRows));
  view.replaceChildren(el("h1", {}, "Training jobs"),
    rows.length ? table : el("p", { class: "muted" }, "No training jobs yet."),
    ...(tuningRows.length ? [el("h1", {}, "Tuning jobs"), tuningTable] : []));
  stamp();
}

// -- one tuning job -------------------------------------------------------------------------

async function renderTuning(name) {
  const data = await api("tuning/" + encodeURIComponent(name));
  const t = data.tuningJob;
  const objective = (t.HyperParameterTuningJobConfig || {}).HyperParameterTuningJobObjective || {};
  const best = t.BestTrainingJob;
  const names = [...new Set(data.children.flatMap((c) => Object.keys(c.TunedHyperParameters)))].sort();
  const jobLink = (n) => el("a", { href: "#/jobs/" + encodeURIComponent(n) }, n);
  const rows = data.children.map((c) => {
    const metric = c.FinalHyperParameterTuningJobObjectiveMetric;
    const isBest = best && best.TrainingJobName === c.TrainingJobName;
    return el("tr", { "data-child": c.TrainingJobName, class: isBest ? "best" : "" },
      el("td", {}, jobLink(c.TrainingJobName), isBest ? " ★" : ""),
      el("td", { class: "status " + c.TrainingJobStatus }, c.TrainingJobStatus),
      ...names.map((n) => el("td", {}, el("code", {}, c.TunedHyperParameters[n] ?? ""))),
      el("td", { class: "objective" }, metric ? String(metric.Value) : "-"));
  });
  const children = el("table", { id: "children" },
    el("thead", {}, el("tr", {}, ...["Training job", "Status", ...names, objective.MetricName || "Objective"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
  const counters = t.TrainingJobStatusCounters;
  const summary = {
    Status: t.HyperParameterTuningJobStatus,
    Strategy: (t.HyperParameterTuningJobConfig || {}).Strategy,
    Objective: `${objective.Type} ${objective.MetricName}`,
    Children: `${counters.Completed} completed, ${counters.InProgress} running, ${counters.Stopped} stopped, ${counters.NonRetryableError} failed`,
    Created: fmtTime(t.CreationTime),
    Ended: fmtTime(t.HyperParameterTuningEndTime),
  };
  if (best) summary["Best"] = `${best.TrainingJobName}: ${best.FinalHyperParameterTuningJobObjectiveMetric.Value} with ${JSON.stringify(best.TunedHyperParameters)}`;
  if (t.FailureReason) summary["Failure reason"] = t.FailureReason;
  view.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← all jobs")),
    el("h1", {}, t.HyperParameterTuningJobName, " ", el("span", { class: "status " + t.HyperParameterTuningJobStatus, id: "tuning-status" }, t.HyperParameterTuningJobStatus)),
    kvTable(summary),
    el("h2", {}, "Objective over time"),
    data.objective.length
      ? el("div", { class: "charts", id: "objective-charts" },
        chart(`${objective.MetricName} of each child`, data.objective),
        chart(`best ${objective.MetricName} so far`, data.bestSoFar))
      : el("p", { class: "muted" }, "No child has ended with an objective yet."),
    el("h2", {}, "Children"),
    rows.length ? children : el("p", { class: "muted" }, "No children yet."));
  stamp();
}

// -- one job --------------------------------------------------------------------------------

function kvTable(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return el("p", { class: "muted" }, "none");
  return el("table", {}, el("tbody", {}, ...entries.map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", {}, el("code", {}, typeof v === "string" ? v : JSON.stringify(v)))))));
}

function chart(name, points) {
  const W = 360, H = 180, P = 34;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("class", "metric-chart"); svg.setAttribute("data-metric", name);
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = (x) => P + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - 2 * P);
  const sy = (y) => H - P + 10 - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (H - 2 * P);
  const add = (tag, attrs, text) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    svg.append(n);
  };
  add("line", { x1: P, y1: H - P + 10, x2: W - P, y2: H - P + 10, stroke: "#aab" });
  add("line", { x1: P, y1: 10, x2: P, y2: H - P + 10, stroke: "#aab" });
  add("text", { x: 2, y: 16, "font-size": 10, fill: "#667" }, y1.toPrecision(4));
  add("text", { x: 2, y: H - P + 10, "font-size": 10, fill: "#667" }, y0.toPrecision(4));
  add("text", { x: W - P - 40, y: H - 6, "font-size": 10, fill: "#667" }, `${Math.round(x1 - x0)} s`);
  add("polyline", { points: points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "), fill: "none", stroke: "#1f5fae", "stroke-width": 2 });
  for (const p of points) add("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: "#1f5fae" });
  return el("div", { class: "chart" }, el("h3", {}, `${name} (last ${ys[ys.length - 1]})`), svg);
}

async function pollLog(name) {
  if (!logState || logState.name !== name) return;
  const q = new URLSearchParams();
  if (logState.token) q.set("token", logState.token);
  const data = await api(`jobs/${encodeURIComponent(name)}/logs?` + q);
  const pre = document.getElementById("log");
  if (!pre) return;
  if (data.events.length) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(data.events.map((e) => e.message).join("\n") + "\n");
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
  if (data.nextForwardToken) logState.token = data.nextForwardToken;
}

async function renderJob(name) {
  const data = await api("jobs/" + encodeURIComponent(name));
  const job = data.job;
  const first = !logState || logState.name !== name;
  if (first) logState = { name, token: null };
  const transitions = el("table", { id: "transitions" },
    el("thead", {}, el("tr", {}, ...["Status", "Start", "End", "Message"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...(job.SecondaryStatusTransitions || []).map((t) => el("tr", {},
      el("td", {}, t.Status), el("td", {}, fmtTime(t.StartTime)), el("td", {}, fmtTime(t.EndTime)), el("td", {}, t.StatusMessage)))));
  const channels = (job.InputDataConfig || []).map((c) => {
    const s3 = (c.DataSource || {}).S3DataSource || {};
    return [c.ChannelName, `${s3.S3Uri} (${c.InputMode || (job.AlgorithmSpecification || {}).TrainingInputMode || "File"}, ${s3.S3DataDistributionType || "FullyReplicated"})`];
  });
  const metricNames = Object.keys(data.metrics);
  const model = job.ModelArtifacts && job.ModelArtifacts.S3ModelArtifacts;
  const summary = {
    Status: `${job.TrainingJobStatus} / ${job.SecondaryStatus}`,
    Created: fmtTime(job.CreationTime),
    "Training start": fmtTime(job.TrainingStartTime),
    "Training end": fmtTime(job.TrainingEndTime),
    Duration: duration(job),
  };
  if (job.FailureReason) summary["Failure reason"] = job.FailureReason;
  for (const m of job.FinalMetricDataList || []) summary[`Final ${m.MetricName}`] = String(m.Value);
  const oldLog = document.getElementById("log");
  const log = first || !oldLog ? el("pre", { id: "log" }) : oldLog;
  view.replaceChildren(
    el("p", {}, el("a", { href: "#/" }, "← all jobs")),
    el("h1", {}, job.TrainingJobName, " ", el("span", { class: "status " + job.TrainingJobStatus, id: "job-status" }, job.TrainingJobStatus)),
    kvTable(summary),
    el("p", {}, model && ["Completed", "Failed", "Stopped"].includes(job.TrainingJobStatus)
      ? el("a", { id: "model-link", href: `/api/jobs/${encodeURIComponent(name)}/model` }, `Download model artifact (${model})`)
      : el("span", { class: "muted" }, "The model artifact is uploaded when the job ends.")),
    el("h2", {}, "Metrics"),
    metricNames.length ? el("div", { class: "charts", id: "charts" }, ...metricNames.map((m) => chart(m, data.metrics[m])))
      : el("p", { class: "muted" }, "No metric values yet (MetricDefinitions are matched against the log)."),
    el("h2", {}, "Log", data.logStreams.length ? ` (${data.logStreams[0]})` : ""),
    log,
    el("h2", {}, "Status transitions"), transitions,
    el("div", { class: "grid" },
      el("div", {}, el("h2", {}, "Hyperparameters"), kvTable(job.HyperParameters)),
      el("div", {}, el("h2", {}, "Channels"), kvTable(Object.fromEntries(channels)))));
  await pollLog(name);
  stamp();
}

// -- routing --------------------------------------------------------------------------------

async function render() {
  const m = location.hash.match(/^#\/jobs\/(.+)$/);
  const tuning = location.hash.match(/^#\/tuning\/(.+)$/);
  try {
    if (m) await renderJob(decodeURIComponent(m[1]));
    else if (tuning) { logState = null; await renderTuning(decodeURIComponent(tuning[1])); }
    else { logState = null; await renderList(); }
  } catch (err) {
    showError(err);
  }
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(async () => { await render(); schedule(); }, 2000);
}

window.addEventListener("hashchange", () => { logState = null; render().then(schedule); });
render().then(schedule);
