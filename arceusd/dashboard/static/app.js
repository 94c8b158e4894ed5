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
      num(j.loss, 4), String((j.members || []).length), String(j.role)])) : el("p", { class: "muted" }, "no jobs known")));
}

// ---- a job -----------------------------------------------------------------------------------------------------
function lossChart(job) {
  const W = 720, H = 300, L = 52, Rm = 12, T = 12, B = 30;
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
  for (let i = 0; i <= 5; i++) {
    const s = Math.round(x0 + ((x1 - x0) * i) / 5);
    g.appendChild(sv("text", { x: X(s), y: H - B + 16, "text-anchor": i === 5 ? "end" : "middle", class: "small" }, String(s)));
  }
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

// A stage's [start, end) blocks as every view writes them (arceusd/jobs/view.py block_range): "2-5" or "3".
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
    ["leader", short(job.leader)], ["standby", !job.standby ? "–" : ["done", "failed", "cancelled"].includes(job.state) ? short(job.standby)
      : short(job.standby) + (job.standby_ready ? " (ready)" : " (syncing)")],
    ["committed checkpoint", String(job.committed_step ?? "–")], ["model", `${job.model} on ${job.data}`],
  ]), bar, job.error ? el("p", { class: "no" }, String(job.error)) : null));
  const fill = bar.firstChild; fill.style.width = fill.dataset.pct + "%";
  main.append(section(`Loss (${job.history_points} points of history, ${(job.history || []).length} drawn)`, "", lossChart(job)));
  main.append(section("The plan: stages across devices", "wide", planDrawing(job, me),
    el("p", { class: "muted" }, job.plan ? `${job.plan.schedule}, ${job.plan.micro_batches} micro-batches; ` +
      "each device: median compute (solid) and link waiting (light) per step, the plan's predicted compute as a tick" : "")));
  main.append(section("Compute against waiting", "", stageTiming(job, me)));
  main.append(section("Recoveries", "", (job.recoveries || []).length ? table(["reason", "lost step", "resumed", "first step after"],
    job.recoveries.map((r) => [String(r.reason), String(r.lost_step), String(r.resumed_step),
      typeof r.first_step_after_s === "number" ? r.first_step_after_s.toFixed(1) + " s" : "–"])) : el("p", { class: "muted" }, "none")));
  const links = Object.entries(job.links || {});
  main.append(section("Contributions", "", table(["device", "share", "steps", "TFLOP"],
    (job.contributions || []).map((c) => [short(c.peer_id), num(c.share, 3), String(c.steps), num(c.tflop, 4)]))));
  main.append(section("The leader's measured links", "", links.length ? table(["member", "round trip", "bandwidth", "message"],
    links.map(([p, m]) => [short(p), num(m.rtt_ms, 2) + " ms", num(m.bandwidth_mb_s, 1) + " MB/s", num(m.message_ms, 2) + " ms"]))
    : el("p", { class: "muted" }, "measured by the leader when it plans")));
}

// ---- the device owner ----------------------------------------------------------------------------------------
function renderOwner(o) {
  main.append(el("h1", {}, "This device"));
  const p = o.policy;
  main.append(section("Lending policy", "", p ? kv([
    ["lends now", el("span", { class: p.lends_now ? "yes" : "no" }, p.lends_now ? "yes" : "no")],
    ["why not", (p.reasons || []).join("; ") || "–"],
    ...Object.entries(p.machine || {}).map(([k, v]) => [k.replace(/_/g, " "), String(v)]),
  ]) : el("p", { class: "muted" }, "the market service is not running")));
  const e = o.earnings;
  main.append(section("Earnings", "", e && !e.error ? [kv([["total", "$" + num(e.total_usd, 4)],
    ["device-hours", num(e.device_hours, 3)], ["receipts", String(e.receipts)]]),
  table(["job", "earned"], Object.entries(e.by_job || {}).map(([j, u]) => [short(j), "$" + num(u, 4)])),
  table(["day", "earned"], Object.entries(e.by_day || {}).map(([d, u]) => [String(d), "$" + num(u, 4)]))]
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
    const d = market.device || {}, dem = market.demand || {};
    main.append(section("This device's offer", "", kv([["kind", String(d.kind)], ["memory", num((d.memory_bytes || 0) / 2 ** 30, 1) + " GiB"],
      ["compute", num((d.flops_per_s || 0) / 1e9, 1) + " GFLOP/s"],
      ...Object.entries(dem).map(([k, v]) => [k.replace(/_/g, " "), typeof v === "number" ? num(v, 3) : String(v)])])));
  }
  const rows = market ? market.jobs || [] : [];
  main.append(section("Announced jobs", "wide", rows.length ? table(
    ["job", "owner", "state", "members", "highest price /h", "asking /h", "qualifies", "why not"],
    rows.map((j) => [jobLink(j), short(j.owner), String(j.state), `${j.members}${j.max_members ? " / " + j.max_members : ""}`,
      j.max_price_per_hour ? "$" + num(j.max_price_per_hour, 4) + "/h" : "any", "$" + num(j.price_per_hour, 4) + "/h",
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
