// stead run viewer: agents, runs as waterfalls of steps and child runs, conversations with live updates.
// Plain JavaScript, no build step, no dependency. Data comes from the service's REST API; live updates
// from its resumable event streams (EventSource resends Last-Event-ID on its own reconnects; after a
// reload the viewer passes ?after= with the last id it kept).
"use strict";

const EVENT_TYPES = [
  "activated", "message_consumed", "block_end", "block_reset", "tool_started", "tool_finished",
  "usage", "approval_requested", "approval_decided", "settled", "text_delta", "reasoning_delta", "reset",
  "done",
];
const WORKING = new Set(["running", "awaiting_input"]);  // run statuses that are not settled

let cleanup = [];            // what the current view must close when it is left
const expanded = new Set();  // step ids whose details are open

// ---------------------------------------------------------------------------------------------- helpers
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "data") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v; // CSSOM, not an inline style attribute: allowed by the CSP
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmtDur(seconds) {
  if (seconds === null || seconds === undefined) return "…";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  return `${Math.floor(seconds / 60)} m ${Math.round(seconds % 60)} s`;
}
function fmtTime(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString() : ""; }
function fmtCost(c) { return c ? `$${c.toFixed(4)}` : "—"; }
function fmtTokens(i, o) { return `${i ?? 0}/${o ?? 0} tok`; }
function status(s) { return h("span", { class: `status ${s}` }, s); }
function newId() {  // a retry-safe message id (lowercase letter, then 23 base-36 characters)
  const bytes = crypto.getRandomValues(new Uint8Array(23));
  return "v" + Array.from(bytes, (b) => (b % 36).toString(36)).join("");
}

class Unauthorized extends Error {}

async function api(path, opts = {}) {
  const init = { method: opts.method || "GET", credentials: "same-origin", headers: { Accept: "application/json" } };
  if (opts.body !== undefined) {
    init.body = JSON.stringify(opts.body);
    init.headers["Content-Type"] = "application/json";
  }
  if (init.method !== "GET") init.headers["X-Stead-Request"] = "1";  // writes with the session cookie
  const r = await fetch(path, init);
  if (r.status === 401) { showLogin(); throw new Unauthorized(); }
  const data = r.status === 204 ? null : await r.json();
  if (!r.ok) {
    const err = new Error((data && data.detail) || r.statusText);
    err.problem = data;
    throw err;
  }
  return data;
}

function stream(path, handlers) {
  const es = new EventSource(path, { withCredentials: true });
  for (const type of EVENT_TYPES) {
    es.addEventListener(type, (e) => {
      const data = e.data ? JSON.parse(e.data) : null;
      const fn = handlers[type] || handlers["*"];
      if (fn) fn(data, e.lastEventId, type);
    });
  }
  cleanup.push(() => es.close());
  return es;
}

const main = () => document.getElementById("main");
function show(...nodes) { main().replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false)); }

// ---------------------------------------------------------------------------------------------- login
function showLogin() {
  const form = document.getElementById("login").content.cloneNode(true);
  show(form);
  document.getElementById("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = document.getElementById("token").value;
    const r = await fetch("/v1/sessions", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }),
    });
    if (r.ok) { start(); } else {
      document.getElementById("login-error").textContent = "That token is not valid.";
    }
  });
}

// ---------------------------------------------------------------------------------------------- agents
async function loadAgents() {
  const page = await api("/v1/agents?limit=100");
  const current = location.hash.startsWith("#/agents/") ? location.hash.slice(9) : null;
  document.getElementById("agents").replaceChildren(...page.items.map((a) =>
    h("li", {}, h("a", { href: `#/agents/${a.id}`, class: a.id === current ? "current" : null, data: { agent: a.id } },
      h("span", { class: a.active ? "dot on" : "dot" }),
      h("span", {}, a.name || "agent", h("br"), h("small", {}, a.id.slice(0, 12))),
    ))));
}

// ---------------------------------------------------------------------------------------------- approvals
// A pending approval is a card with Approve / Deny; the decision is POSTed once (the service decides once:
// a decision made elsewhere first shows as the stored one). Live `approval_decided` events update cards.
const DECIDED = { approved: "approved", rejected: "denied", expired: "expired", cancelled: "cancelled" };

function markDecided(card, status, note, by) {
  card.className = `approval ${status}`;
  card.dataset.status = status;
  const actions = card.querySelector(".actions");
  if (actions) actions.remove();
  card.querySelector(".who").textContent = "approval";
  card.querySelector(".approval-state").textContent =
    (DECIDED[status] || status) + (by ? ` by ${by}` : "") + (note ? ` — ${note}` : "");
}

function approvalCard(a) {
  const state = h("span", { class: "approval-state" }, "waiting for a decision");
  const reason = h("input", { class: "approval-reason", placeholder: "reason (optional)", maxlength: "4000" });
  const approve = h("button", { class: "approve" }, "Approve");
  const deny = h("button", { class: "deny secondary" }, "Deny");
  const card = h("div", { class: `approval ${a.status}`, data: { approval: a.id, status: a.status } },
    h("span", { class: "who" }, "approval needed"),
    h("div", { class: "mono" }, `${a.tool}(${JSON.stringify(a.arguments)})`),
    a.reason ? h("div", { class: "muted" }, a.reason) : null,
    a.status === "pending" ? h("div", { class: "actions" }, reason, approve, deny) : null,
    state);
  if (a.status !== "pending") markDecided(card, a.status, a.note, a.decided_by);
  const decide = async (decision) => {
    approve.disabled = deny.disabled = true;
    state.textContent = "deciding…";
    try {
      const out = await api(`/v1/approvals/${encodeURIComponent(a.id)}/decision`,
        { method: "POST", body: { decision, reason: reason.value.trim() || undefined } });
      markDecided(card, out.approval.status, out.approval.note, out.approval.decided_by);
    } catch (e) {
      if (e.problem && e.problem.code === "approval_decided") {
        const stored = await api(`/v1/approvals/${encodeURIComponent(a.id)}`);
        markDecided(card, stored.status, stored.note, stored.decided_by);
      } else {
        approve.disabled = deny.disabled = false;
        state.textContent = `not decided: ${e.message}`;
      }
    }
  };
  approve.addEventListener("click", () => decide("approve"));
  deny.addEventListener("click", () => decide("deny"));
  return card;
}

function requestedApproval(d) {  // an `approval_requested` event as an approval card's input
  return { id: d.approval_id, tool: d.call.name, arguments: d.call.arguments, reason: d.reason, status: "pending" };
}

async function approvalsOf(query) {  // [] when approvals are off or the token may not read them
  try { return (await api(`/v1/approvals?${query}&limit=100`)).items; }
  catch (e) { if (e instanceof Unauthorized) throw e; return []; }
}

// ---------------------------------------------------------------------------------------------- runs
async function runsView() {
  const page = await api("/v1/runs?roots=true&limit=50");
  const rows = page.items.map((r) => h("tr", { class: "link", data: { run: r.id }, onclick: () => { location.hash = `#/runs/${r.id}`; } },
    h("td", {}, r.agent_name || r.agent_id.slice(0, 12)),
    h("td", {}, status(r.status)),
    h("td", {}, fmtTime(r.started_at)),
    h("td", {}, fmtDur(r.duration)),
    h("td", {}, fmtTokens(r.input_tokens, r.output_tokens)),
    h("td", {}, fmtCost(r.cost)),
    h("td", { class: "mono" }, r.id),
  ));
  show(
    h("h1", {}, "Runs"),
    page.items.length === 0 ? h("p", { class: "muted" }, "No runs yet.") :
      h("table", { class: "runs" },
        h("thead", {}, h("tr", {}, ["agent", "status", "started", "duration", "tokens", "cost", "run"].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows)),
  );
  if (page.items.some((r) => r.status === "running")) {
    const timer = setTimeout(() => route(), 2000);
    cleanup.push(() => clearTimeout(timer));
  }
}

function walk(run, out = []) { out.push(run); for (const c of run.children) walk(c, out); return out; }

function stepDetail(step) {
  const block = (title, value) => value === null || value === undefined ? null :
    [h("h4", {}, title), h("pre", {}, typeof value === "string" ? value : JSON.stringify(value, null, 2))];
  return h("div", { class: "detail" },
    block("input", step.input), block("output", step.output), block("error", step.error),
    h("div", { class: "muted mono" }, `step ${step.id} · ${step.status} · started ${fmtTime(step.started_at)}`));
}

function waterfall(tree) {
  const runs = walk(tree);
  const now = Date.now() / 1000;
  const t0 = tree.started_at;
  let t1 = t0;
  for (const r of runs) {
    t1 = Math.max(t1, r.completed_at || now);
    for (const s of r.steps) t1 = Math.max(t1, s.completed_at || now);
  }
  const span = Math.max(t1 - t0, 1e-3);
  const bar = (start, end, cls) => {
    const left = ((start - t0) / span) * 100;
    const width = Math.max((((end || now) - start) / span) * 100, 0.4);
    return h("div", { class: "track" }, h("div", { class: `bar ${cls}`, style: `left:${left}%;width:${width}%` }));
  };
  const rows = [];
  const placed = new Set();
  const addRun = (run, depth) => {
    placed.add(run.id);
    const pad = `padding-left:${10 + depth * 18}px`;
    rows.push(h("div", { class: "row run", data: { run: run.id } },
      h("div", { class: "label", style: pad }, status(run.status), " ", run.agent_name || run.agent_id,
        run.error ? h("span", { class: "error" }, ` — ${run.error}`) : null),
      bar(run.started_at, run.completed_at, `run ${run.status}`),
      h("div", { class: "meta" }, `${fmtDur(run.duration)} · ${fmtTokens(run.input_tokens, run.output_tokens)} · ${fmtCost(run.cost)}`)));
    const children = new Map(run.children.map((c) => [c.id, c]));
    for (const step of run.steps) {
      const usage = step.output && step.output.usage;
      const name = (step.name || step.target || "").split(": ").pop();
      const open = expanded.has(step.id);
      const row = h("div", { class: "row step", data: { step: step.id, type: step.type, status: step.status },
        onclick: () => { if (expanded.has(step.id)) expanded.delete(step.id); else expanded.add(step.id); route(true); } },
        h("div", { class: "label", style: `padding-left:${22 + depth * 18}px` },
          h("span", { class: "kind" }, `${step.number}. ${step.type}`), " ", name,
          step.target && step.type === "prompt" ? h("span", { class: "muted" }, ` (${step.target})`) : null,
          step.error ? h("span", { class: "error" }, ` — ${step.error}`) : null),
        bar(step.started_at, step.completed_at, `${step.type} ${step.status}`),
        h("div", { class: "meta" }, fmtDur(step.duration),
          usage ? ` · ${fmtTokens(usage.input_tokens, usage.output_tokens)} · ${fmtCost(usage.cost)}` : ""));
      rows.push(row);
      if (open) rows.push(stepDetail(step));
      const child = step.target_run_id && children.get(step.target_run_id);
      if (child) addRun(child, depth + 1);
    }
    for (const c of run.children) if (!placed.has(c.id)) addRun(c, depth + 1);
  };
  addRun(tree, 0);
  return h("div", { class: "waterfall" }, rows);
}

let runState = null;  // {id, tree, following: Map}

async function runView(id, rerender) {
  if (!rerender || !runState || runState.id !== id) {
    const tree = await api(`/v1/runs/${id}/tree`);
    const approvals = await approvalsOf(`status=all&root_run_id=${encodeURIComponent(id)}`);
    runState = { id, tree, approvals, following: new Map(), pending: null, cards: new Map() };
  }
  // Approval cards survive re-renders (every live event re-renders the run): a new card per render would
  // drop a reason being typed, and a click whose mousedown hit the old button and mouseup the new one
  // would be no click at all. A card decided elsewhere is marked in place.
  const cards = runState.approvals.map((a) => {
    let card = runState.cards.get(a.id);
    if (!card) {
      card = approvalCard(a);
      runState.cards.set(a.id, card);
    } else if (a.status !== "pending" && card.dataset.status === "pending") {
      markDecided(card, a.status, a.note, a.decided_by);
    }
    return card;
  });
  const tree = runState.tree;
  const runs = walk(tree);
  const steps = runs.reduce((n, r) => n + r.steps.length, 0);
  show(
    h("h1", {}, `Run of ${tree.agent_name || tree.agent_id}`, " ", status(tree.status),
      runs.some((r) => WORKING.has(r.status)) ? h("span", { class: "live" }, "● live") : null),
    h("div", { class: "summary" },
      [["duration", fmtDur(tree.duration)], ["tokens in/out", `${tree.input_tokens}/${tree.output_tokens}`],
        ["cost", fmtCost(tree.cost)], ["steps", steps], ["child runs", runs.length - 1],
        ["agent", h("a", { href: `#/agents/${tree.agent_id}` }, tree.agent_id.slice(0, 12))]]
        .map(([k, v]) => h("div", {}, h("b", {}, v), h("span", {}, k)))),
    cards.length ? h("div", { class: "approvals", id: "approvals" }, cards) : null,
    waterfall(tree),
    tree.final_message ? [h("h4", {}, "final message"), h("div", { class: "msg" }, tree.final_message)] : null,
  );
  // follow every run of the tree that is still running (each stream ends with `done`)
  for (const r of runs) {
    if (!WORKING.has(r.status) || runState.following.has(r.id)) continue;
    const key = `stead.run.${r.id}`;
    const after = sessionStorage.getItem(key) || "0";
    const state = runState;
    const es = stream(`/v1/runs/${r.id}/events?after=${encodeURIComponent(after)}`, {
      "*": (data, lastId, type) => {
        if (lastId && !lastId.includes(".")) sessionStorage.setItem(key, lastId);
        if (type === "done") { es.close(); }
        refreshRun(state);
      },
    });
    runState.following.set(r.id, es);
  }
}

function refreshRun(state) {
  if (state !== runState || state.pending) return;
  state.pending = setTimeout(async () => {
    state.pending = null;
    if (state !== runState) return;
    state.tree = await api(`/v1/runs/${state.id}/tree`);
    state.approvals = await approvalsOf(`status=all&root_run_id=${encodeURIComponent(state.id)}`);
    runView(state.id, true);
  }, 120);
}

// ---------------------------------------------------------------------------------------------- conversation
function blockNodes(block) {
  if (block.type === "text") return [block.text];
  if (block.type === "reasoning") return [h("span", { class: "muted" }, `(thinking) ${block.text}`)];
  if (block.type === "tool_call") return [h("span", { class: "chip" }, `→ ${block.name}(${JSON.stringify(block.arguments)})`)];
  if (block.type === "tool_result") return [h("span", { class: "chip" }, `${block.is_error ? "✗" : "←"} ${block.output}`)];
  return [];
}

function messageNode(m) {
  return h("div", { class: `msg ${m.role}`, data: { id: m.id || "" } },
    h("span", { class: "who" }, m.role), m.content.flatMap(blockNodes));
}

async function agentView(id) {
  const agent = await api(`/v1/agents/${id}`);
  const history = await api(`/v1/agents/${id}/messages?limit=500`);
  const runs = await api(`/v1/runs?agent_id=${encodeURIComponent(id)}&limit=20`);
  const waiting = await approvalsOf(`status=pending&agent_id=${encodeURIComponent(id)}`);
  const conversation = h("div", { class: "conversation", id: "conversation" },
    history.items.map(messageNode), waiting.map(approvalCard));
  const addApproval = (a) => {
    if (!a.id || conversation.querySelector(`.approval[data-approval="${CSS.escape(a.id)}"]`)) return;
    conversation.append(approvalCard(a));
  };
  const input = h("textarea", { id: "message", placeholder: "Message… (Enter sends, Shift+Enter: new line)" });
  const send = async (mode) => {
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    const mid = newId();
    conversation.append(h("div", { class: "msg user queued", data: { id: mid } }, h("span", { class: "who" }, `${mode} · queued`), text));
    try { await api(`/v1/agents/${id}/messages`, { method: "POST", body: { id: mid, mode, content: text } }); }
    catch (e) { conversation.append(h("div", { class: "msg system error" }, `not sent: ${e.message}`)); }
  };
  input.addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send("send"); } });
  const runList = h("ul", { id: "agent-runs" }, runs.items.map((r) =>
    h("li", {}, status(r.status), " ", h("a", { href: `#/runs/${r.id}` }, fmtTime(r.started_at)), ` · ${fmtDur(r.duration)}`)));
  show(
    h("h1", {}, agent.name || "agent", " ", h("span", { class: "muted mono" }, agent.id),
      h("span", { class: "live", id: "state" }, agent.state)),
    h("div", { class: "chat" },
      h("div", {}, conversation,
        h("div", { class: "composer" }, input,
          h("button", { id: "send", onclick: () => send("send") }, "Send"),
          h("button", { id: "steer", class: "secondary", onclick: () => send("steer"), title: "Reaches the model at its next boundary" }, "Steer"))),
      h("div", { class: "side" },
        h("h3", {}, "model"), h("p", { class: "mono" }, `${agent.provider}:${JSON.stringify(agent.model)}`),
        h("h3", {}, "runs"), runList)),
  );
  let streaming = null;
  let assistant = null;  // the assistant bubble of the current inference
  let inference = null;
  const scroll = () => conversation.lastElementChild && conversation.lastElementChild.scrollIntoView({ block: "nearest" });
  const setState = (s) => { document.getElementById("state").textContent = s; };
  stream(`/v1/agents/${id}/events?deltas=true&after=${agent.event_seq}`, {
    activated: () => setState("working"),
    message_consumed: (d) => {
      const queued = conversation.querySelector(`.msg.queued[data-id="${CSS.escape(d.message.id || "")}"]`);
      const node = messageNode(d.message);
      if (queued) queued.replaceWith(node); else conversation.append(node);
      assistant = null;
      scroll();
    },
    text_delta: (d) => {
      if (!streaming) {
        streaming = h("div", { class: "msg assistant streaming" }, h("span", { class: "who" }, "assistant"));
        conversation.append(streaming);
      }
      streaming.append(d.text);
      scroll();
    },
    block_reset: () => { if (streaming) streaming.remove(); streaming = null; },
    block_end: (d) => {
      if (streaming) { streaming.remove(); streaming = null; }
      if (!assistant || inference !== d.inference_id) {
        assistant = h("div", { class: "msg assistant" }, h("span", { class: "who" }, "assistant"));
        conversation.append(assistant);
        inference = d.inference_id;
      }
      assistant.append(...blockNodes(d.block));
      scroll();
    },
    approval_requested: (d) => { addApproval(requestedApproval(d)); setState("waiting"); scroll(); },
    approval_decided: (d) => {
      const card = d.approval_id && conversation.querySelector(`.approval[data-approval="${CSS.escape(d.approval_id)}"]`);
      if (card && card.dataset.status === "pending") markDecided(card, d.decision, d.note);
      if (d.decision === "approved") setState("working");
    },
    tool_finished: (d) => {
      conversation.append(h("div", { class: "msg tool" }, h("span", { class: "who" }, `tool ${d.call.name}`),
        ...blockNodes({ type: "tool_result", ...d.result })));
      assistant = null;
      scroll();
    },
    settled: (d) => {
      setState("idle");
      if (d.status === "failed") conversation.append(h("div", { class: "msg system" }, `The run failed: ${d.error}`));
      api(`/v1/runs?agent_id=${encodeURIComponent(id)}&limit=20`).then((page) => {
        runList.replaceChildren(...page.items.map((r) =>
          h("li", {}, status(r.status), " ", h("a", { href: `#/runs/${r.id}` }, fmtTime(r.started_at)), ` · ${fmtDur(r.duration)}`)));
      });
      loadAgents();
    },
    reset: () => route(),
  });
}

// ---------------------------------------------------------------------------------------------- routing
async function route(rerender) {
  if (!rerender) { for (const fn of cleanup) fn(); cleanup = []; runState = null; }
  const hash = location.hash || "#/runs";
  try {
    if (hash.startsWith("#/runs/")) await runView(decodeURIComponent(hash.slice(7)), rerender);
    else if (hash.startsWith("#/agents/")) await agentView(decodeURIComponent(hash.slice(9)));
    else await runsView();
    if (!rerender) loadAgents();
  } catch (e) {
    if (!(e instanceof Unauthorized)) show(h("p", { class: "error" }, e.message));
  }
}

async function start() {
  try {
    const me = await api("/v1/session");
    document.getElementById("who").textContent = me.auth_required ? `tenant ${me.tenant}` : "no authentication (loopback)";
  } catch (e) { return; }
  window.onhashchange = () => route();
  route();
}

start();
