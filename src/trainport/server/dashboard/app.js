// trainport dashboard: plain JS, no build step. Reads /api/* of the server that served it.
// Pages (by the URL's hash): #/ the job list, #/jobs/NAME one job, #/compare/A,B jobs side
// by side, #/tuning/NAME a tuning job, #/signin the sign-in form.
"use strict";

const { lineChart, chartsAvailable, chartsMissingReason, fmtSeconds, fmtNumber } = window.trainportCharts;
const view = document.getElementById("view");
const TERMINAL = ["Completed", "Failed", "Stopped"];
const STATUSES = ["InProgress", "Completed", "Failed", "Stopping", "Stopped"];
let timer = null;
let page = null; // the page shown now: { kind, ... } with its own state

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v == null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function fmtTime(ts) {
  return ts ? new Date(ts * 1000).toLocaleString() : "-";
}

function durationSeconds(job) {
  const start = job.TrainingStartTime || job.CreationTime;
  const end = job.TrainingEndTime || (TERMINAL.includes(job.TrainingJobStatus) ? job.LastModifiedTime : Date.now() / 1000);
  return Math.max(0, Math.round(end - start));
}

function duration(job) {
  return fmtSeconds(durationSeconds(job));
}

function chartWidth() {
  return Math.max(260, Math.min(560, view.clientWidth - 24));
}

// -- the API --------------------------------------------------------------------------------

class SignInNeeded extends Error {}

async function api(path, options) {
  const resp = await fetch("/api/" + path, { credentials: "same-origin", ...(options || {}) });
  let body = {};
  try { body = await resp.json(); } catch (e) { body = { message: resp.statusText }; }
  if (resp.status === 401) throw new SignInNeeded(body.message || "sign in");
  if (!resp.ok) throw new Error(`${body.__type || resp.status}: ${body.message || ""}`);
  return body;
}

function post(path, body) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Trainport-Dashboard": "1" },
    body: JSON.stringify(body || {}),
  });
}

function showError(err) {
  view.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
}

function stamp() {
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

function chartsNote() {
  return chartsAvailable() ? [] : [el("p", { class: "warning", id: "charts-missing" }, chartsMissingReason())];
}

// -- signing in -----------------------------------------------------------------------------

const SIGNIN_REASONS = {
  "bad-link": "That sign-in link is wrong or out of date: sign in with an access key pair.",
  "signed-out": "You signed out.",
};

function renderSignIn(message) {
  page = { kind: "signin" };
  document.getElementById("sign-out").hidden = true;
  const error = el("p", { class: "error", id: "signin-error", hidden: true });
  const form = el("form", { id: "signin", class: "signin" },
    el("h1", {}, "Sign in"),
    el("p", { class: "muted", id: "signin-message" }, message || "Sign in with an access key pair this server accepts."),
    el("label", { for: "access-key-id" }, "Access key ID"),
    el("input", { id: "access-key-id", name: "accessKeyId", autocomplete: "username", required: true, spellcheck: "false" }),
    el("label", { for: "secret-access-key" }, "Secret access key"),
    el("input", { id: "secret-access-key", name: "secretAccessKey", type: "password", autocomplete: "current-password", required: true }),
    el("button", { type: "submit" }, "Sign in"),
    error,
    el("p", { class: "muted small" }, "The server's keys are in $TRAINPORT_HOME/server/keys.json; `trainport server` also prints a sign-in link."));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await post("signin", { accessKeyId: form.accessKeyId.value, secretAccessKey: form.secretAccessKey.value });
      if (location.hash === "#/") refresh(); else location.hash = "#/";
    } catch (err) {
      error.textContent = String(err.message || err).replace(/^[A-Za-z]+Exception: /, "");
      error.hidden = false;
    }
  });
  view.replaceChildren(form);
}

async function signOut() {
  try { await post("signout"); } catch (e) { /* signed out either way */ }
  location.hash = "#/signin/signed-out";
}

// -- the job list ---------------------------------------------------------------------------

// Columns: the API sorts by Name, CreationTime and Status across every page; the others
// sort the jobs on the page shown.
const COLUMNS = [
  { key: "Name", label: "Name", server: "Name", value: (j) => j.TrainingJobName },
  { key: "Status", label: "Status", server: "Status", value: (j) => j.TrainingJobStatus },
  { key: "Secondary", label: "Secondary status", value: (j) => j.SecondaryStatus, narrowHidden: true },
  { key: "Created", label: "Created", server: "CreationTime", value: (j) => j.CreationTime, narrowHidden: true },
  { key: "Duration", label: "Duration", value: (j) => durationSeconds(j) },
];

function listState() {
  if (!page || page.kind !== "list") {
    // Jobs per page: the menu's choice, or ?size=N in the page's address (1 to 100).
    const asked = Number(new URLSearchParams(location.search).get("size"));
    const size = asked >= 1 && asked <= 100 ? Math.floor(asked) : 100;
    page = { kind: "list", contains: "", status: "", sort: "Created", order: "Descending", size, tokens: [null], index: 0, selected: new Set(), data: null };
  }
  return page;
}

function listQuery(state) {
  const q = new URLSearchParams({ size: String(state.size) });
  if (state.contains) q.set("contains", state.contains);
  if (state.status) q.set("status", state.status);
  const column = COLUMNS.find((c) => c.key === state.sort);
  if (column && column.server) { q.set("sort", column.server); q.set("order", state.order); }
  const token = state.tokens[state.index];
  if (token) q.set("next", token);
  return q;
}

async function renderList() {
  const state = listState();
  // The newest request wins: a refresh asked before a search may answer after it.
  const ticket = (state.ticket = (state.ticket || 0) + 1);
  const [data, tuning] = await Promise.all([api("jobs?" + listQuery(state)), api("tuning")]);
  if (page !== state || ticket !== state.ticket) return;
  state.data = data;
  state.tokens[state.index + 1] = data.next || undefined;
  if (!state.built || !document.getElementById("jobs-page")) { buildList(state); state.built = true; }
  fillList(state);
  fillTuning(tuning.tuningJobs);
  stamp();
}

function buildList(state) {
  const search = el("input", { id: "search", type: "search", placeholder: "Search by name", value: state.contains, "aria-label": "Search by name" });
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.contains = search.value.trim(); restartPaging(state); }, 250);
  });
  const filter = el("select", { id: "status-filter", "aria-label": "Filter by status" },
    el("option", { value: "" }, "All statuses"), ...STATUSES.map((s) => el("option", { value: s }, s)));
  filter.value = state.status;
  filter.addEventListener("change", () => { state.status = filter.value; restartPaging(state); });
  const sizes = [...new Set([10, 25, 50, 100, state.size])].sort((a, b) => a - b);
  const perPage = el("select", { id: "page-size", "aria-label": "Jobs per page" }, ...sizes.map((n) => el("option", { value: String(n) }, `${n} per page`)));
  perPage.value = String(state.size);
  perPage.addEventListener("change", () => { state.size = Number(perPage.value); restartPaging(state); });
  const compare = el("button", { id: "compare", disabled: true, onclick: () => {
    location.hash = "#/compare/" + [...state.selected].map(encodeURIComponent).join(",");
  } }, "Compare");
  const head = el("tr", {}, el("th", { class: "pick" }, ""), ...COLUMNS.map((c) => {
    const th = el("th", { "data-sort": c.key, class: c.narrowHidden ? "narrow-hidden sortable" : "sortable", tabindex: "0" }, c.label);
    const toggle = () => {
      if (state.sort === c.key) state.order = state.order === "Ascending" ? "Descending" : "Ascending";
      else { state.sort = c.key; state.order = c.key === "Name" ? "Ascending" : "Descending"; }
      if (c.server) restartPaging(state); else fillList(state);
    };
    th.addEventListener("click", toggle);
    th.addEventListener("keydown", (ev) => { if (ev.key === "Enter") toggle(); });
    return th;
  }));
  const table = el("table", { id: "jobs" }, el("thead", {}, head), el("tbody", {}));
  const pager = el("div", { class: "pager" },
    el("button", { id: "prev-page", onclick: () => { state.index--; refresh(); } }, "← Previous"),
    el("span", { id: "page-number" }),
    el("button", { id: "next-page", onclick: () => { state.index++; refresh(); } }, "Next →"));
  view.replaceChildren(el("div", { id: "jobs-page" },
    ...chartsNote(),
    el("h1", {}, "Training jobs"),
    el("div", { class: "toolbar" }, search, filter, perPage, compare),
    el("div", { class: "scroll" }, table),
    el("p", { class: "muted", id: "no-jobs", hidden: true }, "No training jobs match."),
    pager,
    el("div", { id: "tuning-section" })));
}

function restartPaging(state) {
  state.tokens = [null];
  state.index = 0;
  refresh();
}

function fillList(state) {
  const column = COLUMNS.find((c) => c.key === state.sort) || COLUMNS[3];
  let jobs = state.data.jobs.slice();
  if (!column.server) {
    const sign = state.order === "Ascending" ? 1 : -1;
    jobs.sort((a, b) => { const x = column.value(a), y = column.value(b); return x < y ? -sign : x > y ? sign : 0; });
  }
  const rows = jobs.map((j) => {
    const name = j.TrainingJobName;
    const pick = el("input", { type: "checkbox", class: "select", "data-job": name, "aria-label": "Select " + name, checked: state.selected.has(name) });
    pick.addEventListener("change", () => {
      if (pick.checked) state.selected.add(name); else state.selected.delete(name);
      updateCompare(state);
    });
    return el("tr", { "data-job": name },
      el("td", { class: "pick" }, pick),
      el("td", { class: "name" }, el("a", { href: "#/jobs/" + encodeURIComponent(name) }, name)),
      el("td", { class: "status " + j.TrainingJobStatus }, j.TrainingJobStatus),
      el("td", { class: "narrow-hidden" }, j.SecondaryStatus),
      el("td", { class: "narrow-hidden" }, fmtTime(j.CreationTime)),
      el("td", {}, duration(j)));
  });
  document.querySelector("#jobs tbody").replaceChildren(...rows);
  for (const th of document.querySelectorAll("#jobs th[data-sort]")) {
    const on = th.dataset.sort === state.sort;
    th.setAttribute("aria-sort", on ? (state.order === "Ascending" ? "ascending" : "descending") : "none");
  }
  document.getElementById("no-jobs").hidden = rows.length > 0;
  document.getElementById("prev-page").disabled = state.index === 0;
  document.getElementById("next-page").disabled = !state.tokens[state.index + 1];
  document.getElementById("page-number").textContent = `page ${state.index + 1}`;
  updateCompare(state);
}

function updateCompare(state) {
  const button = document.getElementById("compare");
  button.disabled = state.selected.size < 2;
  button.textContent = `Compare (${state.selected.size})`;
}

function fillTuning(tuningJobs) {
  const section = document.getElementById("tuning-section");
  if (!tuningJobs.length) { section.replaceChildren(); return; }
  const rows = tuningJobs.map((t) => {
    const c = t.TrainingJobStatusCounters;
    return el("tr", { "data-tuning-job": t.HyperParameterTuningJobName },
      el("td", {}, el("a", { href: "#/tuning/" + encodeURIComponent(t.HyperParameterTuningJobName) }, t.HyperParameterTuningJobName)),
      el("td", { class: "status " + t.HyperParameterTuningJobStatus }, t.HyperParameterTuningJobStatus),
      el("td", { class: "narrow-hidden" }, t.Strategy),
      el("td", {}, `${c.Completed} completed, ${c.InProgress} running, ${c.Stopped} stopped, ${c.NonRetryableError} failed`),
      el("td", { class: "narrow-hidden" }, fmtTime(t.CreationTime)));
  });
  section.replaceChildren(el("h1", {}, "Tuning jobs"), el("div", { class: "scroll" }, el("table", { id: "tuning-jobs" },
    el("thead", {}, el("tr", {}, ...["Name", "Status", "Strategy", "Children", "Created"].map((h, i) => el("th", { class: [2, 4].includes(i) ? "narrow-hidden" : "" }, h)))),
    el("tbody", {}, ...rows))));
}

// -- one tuning job -------------------------------------------------------------------------

async function renderTuning(name) {
  page = { kind: "tuning", name };
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
  const start = t.CreationTime;
  const since = (pts) => pts.map(([when, v]) => [when - start, v]);
  view.replaceChildren(
    ...chartsNote(),
    el("p", {}, el("a", { href: "#/" }, "← all jobs")),
    el("h1", {}, t.HyperParameterTuningJobName, " ", el("span", { class: "status " + t.HyperParameterTuningJobStatus, id: "tuning-status" }, t.HyperParameterTuningJobStatus)),
    kvTable(summary),
    el("h2", {}, "Objective over time"),
    data.objective.length
      ? el("div", { class: "charts", id: "objective-charts" },
        lineChart({ id: "objective", title: `${objective.MetricName} of each child`, xLabel: "since start", xFormat: fmtSeconds, width: chartWidth(), series: [{ label: objective.MetricName, points: since(data.objective) }] }),
        lineChart({ id: "best-so-far", title: `best ${objective.MetricName} so far`, xLabel: "since start", xFormat: fmtSeconds, width: chartWidth(), series: [{ label: "best", points: since(data.bestSoFar) }] }))
      : el("p", { class: "muted" }, "No child has ended with an objective yet."),
    el("h2", {}, "Children"),
    rows.length ? el("div", { class: "scroll" }, children) : el("p", { class: "muted" }, "No children yet."));
  stamp();
}

// -- one job --------------------------------------------------------------------------------

function show(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}

function kvTable(obj, id) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return el("p", { class: "muted" }, "none");
  return el("table", { class: "kv", id }, el("tbody", {}, ...entries.map(([k, v]) =>
    el("tr", { "data-key": k }, el("th", {}, k), el("td", {}, el("code", {}, show(v)))))));
}

// The request's settings, each as a line a person reads.
function settingsRows(s) {
  const rows = {};
  const algo = s.AlgorithmSpecification || {};
  const rc = s.ResourceConfig || {};
  if (rc.InstanceGroups) rows["Instances"] = rc.InstanceGroups.map((g) => `${g.InstanceGroupName}: ${g.InstanceType} × ${g.InstanceCount}`).join("; ");
  else rows["Instances"] = `${rc.InstanceType} × ${rc.InstanceCount}` + (rc.VolumeSizeInGB ? `, ${rc.VolumeSizeInGB} GB volume` : "");
  if (algo.TrainingImage) rows["Image"] = algo.TrainingImage;
  if (algo.ContainerEntrypoint) rows["Entry point"] = algo.ContainerEntrypoint.join(" ");
  if (algo.ContainerArguments) rows["Arguments"] = algo.ContainerArguments.join(" ");
  if (algo.AlgorithmName) rows["Algorithm"] = algo.AlgorithmName;
  rows["Input mode"] = algo.TrainingInputMode || "File";
  for (const c of s.InputDataConfig || []) {
    const src = (c.DataSource || {}).S3DataSource || (c.DataSource || {}).FileSystemDataSource || {};
    rows[`Channel ${c.ChannelName}`] = `${src.S3Uri || src.DirectoryPath || show(c.DataSource)} (${c.InputMode || algo.TrainingInputMode || "File"}, ${src.S3DataDistributionType || "FullyReplicated"})`;
  }
  if (s.OutputDataConfig) rows["Output path"] = s.OutputDataConfig.S3OutputPath;
  if (s.CheckpointConfig) rows["Checkpoints"] = `${s.CheckpointConfig.S3Uri} ↔ ${s.CheckpointConfig.LocalPath || "/opt/ml/checkpoints"}`;
  const stop = s.StoppingCondition || {};
  rows["Stopping condition"] = Object.entries(stop).map(([k, v]) => `${k} ${v}`).join(", ");
  if (s.RetryStrategy) rows["Retry"] = `${s.RetryStrategy.MaximumRetryAttempts} attempts`;
  for (const m of algo.MetricDefinitions || []) rows[`Metric ${m.Name}`] = m.Regex;
  if (s.EnvironmentNames) rows["Environment"] = s.EnvironmentNames.join(", ") + " (values hidden)";
  if (s.Tags) rows["Tags"] = s.Tags.map((t) => `${t.Key}=${t.Value}`).join(", ");
  for (const k of ["VpcConfig", "EnableNetworkIsolation", "EnableManagedSpotTraining", "TensorBoardOutputConfig", "ExperimentConfig", "RoleArn"]) {
    if (s[k] !== undefined) rows[k] = s[k];
  }
  return rows;
}

function transitionsTable(job) {
  return el("table", { id: "transitions" },
    el("thead", {}, el("tr", {}, ...["Status", "Start", "End", "Message"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...(job.SecondaryStatusTransitions || []).map((t) => el("tr", {},
      el("td", {}, t.Status), el("td", {}, fmtTime(t.StartTime)), el("td", {}, fmtTime(t.EndTime)), el("td", {}, t.StatusMessage)))));
}

function metricCharts(metrics, start, byStep) {
  return Object.entries(metrics).map(([name, m]) => {
    const step = byStep && m.axis;
    const points = m.points.map(([t, v, s]) => [step ? s : t - start, v]).filter((p) => p[0] != null);
    return lineChart({ id: name, title: name, xLabel: step ? m.axis : "since start", xFormat: step ? fmtNumber : fmtSeconds, width: chartWidth(), series: [{ label: name, points }] });
  });
}

function resourceCharts(hosts, start) {
  const withData = hosts.filter((h) => h.resources.length)
    .sort((a, b) => a.host.localeCompare(b.host, undefined, { numeric: true }));
  if (!withData.length) return [el("p", { class: "muted" }, "No samples yet: hosts are sampled once a second while training.")];
  const series = (i, scale) => withData.map((h) => ({ label: h.host, points: h.resources.map((r) => [r[0] - start, r[i] / scale]) }));
  return [
    lineChart({ id: "cpu", title: "CPU (cores busy)", xLabel: "since start", xFormat: fmtSeconds, width: chartWidth(), series: series(1, 1) }),
    // In MiB: the axis then ticks at round numbers of MiB.
    lineChart({ id: "memory", title: "Memory (MiB)", xLabel: "since start", xFormat: fmtSeconds, width: chartWidth(), series: series(2, 1 << 20) }),
  ];
}

async function renderJob(name) {
  const data = await api("jobs/" + encodeURIComponent(name));
  const job = data.job;
  const first = !page || page.kind !== "job" || page.name !== name;
  if (first) {
    page = { kind: "job", name, host: data.hosts[0].host, token: null, follow: true, byStep: false, points: -1 };
    buildJob(data);
  }
  const state = page;
  const status = job.TrainingJobStatus;
  const badge = document.getElementById("job-status");
  badge.textContent = status;
  badge.className = "status " + status;
  const stop = document.getElementById("stop-job");
  stop.hidden = TERMINAL.includes(status);
  stop.disabled = status === "Stopping";
  const summary = {
    Status: `${status} / ${job.SecondaryStatus}`,
    Created: fmtTime(job.CreationTime),
    "Training start": fmtTime(job.TrainingStartTime),
    "Training end": fmtTime(job.TrainingEndTime),
    Duration: duration(job),
  };
  if (job.FailureReason) summary["Failure reason"] = job.FailureReason;
  for (const m of job.FinalMetricDataList || []) summary[`Final ${m.MetricName}`] = String(m.Value);
  document.getElementById("summary").replaceChildren(kvTable(summary));
  const model = job.ModelArtifacts && job.ModelArtifacts.S3ModelArtifacts;
  document.getElementById("model").replaceChildren(model && TERMINAL.includes(status)
    ? el("a", { id: "model-link", href: `/api/jobs/${encodeURIComponent(name)}/model` }, `Download model artifact (${model})`)
    : el("span", { class: "muted" }, "The model artifact is uploaded when the job ends."));
  document.getElementById("transitions-box").replaceChildren(transitionsTable(job));
  for (const h of data.hosts) {
    const tab = document.querySelector(`#host-picker [data-host="${h.host}"]`);
    if (tab) tab.classList.toggle("failed", h.failed);
  }
  // Charts are drawn again only when there is something new (a redraw ends a zoom).
  const start = job.TrainingStartTime || job.CreationTime;
  const points = Object.values(data.metrics).reduce((n, m) => n + m.points.length, 0)
    + data.hosts.reduce((n, h) => n + h.resources.length, 0);
  if (points !== state.points || state.redraw) {
    state.points = points;
    state.redraw = false;
    state.data = data;
    const anyStep = Object.values(data.metrics).some((m) => m.axis);
    document.getElementById("axis-toggle").hidden = !anyStep;
    document.getElementById("charts").replaceChildren(...(Object.keys(data.metrics).length
      ? metricCharts(data.metrics, start, state.byStep)
      : [el("p", { class: "muted" }, "No metric values yet (MetricDefinitions are matched against algo-1's log).")]));
    document.getElementById("resources").replaceChildren(...resourceCharts(data.hosts, start));
  }
  await pollLog(state);
  state.ended = TERMINAL.includes(status);
  stamp();
}

function buildJob(data) {
  const job = data.job, name = job.TrainingJobName;
  const state = page;
  const log = el("pre", { id: "log", tabindex: "0" });
  const jump = el("button", { id: "follow-log", class: "small", hidden: true, onclick: () => { state.follow = true; log.scrollTop = log.scrollHeight; jump.hidden = true; } }, "↓ Follow newest lines");
  log.addEventListener("scroll", () => {
    state.follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    jump.hidden = state.follow;
  });
  const picker = el("div", { id: "host-picker", role: "tablist" }, ...data.hosts.map((h) =>
    el("button", { role: "tab", "data-host": h.host, class: h.failed ? "host-tab failed" : "host-tab", "aria-selected": String(h.host === state.host), onclick: () => pickHost(h.host) },
      h.host, h.failed ? " (failed)" : "")));
  const axis = el("label", { id: "axis-toggle", hidden: true }, el("input", { type: "checkbox", id: "by-step", onchange: (ev) => { state.byStep = ev.target.checked; state.redraw = true; refresh(); } }), " by step/epoch");
  const stop = el("button", { id: "stop-job", class: "danger", onclick: () => stopJob(name) }, "Stop");
  view.replaceChildren(
    ...chartsNote(),
    el("p", {}, el("a", { href: "#/" }, "← all jobs")),
    el("div", { class: "title" }, el("h1", {}, name, " ", el("span", { id: "job-status" })), stop),
    el("div", { id: "summary" }),
    el("p", { id: "model" }),
    el("h2", {}, "Metrics ", axis),
    el("div", { class: "charts", id: "charts" }),
    el("h2", {}, `Log (${data.hosts.length} host${data.hosts.length > 1 ? "s" : ""})`),
    picker,
    el("button", { id: "earlier-log", class: "small", hidden: true, onclick: loadEarlier }, "↑ Show earlier lines"),
    log,
    jump,
    el("h2", {}, "Resources"),
    el("div", { class: "charts", id: "resources" }),
    el("h2", {}, "Status transitions"),
    el("div", { class: "scroll", id: "transitions-box" }),
    el("details", { id: "settings", open: true }, el("summary", {}, "Settings"), el("div", { class: "scroll" }, kvTable(settingsRows(data.settings), "settings-table"))),
    el("h2", {}, "Hyperparameters"),
    el("div", { class: "scroll" }, kvTable(job.HyperParameters, "hyperparameters")));
}

function pickHost(host) {
  if (!page || page.kind !== "job") return;
  page.host = host;
  page.token = null;
  page.follow = true;
  document.getElementById("log").replaceChildren();
  showEarlier(page, null);
  for (const tab of document.querySelectorAll("#host-picker [data-host]")) tab.setAttribute("aria-selected", String(tab.dataset.host === host));
  pollLog(page);
}

// One poll at a time; a host picked during a poll is read as soon as that poll ends.
async function pollLog(state) {
  if (state.polling) { state.again = true; return; }
  state.polling = true;
  try {
    do {
      state.again = false;
      await readLog(state);
    } while (state.again && page === state);
  } finally {
    state.polling = false;
  }
}

async function readLog(state) {
  // Pages of 1,000 lines until the newest.
  for (;;) {
    const q = new URLSearchParams({ host: state.host });
    if (state.token) q.set("token", state.token);
    const host = state.host;
    const data = await api(`jobs/${encodeURIComponent(state.name)}/logs?` + q);
    const pre = document.getElementById("log");
    if (page !== state || state.host !== host || !pre) return;
    if (data.events.length) {
      pre.append(data.events.map((e) => e.message).join("\n") + "\n");
      if (state.follow) pre.scrollTop = pre.scrollHeight;
    }
    if (!state.token) showEarlier(state, data.earlier);
    if (data.nextForwardToken) state.token = data.nextForwardToken;
    if (data.events.length < 1000) return;
  }
}

// A long log opens at its newest 1,000 lines; earlier ones come a page at a time.
function showEarlier(state, token) {
  state.earlier = token;
  document.getElementById("earlier-log").hidden = !token;
}

async function loadEarlier() {
  const state = page;
  if (!state || state.kind !== "job" || !state.earlier) return;
  const q = new URLSearchParams({ host: state.host, before: state.earlier });
  const data = await api(`jobs/${encodeURIComponent(state.name)}/logs?` + q);
  const pre = document.getElementById("log");
  if (page !== state || !pre) return;
  const height = pre.scrollHeight;
  if (data.events.length) pre.prepend(data.events.map((e) => e.message).join("\n") + "\n");
  pre.scrollTop += pre.scrollHeight - height; // the lines being read stay in place
  showEarlier(state, data.earlier);
}

async function stopJob(name) {
  if (!window.confirm(`Stop training job ${name}? Its processes get SIGTERM, then SIGKILL after the grace period; its artifacts are still uploaded.`)) return;
  const button = document.getElementById("stop-job");
  button.disabled = true;
  try {
    await post(`jobs/${encodeURIComponent(name)}/stop`);
  } catch (err) {
    button.disabled = false;
    window.alert(String(err.message || err));
  }
  refresh();
}

// -- comparing jobs -------------------------------------------------------------------------

async function renderCompare(names) {
  const key = names.join(",");
  const data = await api("compare?jobs=" + encodeURIComponent(key));
  const first = !page || page.kind !== "compare" || page.key !== key;
  if (first) page = { kind: "compare", key, byStep: false };
  const state = page;
  state.data = data;
  const jobs = data.jobs;
  const anyStep = jobs.some((j) => Object.values(j.metrics).some((m) => m.axis));
  const metricNames = [...new Set(jobs.flatMap((j) => Object.keys(j.metrics)))].sort();
  const charts = metricNames.map((metric) => {
    const axes = jobs.map((j) => (j.metrics[metric] || {}).axis).filter(Boolean);
    const step = state.byStep && axes.length ? axes[0] : null;
    const series = jobs.map((j) => ({
      label: j.name,
      points: ((j.metrics[metric] || {}).points || []).map(([t, v, s]) => [step ? s : t - j.start, v]).filter((p) => p[0] != null),
    }));
    return lineChart({ id: metric, title: metric, xLabel: step || "since start", xFormat: step ? fmtNumber : fmtSeconds, width: chartWidth(), series });
  });
  const hpNames = [...new Set(jobs.flatMap((j) => Object.keys(j.hyperParameters)))].sort();
  const finalNames = [...new Set(jobs.flatMap((j) => Object.keys(j.finalMetrics)))].sort();
  const row = (kind, label, values) => {
    const differs = new Set(values.map((v) => v ?? "")).size > 1;
    return el("tr", { "data-row": `${kind}:${label}`, class: differs ? "differs" : "" },
      el("th", {}, label, differs ? el("span", { class: "mark", title: "differs between the jobs" }, " ≠") : ""),
      ...values.map((v) => el("td", {}, v ?? "-")));
  };
  const table = el("table", { id: "compare-table" },
    el("thead", {}, el("tr", {}, el("th", {}, ""), ...jobs.map((j) => el("th", {}, el("a", { href: "#/jobs/" + encodeURIComponent(j.name) }, j.name), " ", el("span", { class: "status " + j.status }, j.status))))),
    el("tbody", {},
      el("tr", { class: "section" }, el("th", { colspan: String(jobs.length + 1) }, "Hyperparameters")),
      ...hpNames.map((n) => row("hp", n, jobs.map((j) => j.hyperParameters[n]))),
      el("tr", { class: "section" }, el("th", { colspan: String(jobs.length + 1) }, "Final metrics")),
      ...finalNames.map((n) => row("metric", n, jobs.map((j) => (j.finalMetrics[n] == null ? null : fmtNumber(j.finalMetrics[n])))))));
  const toggle = el("label", { id: "axis-toggle", hidden: !anyStep }, el("input", { type: "checkbox", id: "by-step", checked: state.byStep, onchange: (ev) => { state.byStep = ev.target.checked; refresh(); } }), " by step/epoch");
  view.replaceChildren(
    ...chartsNote(),
    el("p", {}, el("a", { href: "#/" }, "← all jobs")),
    el("h1", {}, `Comparing ${jobs.length} jobs`),
    el("div", { class: "scroll" }, table),
    el("h2", {}, "Metrics ", toggle),
    metricNames.length ? el("div", { class: "charts", id: "compare-charts" }, ...charts) : el("p", { class: "muted" }, "None of these jobs has metric values."));
  state.ended = jobs.every((j) => TERMINAL.includes(j.status));
  stamp();
}

// -- routing --------------------------------------------------------------------------------

async function route() {
  const hash = location.hash;
  const signin = hash.match(/^#\/signin(?:\/(.+))?$/);
  const job = hash.match(/^#\/jobs\/(.+)$/);
  const tuning = hash.match(/^#\/tuning\/(.+)$/);
  const compare = hash.match(/^#\/compare\/(.+)$/);
  if (signin) { renderSignIn(SIGNIN_REASONS[signin[1]]); return; }
  document.getElementById("sign-out").hidden = document.getElementById("sign-out").dataset.auth === "false";
  try {
    if (job) await renderJob(decodeURIComponent(job[1]));
    else if (tuning) await renderTuning(decodeURIComponent(tuning[1]));
    else if (compare) await renderCompare(compare[1].split(",").map(decodeURIComponent));
    else await renderList();
  } catch (err) {
    if (err instanceof SignInNeeded) renderSignIn(err.message.charAt(0).toUpperCase() + err.message.slice(1) + ".");
    else showError(err);
  }
}

function refresh() {
  clearTimeout(timer);
  route().then(schedule);
}

// Once, before the first page: where this browser stands (a signed-out browser gets the
// sign-in form without a request that fails).
async function start() {
  try {
    const session = await api("session");
    document.getElementById("sign-out").dataset.auth = String(session.auth);
    if (!session.signedIn && !location.hash.startsWith("#/signin")) {
      const message = session.message.charAt(0).toUpperCase() + session.message.slice(1) + ".";
      renderSignIn(message);
      return;
    }
  } catch (err) {
    showError(err);
    return;
  }
  refresh();
}

function schedule() {
  clearTimeout(timer);
  if (!page || page.kind === "signin") return;
  // An ended job or comparison changes no more: it is not asked again.
  if (page.ended) return;
  timer = setTimeout(refresh, page.kind === "list" ? 5000 : 2000);
}

window.addEventListener("hashchange", () => { page = null; refresh(); });
document.getElementById("sign-out").addEventListener("click", signOut);
start();
