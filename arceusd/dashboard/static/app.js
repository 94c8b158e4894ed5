// Arceus dashboard: draws each page from the daemon's JSON and redraws it on every server-sent event.
// Every string from the daemon may come from a stranger (device names, job names, reasons): it only ever
// becomes a DOM text node or an attribute value, never HTML. Charts are SVG elements built here.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const body = document.body;
const main = document.getElementById("main");
const live = document.getElementById("live");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function sv(tag, attrs, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined && !k.startsWith("on")) node.setAttribute(k, String(v));
  }
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

const short = (id) => (typeof id === "string" ? id.slice(0, 12) : "?");
const num = (v, digits = 3) => (typeof v === "number" && isFinite(v) ? v.toFixed(digits) : "–");
const ms = (s) => (typeof s === "number" ? (s * 1000).toFixed(1) + " ms" : "–");
const stateCls = (s) => "state-" + String(s).replace(/[^a-z]/g, "");

function section(title, cls, ...children) {
  return el("section", { class: cls || "" }, el("h2", {}, title), ...children);
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))))));
}

function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function jobLink(job) {
  return el("a", { href: "job/" + encodeURIComponent(String(job.job_id || "")) }, String(job.name || short(job.job_id)));
}

// ---- live data: one fetch now, then the server's events -----------------------------------------------------
function connect(view, query, render) {
  const qs = query ? "?" + query : "";
  let last = null;
  const draw = (data) => {
    last = data;
    main.replaceChildren();
    render(data);
    body.dataset.updated = String(Date.now());
  };
  fetch("api/" + view + qs, { cache: "no-store" }).then((r) => r.json()).then((d) => { if (last === null) draw(d); })
    .catch(() => {});
  const source = new EventSource("events/" + view + qs);
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
  source.onmessage = (ev) => draw(JSON.parse(ev.data));
}

// ---- the swarm -----------------------------------------------------------------------------------------------
function swarmMap(me, peers) {
  const W = 520, H = 360, cx = W / 2, cy = H / 2, R = 130;
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, id: "swarm-map", role: "img" });
  const n = Math.max(peers.length, 1);
  const spots = peers.map((p, i) => {
    const a = (2 * Math.PI * i) / n - Math.PI / 2;
    return [p, cx + R * Math.cos(a), cy + R * Math.sin(a)];
  });
  for (const [p, x, y] of spots) {
    g.appendChild(sv("line", { x1: cx, y1: cy, x2: x, y2: y, class: "link " + String(p.state) }));
    const rtt = typeof p.rtt_ms === "number" ? p.rtt_ms.toFixed(1) + " ms" : "–";
    g.appendChild(sv("text", { x: (cx + x) / 2 + 4, y: (cy + y) / 2 - 4, class: "small" }, rtt));
  }
  g.appendChild(sv("circle", { cx, cy, r: 42, class: "node self" }));
  g.appendChild(sv("text", { x: cx, y: cy + 4, "text-anchor": "middle" }, short(me)));
  for (const [p, x, y] of spots) {
    g.appendChild(sv("circle", { cx: x, cy: y, r: 40, class: "node" }, sv("title", {}, String(p.device || ""))));
    g.appendChild(sv("text", { x, y: y + 4, "text-anchor": "middle", class: "peer-name" }, short(p.peer_id)));
    g.appendChild(sv("text", { x, y: y + 20, "text-anchor": "middle", class: "small " + stateCls(p.state) }, String(p.state)));
  }
  if (!peers.length) g.appendChild(sv("text", { x: cx, y: cy + 50, "text-anchor": "middle", class: "small" }, "no peers yet"));
  return g;
}

function renderSwarm(s) {
  const peers = Array.isArray(s.peers) ? s.peers : [];
  const jobs = Array.isArray(s.jobs) ? s.jobs : [];
  const membership = s.membership || {};
  main.append(el("h1", {}, "The swarm"));
  main.append(section("This device", "", kv([
    ["peer", String(s.peer_id)], ["hardware", String(s.device || "–")], ["version", String(s.version)], ["uptime", num(s.uptime_s, 0) + " s"],
    ["incarnation", String(membership.incarnation ?? "–")], ["health", String(membership.health ?? "–")],
    ["peer address", String((s.addresses || {}).peer || "–")], ["preset", String(s.preset)],
  ])));
  main.append(section("Links measured from this device (round trip)", "", swarmMap(s.peer_id, peers)));
  main.append(section("Devices", "wide", table(
    ["peer", "state", "incarnation", "round trip", "last heard", "address", "hardware"],
    peers.map((p) => [short(p.peer_id), el("td", { class: stateCls(p.state) }, String(p.state)), String(p.incarnation),
      typeof p.rtt_ms === "number" ? p.rtt_ms.toFixed(2) + " ms" : "–",
      typeof p.last_heard_s === "number" ? p.last_heard_s.toFixed(1) + " s ago" : "never",
      String(p.address || ""), String(p.device || "")]))));
  main.append(section("Jobs", "wide", jobs.length ? table(["job", "state", "step", "loss", "members", "role"],
    jobs.map((j) => [jobLink(j), el("td", { class: stateCls(j.state) }, String(j.state)), `${j.step} / ${j.total_steps}`,
      num(j.loss, 4), String((j.members || []).length), String(j.role) + (j.spare ? " (spare)" : "")]))
    : el("p", { class: "muted" }, "no jobs known")));
}

// ---- a job -----------------------------------------------------------------------------------------------------
// A wall-clock time as the dashboard writes it (UTC, like the checkpoints' titles): "13:04:05".
const utc = (at) => (typeof at === "number" && isFinite(at) ? new Date(at * 1000).toISOString().slice(11, 19) : "");

function lossChart(job) {
  const W = 720, H = 316, L = 52, Rm = 12, T = 12, B = 46;
  const times = Array.isArray(job.history_at) ? job.history_at : [];
  const train = (job.history || []).filter((p) => typeof p[1] === "number");
  const val = (job.val_history || []).filter((p) => typeof p[1] === "number");
  const all = train.concat(val);
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, id: "loss-chart", role: "img" });
  if (!all.length) {
    g.appendChild(sv("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "small" }, "no steps yet"));
    return g;
  }
  // the steps drawn (status JOB --json keeps the latest 200): the chart spans them, not the whole job
  const span = (train.length ? train : all).map((p) => p[0]);
  const x0 = Math.min(...span), x1 = Math.max(x0 + 1, ...span);
  const inside = (s) => typeof s === "number" && s >= x0 && s <= x1;
  const shown = train.concat(val.filter((p) => inside(p[0])));
  let y0 = Math.min(...shown.map((p) => p[1])), y1 = Math.max(...shown.map((p) => p[1]));
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = (s) => L + ((s - x0) / (x1 - x0)) * (W - L - Rm);
  const Y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  setAttrs(g, { "data-x0": x0, "data-x1": x1, "data-y0": y0, "data-y1": y1, "data-left": L, "data-right": W - Rm,
    "data-top": T, "data-bottom": H - B });
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4, y = Y(v);
    g.appendChild(sv("line", { x1: L, x2: W - Rm, y1: y, y2: y, class: "grid" }));
    g.appendChild(sv("text", { x: L - 6, y: y + 4, "text-anchor": "end", class: "small" }, v.toFixed(3)));
  }
  // the step axis, and under it the wall clock: when the daemon saw the drawn step nearest each tick
  const drawn = (job.history || []).map((p, i) => [p[0], times[i]]).filter((p) => typeof p[1] === "number");
  for (let i = 0; i <= 5; i++) {
    const s = Math.round(x0 + ((x1 - x0) * i) / 5), anchor = i === 5 ? "end" : i === 0 ? "start" : "middle";
    g.appendChild(sv("text", { x: X(s), y: H - B + 16, "text-anchor": anchor, class: "small" }, String(s)));
    if (!drawn.length) continue;
    const near = drawn.reduce((a, b) => (Math.abs(b[0] - s) < Math.abs(a[0] - s) ? b : a));
    g.appendChild(sv("text", { x: X(near[0]), y: H - B + 30, "text-anchor": anchor, class: "small time-tick",
      "data-step": near[0], "data-at": near[1] }, utc(near[1])));
  }
  g.appendChild(sv("text", { x: L - 6, y: H - B + 16, "text-anchor": "end", class: "small" }, "step"));
  if (drawn.length) g.appendChild(sv("text", { x: L - 6, y: H - B + 30, "text-anchor": "end", class: "small" }, "UTC"));
  g.appendChild(sv("line", { x1: L, x2: W - Rm, y1: H - B, y2: H - B, class: "axis" }));
  for (const r of job.recoveries || []) {
    if (!inside(r.lost_step)) continue;
    const from = Math.max(x0, typeof r.resumed_step === "number" && r.resumed_step >= 0 ? r.resumed_step : r.lost_step);
    g.appendChild(sv("rect", { x: X(from), y: T, width: Math.max(1, X(r.lost_step) - X(from)), height: H - T - B, class: "recovered" }));
    g.appendChild(sv("line", { x1: X(r.lost_step), x2: X(r.lost_step), y1: T, y2: H - B, class: "recovery", "data-step": r.lost_step },
      sv("title", {}, `recovery at step ${r.lost_step}: ${String(r.reason)}; resumed from ${r.resumed_step}`)));
  }
  // committed checkpoints from the job's record ({step, at}): every one, also those committed before the page opened
  for (const c of (job.checkpoints || []).filter((c) => c && inside(c.step))) {
    const when = typeof c.at === "number" && isFinite(c.at) ? " at " + new Date(c.at * 1000).toISOString().slice(11, 19) + " UTC" : "";
    g.appendChild(sv("line", { x1: X(c.step), x2: X(c.step), y1: T, y2: H - B, class: "ckpt", "data-step": c.step },
      sv("title", {}, `checkpoint ${c.step} committed${when}`)));
  }
  if (train.length) {
    const pts = train.map((p) => X(p[0]).toFixed(2) + "," + Y(p[1]).toFixed(2)).join(" ");
    g.appendChild(sv("polyline", { points: pts, class: "train", id: "train-curve", "data-count": train.length }));
  }
  for (const p of val.filter((v) => inside(v[0]))) g.appendChild(sv("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, class: "val" }, sv("title", {}, `validation ${p[1]} at ${p[0]}`)));
  g.appendChild(sv("text", { x: W - Rm, y: T + 10, "text-anchor": "end", class: "small" },
    "— train  ● validation  ┆ checkpoint  │ recovery"));
  return g;
}

function range(v) {
  if (Array.isArray(v)) return v.length === 2 ? `${v[0]}–${v[1]}` : v.join(",");
  return String(v ?? "");
}

// A stage's [start, end) blocks as every view writes them (arceusd/jobs/record/view.py block_range): "2-5" or "3".
function blockRange(v) {
  if (!Array.isArray(v) || v.length !== 2) return "?";
  return v[1] - 1 === v[0] ? `${v[0]}` : `${v[0]}-${v[1] - 1}`;
}

function planDrawing(job, me) {
  const plan = job.plan;
  if (!plan || !Array.isArray(plan.stages)) return el("p", { class: "muted" }, "no plan yet");
  const replicas = Array.isArray(plan.replicas) ? plan.replicas : [];
  if (replicas.length < 2) return pipelineDrawing(job, me, plan.stages, "plan");
  // data-parallel replicas: each a pipeline of its own, the same stage of all of them kept in sync
  const sync = plan.sync === "diloco" ? `DiLoCo: the replicas sync every ${plan.diloco_h} steps`
    : "gradients averaged across the replicas every step";
  const box = el("div", { id: "plan-replicas" },
    el("p", { class: "muted" }, `${replicas.length} data-parallel replicas · ${sync}`));
  replicas.forEach((r, i) => {
    box.append(el("p", { class: "small" }, `replica ${i}` + (i === 0 ? " (writes the checkpoints)" : "")));
    box.append(pipelineDrawing(job, me, r.stages || [], i === 0 ? "plan" : `plan-replica-${i}`));
  });
  return box;
}

function pipelineDrawing(job, me, stages, id) {
  const plan = job.plan;
  const rows = Math.max(1, ...stages.map((s) => (s.devices || []).length));
  const CW = 190, RH = 86, W = Math.max(520, stages.length * (CW + 16) + 16), H = 44 + rows * (RH + 8);
  // every device's measured compute against its waiting per step (the leader's record), on one scale
  const times = job.stage_times || {};
  const span = Math.max(1e-9, plan.predicted_step_time_s || 0, ...Object.values(times).map((t) =>
    Math.max((t.compute_s || 0) + (t.wait_s || 0), t.predicted_s || 0)));
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, id, role: "img" });
  stages.forEach((s, i) => {
    const x = 8 + i * (CW + 16);
    g.appendChild(sv("rect", { x, y: 4, width: CW, height: H - 8, rx: 6, class: "stage" }));
    g.appendChild(sv("text", { x: x + 8, y: 22 }, `stage ${s.index} · blocks ${blockRange(s.blocks)}`));
    if (i + 1 < stages.length) g.appendChild(sv("text", { x: x + CW + 2, y: H / 2, class: "small" }, "→"));
    const split = (s.devices || []).length > 1;
    (s.devices || []).forEach((d, j) => {
      const y = 34 + j * (RH + 8);
      const standby = d.peer_id === job.standby;
      g.appendChild(sv("rect", { x: x + 6, y, width: CW - 12, height: RH, rx: 4, class: "share" + (standby ? " standby" : "") },
        sv("title", {}, String(d.peer_id))));
      const tags = [d.peer_id === me ? "this device" : "", d.peer_id === job.owner ? "owner" : "", standby ? "standby" : ""].filter(Boolean);
      g.appendChild(sv("text", { x: x + 14, y: y + 17, class: "device-name" }, short(d.peer_id)));
      g.appendChild(sv("text", { x: x + 14, y: y + 32, class: "small" }, tags.join(" · ")));
      if (split) g.appendChild(sv("text", { x: x + 14, y: y + 47, class: "small" }, `heads ${range(d.heads)} · MLP ${range(d.mlp_columns)}`));
      g.appendChild(timingBar(times[d.peer_id], d.peer_id, x + 14, y + 52, CW - 28, span));
    });
  });
  return g;
}

function timingBar(t, peer, x, y, width, span) {
  // one device's median compute and link-wait seconds per step: a bar of each, the plan's prediction as a tick
  const g = sv("g", { class: "timing", "data-peer": peer });
  if (!t || typeof t.compute_s !== "number") {
    g.appendChild(sv("text", { x, y: y + 12, class: "small muted" }, "not measured yet (reports at checkpoints)"));
    return g;
  }
  const wait = typeof t.wait_s === "number" ? t.wait_s : 0, W = (s) => (width * Math.max(0, s)) / span;
  setAttrs(g, { "data-compute-s": t.compute_s, "data-wait-s": typeof t.wait_s === "number" ? t.wait_s : "" });
  g.appendChild(sv("text", { x, y: y + 11, class: "small timing-label" },
    `compute ${ms(t.compute_s)} · wait ${typeof t.wait_s === "number" ? ms(t.wait_s) : "–"}`));
  g.appendChild(sv("rect", { x, y: y + 16, height: 10, width: W(t.compute_s), class: "compute" }));
  g.appendChild(sv("rect", { x: x + W(t.compute_s), y: y + 16, height: 10, width: W(wait), class: "wait" }));
  if (typeof t.predicted_s === "number") {
    g.appendChild(sv("line", { x1: x + W(t.predicted_s), x2: x + W(t.predicted_s), y1: y + 13, y2: y + 29, class: "predicted-tick" },
      sv("title", {}, `predicted compute ${ms(t.predicted_s)}`)));
  }
  g.appendChild(sv("title", {}, `${String(peer)}: ${ms(t.compute_s)} compute, ${ms(t.wait_s)} waiting per step (medians)` +
    `; plan predicted ${ms(t.predicted_s)} compute` +
    (typeof t.seen_s === "number" ? `; seen by its neighbours: ${ms(t.seen_s)}` : "")));
  return g;
}

function stageTiming(job, me) {
  const plan = job.plan || {};
  const own = (job.stage_times || {})[me];  // the same medians the plan drawing shows for this device
  const t = own && typeof own.compute_s === "number" && typeof own.wait_s === "number" && own.compute_s + own.wait_s > 0
    ? { step_time_s: own.compute_s + own.wait_s, wait_fraction: own.wait_s / (own.compute_s + own.wait_s) } : job.stage_timing;
  const W = 520, H = 120, L = 150, maxS = Math.max(plan.predicted_step_time_s || 0, t ? t.step_time_s : 0, 1e-6);
  const X = (s) => ((W - L - 210) * s) / maxS;
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, id: "stage-timing", role: "img" });
  g.appendChild(sv("text", { x: 0, y: 26 }, "predicted (plan)"));
  g.appendChild(sv("rect", { x: L, y: 14, height: 16, width: X(plan.predicted_step_time_s || 0), class: "predicted" }));
  g.appendChild(sv("text", { x: L + X(plan.predicted_step_time_s || 0) + 4, y: 26, class: "small" },
    `${ms(plan.predicted_step_time_s)} · bubble ${num((plan.bubble_fraction || 0) * 100, 0)}%`));
  if (t) {
    const wait = t.step_time_s * t.wait_fraction, compute = t.step_time_s - wait;
    g.appendChild(sv("text", { x: 0, y: 62 }, "this device (measured)"));
    g.appendChild(sv("rect", { x: L, y: 50, height: 16, width: X(compute), class: "compute" }));
    g.appendChild(sv("rect", { x: L + X(compute), y: 50, height: 16, width: X(wait), class: "wait" }));
    g.appendChild(sv("text", { x: L + X(t.step_time_s) + 4, y: 62, class: "small" },
      `${ms(compute)} compute · ${ms(wait)} waiting`));
  } else {
    g.appendChild(sv("text", { x: 0, y: 62, class: "small" }, "this device has no measured steps in this plan yet"));
  }
  g.appendChild(sv("text", { x: 0, y: 100, class: "small" },
    "Every device's compute and waiting is drawn in its stage of the plan above."));
  return g;
}

function progress(job) {
  const total = job.total_steps || 0, pct = total ? Math.min(100, (100 * job.step) / total) : 0;
  return el("div", { class: "bar", title: `${job.step} / ${total}` }, el("div", { style: null, "data-pct": pct.toFixed(1) }));
}

// The leader's figures (arceusd.market.progress): spent, budget left, time and cost to finish; none elsewhere.
function costRows(c) {
  if (!c || typeof c !== "object") return [];
  const usd = (v) => (typeof v === "number" ? "$" + v.toFixed(6) : "–");
  return [
    ["spent", usd(c.spent_usd)],
    ["budget left", c.budget_usd ? usd(c.remaining_budget_usd) + " of " + usd(c.budget_usd) : "no budget set"],
    ["time to finish", typeof c.to_finish_s === "number" ? `${Math.round(c.to_finish_s)} s` : "–"],
    ["cost to finish", c.to_finish_usd == null ? "after the first paid checkpoint" : usd(c.to_finish_usd) +
      " (" + usd(c.at_finish_usd) + " in all)"],
  ];
}

function renderJob(job, me) {
  if (job.error && !job.job_id) {
    main.append(el("h1", {}, "No such job"), el("p", { class: "muted" }, "This daemon does not know that job."));
    return;
  }
  main.append(el("h1", {}, String(job.name), " ", el("span", { class: "muted" }, short(job.job_id))));
  const bar = progress(job);
  main.append(section("Progress", "", kv([
    ["state", el("span", { class: stateCls(job.state) }, String(job.state))],
    ["step", el("span", { id: "step" }, `${job.step} / ${job.total_steps}`)],
    ["train loss", num(job.loss, 4)], ["validation loss", num(job.val_loss, 4)],
    ["validation accuracy", num(job.val_accuracy, 4)],
    ["tokens/s", el("span", { id: "tokens" }, num(job.tokens_per_s, 0))], ["samples/s", num(job.samples_per_s, 1)],
    ["steps/s", num(job.steps_per_s, 2)], ["time left", job.eta_s == null ? "–" : `${Math.round(job.eta_s)} s`],
    ["learning rate", num(job.lr, 6)], ["epoch / term", `${job.epoch} / ${job.term}`],
    ["leader", short(job.leader)], ["standby", !job.standby ? "–" : short(job.standby) + (job.standby_note ? ` (${job.standby_note})` : "")],
    ["committed checkpoint", String(job.committed_step ?? "–")], ["model", `${job.model} on ${job.data}`],
    ...(job.spare ? [["this device", "spare: in no stage, paid nothing, takes a place if one is lost"]] : []),
    ...costRows(job.cost),
  ]), bar, job.error ? el("p", { class: "no" }, String(job.error)) : null));
  const fill = bar.firstChild; fill.style.width = fill.dataset.pct + "%";
  main.append(section(`Loss (${job.history_points} points of history, ${(job.history || []).length} drawn)`, "", lossChart(job),
    el("p", { class: "small" }, el("a", { href: "job/" + encodeURIComponent(String(job.job_id || "")) + "/loss.csv",
      id: "loss-csv", download: "" }, "download the loss history (CSV: step, time, loss, validation)"))));
  main.append(section("The plan: stages across devices", "wide", planDrawing(job, me),
    el("p", { class: "muted" }, job.plan ? `${job.plan.schedule}, ${job.plan.micro_batches} micro-batches` +
      (job.plan.in_flight_cap ? ` (at most ${Number(job.plan.in_flight_cap)} in flight, to fit memory)` : "") + "; " +
      "each device: median compute (solid) and link waiting (light) per step, the plan's predicted compute as a tick" : "")));
  main.append(section("Compute against waiting", "", stageTiming(job, me)));
  main.append(section("Recoveries", "", (job.recoveries || []).length ? table(["reason", "lost step", "resumed", "first step after"],
    job.recoveries.map((r) => [el("td", { class: "wrap" }, String(r.reason)), String(r.lost_step), String(r.resumed_step),
      typeof r.first_step_after_s === "number" ? r.first_step_after_s.toFixed(1) + " s" : "–"])) : el("p", { class: "muted" }, "none")));
  const links = Object.entries(job.links || {});
  main.append(section("Contributions", "", table(["device", "share", "steps", "TFLOP"],
    (job.contributions || []).map((c) => [short(c.peer_id), num(c.share, 3), String(c.steps), num(c.tflop, 4)]))));
  main.append(section("The leader's measured links", "", links.length ? table(["member", "round trip", "bandwidth", "message"],
    links.map(([p, m]) => [short(p), num(m.rtt_ms, 2) + " ms", num(m.bandwidth_mb_s, 1) + " MB/s", num(m.message_ms, 2) + " ms"]))
    : el("p", { class: "muted" }, "measured by the leader when it plans")));
}

// ---- the device owner ----------------------------------------------------------------------------------------
function termsTable(p) {
  // every term of the lending policy, what the machine (or the announced jobs) show now, and whether it holds
  return el("table", { id: "terms" }, el("thead", {}, el("tr", {}, ["term", "key", "now", "holds"].map((h) => el("th", {}, h)))),
    el("tbody", {}, (p.terms || []).map((t) => el("tr", { "data-key": String(t.key) },
      el("td", {}, String(t.asks)), el("td", { class: "muted" }, String(t.key)), el("td", { class: "wrap" }, String(t.now)),
      el("td", { class: "met " + (t.met === true ? "yes" : t.met === false ? "no" : "muted") },
        t.met === true ? "met" : t.met === false ? "not met" : "per job")))));
}

// The form that changes a term: drawn once, outside the redrawn page, so a redraw never takes what is typed.
let termEditor = null;
function termForm(keys) {
  if (termEditor) return termEditor;
  const select = el("select", { id: "term-key", name: "key" }, keys.map((k) => el("option", { value: k }, k)));
  const value = el("input", { id: "term-value", name: "value", maxlength: 400, autocomplete: "off",
    placeholder: "e.g. 10, true, [22, 7]" });
  const result = el("p", { id: "term-result", class: "muted", role: "status" },
    "Checked as `arceusd policy --set KEY=VALUE` checks it; a bad value changes nothing.");
  const form = el("form", { id: "term-form" }, select, " = ", value, " ", el("button", { type: "submit" }, "set"), result);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const body = new URLSearchParams({ key: select.value, value: value.value });
    fetch("policy", { method: "POST", body, cache: "no-store" })
      .then((r) => r.text().then((text) => { result.textContent = text; result.className = r.ok ? "yes" : "no"; }))
      .catch(() => { result.textContent = "the dashboard did not answer; nothing was changed"; result.className = "no"; });
  });
  termEditor = el("section", { id: "term-editor", class: "wide" }, el("h2", {}, "Change a term"), form);
  main.after(termEditor);
  return termEditor;
}

function machineChart(rows) {
  // this device's CPU use (all of it, and the owner's own) and memory in use over the last readings (the ring)
  const W = 520, H = 180, L = 40, Rm = 10, T = 10, B = 34;
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, width: W, id: "machine-chart", role: "img", "data-count": rows.length });
  if (rows.length < 2) {
    g.appendChild(sv("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "small" }, "collecting readings…"));
    return g;
  }
  const t0 = rows[0][0], t1 = Math.max(t0 + 1, rows[rows.length - 1][0]);
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - Rm), Y = (v) => T + (1 - v / 100) * (H - T - B);
  for (const v of [0, 50, 100]) {
    g.appendChild(sv("line", { x1: L, x2: W - Rm, y1: Y(v), y2: Y(v), class: "grid" }));
    g.appendChild(sv("text", { x: L - 4, y: Y(v) + 4, "text-anchor": "end", class: "small" }, v + "%"));
  }
  g.appendChild(sv("text", { x: L, y: H - B + 14, class: "small" }, utc(t0) + " UTC"));
  g.appendChild(sv("text", { x: W - Rm, y: H - B + 14, "text-anchor": "end", class: "small" }, utc(t1)));
  [[1, "cpu-all", "all CPU use"], [2, "cpu-owner", "the owner's own CPU"], [3, "memory", "memory in use"]].forEach(([i, cls, name], k) => {
    const pts = rows.filter((r) => typeof r[i] === "number").map((r) => X(r[0]).toFixed(1) + "," + Y(r[i]).toFixed(1));
    if (pts.length) g.appendChild(sv("polyline", { points: pts.join(" "), class: "series " + cls, "data-count": pts.length }));
    const last = rows.map((r) => r[i]).filter((v) => typeof v === "number").pop();
    g.appendChild(sv("text", { x: L + k * 160, y: H - 4, class: "small " + cls },
      `■ ${name} ${typeof last === "number" ? last.toFixed(0) + "%" : "not measured"}`));
  });
  return g;
}

function renderOwner(o) {
  main.append(el("h1", {}, "This device"));
  const p = o.policy;
  main.append(section("Lending terms", "wide", p ? [kv([
    ["lends now", el("span", { class: p.lends_now ? "yes" : "no", id: "lends-now" }, p.lends_now ? "yes" : "no")],
    ["why not", el("span", { class: "wrap" }, (p.reasons || []).join("; ") || "–")]]), termsTable(p)]
    : el("p", { class: "muted" }, "the market service is not running")));
  if (p) termForm(p.editable || []);
  main.append(section("CPU and memory", "", machineChart(Array.isArray(o.machine_samples) ? o.machine_samples : [])));
  const e = o.earnings;
  main.append(section("Earnings", "", e && !e.error ? [kv([["total", String(e.total_shown)],
    ["device-hours", String(e.device_hours_shown)], ["receipts", String(e.receipts_shown)]]),
  table(["job", "earned"], (e.by_job_shown || []).map(([j, u]) => [short(j), String(u)])),
  table(["day", "earned"], (e.by_day_shown || []).map(([d, u]) => [String(d), String(u)]))]
    : el("div", { class: "placeholder", id: "earnings" }, e && e.error ? String(e.error)
      : "No earnings yet: countersigned receipts appear here, by job and by day, once this device is paid for its work.")));
  main.append(section("Contributions", "wide", (o.contributions || []).length ? table(["job", "state", "share", "steps", "TFLOP"],
    o.contributions.map((c) => [jobLink(c), String(c.state), num(c.share, 3), String(c.steps), num(c.tflop, 4)]))
    : el("p", { class: "muted" }, "this device has not worked on a job yet")));
}

// ---- the market ----------------------------------------------------------------------------------------------
function renderMarket(m) {
  main.append(el("h1", {}, "The market"));
  const market = m.market;
  if (market) {
    const d = market.device || {};
    main.append(section("This device's offer", "", kv([["kind", String(d.kind)], ["memory", num((d.memory_bytes || 0) / 2 ** 30, 1) + " GiB"],
      ["compute", num((d.flops_per_s || 0) / 1e9, 1) + " GFLOP/s"],
      ...Object.entries(market.demand_shown || {}).map(([k, v]) => [k.replace(/_/g, " "), String(v)])])));
  }
  const rows = market ? market.jobs || [] : [];
  main.append(section("Announced jobs", "wide", rows.length ? table(
    ["job", "owner", "state", "members", "highest price /h", "asking /h", "qualifies", "why not"],
    // prices and counts come written from the server, as `arceusd market` writes them (arceusd/jobs/record/view.py)
    rows.map((j) => [jobLink(j), short(j.owner), String(j.state), String(j.members_shown),
      el("td", { class: "max-price" }, String(j.max_price_shown)), el("td", { class: "price" }, String(j.price_shown)),
      el("td", { class: j.qualifies ? "yes" : "no" }, j.qualifies ? "yes" : "no"), (j.reasons || []).join("; ")]))
    : el("p", { class: "muted" }, market ? "no jobs announced by others" : "the market service is not running")));
  const unpaid = market ? market.left_unpaid || [] : [];
  if (unpaid.length) {
    main.append(section("Jobs left unpaid", "wide", table(["job", "owner", "unpaid checkpoints", "why"],
      unpaid.map((u) => [short(u.job_id), short(u.owner), (u.unpaid_checkpoints || []).join(", "), String(u.reason)]))));
  }
}

// ---- routing -------------------------------------------------------------------------------------------------
const page = body.dataset.page;
if (page === "job") {
  let me = null;
  fetch("api/swarm", { cache: "no-store" }).then((r) => r.json()).then((s) => { me = s.peer_id; }).catch(() => {});
  connect("job", "id=" + encodeURIComponent(body.dataset.job || ""), (job) => renderJob(job, me));
} else if (page === "owner") {
  connect("owner", "", renderOwner);
} else if (page === "market") {
  connect("market", "", renderMarket);
} else {
  connect("swarm", "", renderSwarm);
}
