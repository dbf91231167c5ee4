// One session: a headline of what it saved, timeline, turns, compactions with their manifests
// (collapsed; each shows only the cuts earlier ones did not), durable state, its conversations
// (the main one and its agents, parent -> child) and each one's transcript (one line an event,
// opened on demand). A 30-turn session fits in about three screens.
import { admin, ApiError, enc, whoami } from "./api.js";
import { chart } from "./chart.js";
import { append, clear, fmtInt, fmtMoney, fmtPct, fmtTime, fmtUsd, h, message } from "./dom.js";
import { card, unpricedNote } from "./overview.js";

const MAX_ROWS = 5000;
const MAX_MANIFESTS = 50;
const TRANSCRIPT_PAGE = 20;

function section(title, ...children) {
  return h("section", { "aria-label": title }, h("h2", {}, title), ...children);
}

async function ledgerRows(session) {
  const rows = [];
  let after = null;
  for (;;) {
    const page = await admin("/usage", { session, after, limit: 500 });
    rows.push(...page.rows);
    if (page.next_after === null || page.next_after === undefined || rows.length >= MAX_ROWS) return rows;
    after = page.next_after;
  }
}

export async function sessionPage(view, id) {
  document.title = "Session · context-proxy console";
  const base = "/sessions/" + enc(id);
  // Whether the session exists, from the tenant's own list (another tenant's session is simply
  // not in it: the page is the same as for an id that names nothing).
  const known = (await admin("/sessions")).sessions;
  if (!known.includes(id)) {
    document.title = "Session not found · context-proxy console";
    view.append(h("h1", {}, "Session not found"),
      message("error", "There is no session with this id in your tenant."));
    return;
  }
  const state = await admin(base + "/state");
  document.title = `Session ${id} · context-proxy console`;
  view.append(h("h1", {}, "Session ", h("code", {}, id)));
  const viewer = sourceViewer(base);

  const rows = (await whoami()).ledger ? await ledgerRows(id) : null;
  if (rows === null) {
    view.append(message("notice",
      "The usage ledger is not available on this proxy (no /admin/v1/usage): no timeline, turns or compactions."));
  } else {
    append(view, [await headline(id, rows), timeline(rows), turns(rows)]);
    view.append(await compactions(base, rows, viewer));
  }
  view.append(await durable(base, state, viewer));
  view.append(viewer.element);
  const log = transcriptView(base);
  view.append(await conversations(base, log));
  view.append(log.element);
  await log.show("");
}

// --- the headline: what the session saved ---------------------------------------------------

// The session's totals as the ledger defines them (/usage/summary for this session, over the
// whole time it has calls): tokens and dollars saved, the share of input, compactions.
async function headline(id, rows) {
  if (!rows.length) return null;
  const first = Math.floor(Math.min(...rows.map((r) => Date.parse(r.at))) / 1000) * 1000;
  const until = Math.ceil((Date.now() + 60000) / 60000) * 60000;
  const bucket = Math.max(1, Math.ceil((until - first) / 1000));
  const data = await admin("/usage/summary", {
    session: id, since: new Date(first).toISOString(), until: new Date(until).toISOString(), bucket,
  });
  const t = data.totals;
  const cost = t.cost_usd ? t.cost_usd.total : null;
  const without = cost !== null && t.savings_usd !== null ? cost + t.savings_usd : null;
  return h("section", { class: "headline", "aria-label": "What this session saved" },
    h("div", { class: "cards" },
      card("Tokens saved", "tokens_saved", fmtInt(t.tokens_saved),
        `${fmtPct(t.tokens_saved_ratio)} of input: ${fmtInt(t.tokens_before)} before compaction, ${fmtInt(t.tokens_after)} after`, t.tokens_saved),
      card("Dollars saved", "savings_usd", fmtMoney(t, t.savings_usd),
        without === null ? null : `it cost ${fmtUsd(cost)} instead of ${fmtUsd(without)}`, t.savings_usd),
      card("Share of input saved", "tokens_saved_ratio", fmtPct(t.tokens_saved_ratio), "tokens saved / tokens before compaction", t.tokens_saved_ratio),
      card("Compactions", "compaction_events", fmtInt(t.compaction_events),
        `${fmtInt(t.client_calls)} requests, ${fmtInt(t.summary_calls)} summary calls, ${fmtInt(t.errors)} errors`, t.compaction_events)),
    unpricedNote(t));
}

// --- timeline and turns ---------------------------------------------------------------------

function timeline(rows) {
  const client = rows.filter((r) => r.kind === "client");
  const labels = client.map((_, i) => String(i + 1));
  const markers = [];
  client.forEach((r, i) => {
    if (r.compaction_id && r.plan === "new") markers.push({ index: i, label: `compaction ${r.compaction_id} at turn ${i + 1}` });
  });
  const u = (r, k) => (r.usage ? r.usage[k] || 0 : 0);
  if (!client.length) return section("Timeline", message("notice", "No request of this session is in the usage ledger."));
  return section("Timeline", h("div", { class: "pair" },
    chart({
      title: "Tokens before and after compaction per turn",
      labels,
      markers,
      integer: true,
      series: [
        { key: "tokens_before", label: "tokens before", kind: "line", values: client.map((r) => r.tokens_before || 0) },
        { key: "tokens_after", label: "tokens after", kind: "line", values: client.map((r) => r.tokens_after || 0) },
      ],
    }),
    chart({
      title: "Prompt cache reads and writes per turn",
      labels,
      markers,
      integer: true,
      series: [
        { key: "cache_read_input_tokens", label: "cache read", kind: "bar", values: client.map((r) => u(r, "cache_read_input_tokens")) },
        { key: "cache_creation_input_tokens", label: "cache write", kind: "bar", values: client.map((r) => u(r, "cache_creation_input_tokens")) },
        { key: "input_tokens", label: "uncached input", kind: "bar", values: client.map((r) => u(r, "input_tokens")) },
      ],
    })));
}

// The proxy's own calls (summaries, retrieval continuations) are made while it serves a client
// call, whose row is written when that call ends: each belongs to the next client row (by id).
function ownCalls(rows) {
  const out = new Map();
  let pending = { summary: 0, retrieval: 0 };
  for (const r of [...rows].sort((a, b) => a.id - b.id)) {
    if (r.kind === "client") {
      out.set(r.id, pending);
      pending = { summary: 0, retrieval: 0 };
    } else {
      pending[r.kind] = (pending[r.kind] || 0) + 1;
    }
  }
  return out;
}

// A row's dollars saved: "no price" for a model without one (its savings are unknown, not 0).
const rowSavings = (r) => (r.savings_usd === null || r.savings_usd === undefined ? (r.cost_usd ? "–" : "no price") : fmtUsd(r.savings_usd));

function turns(rows) {
  const byTurn = ownCalls(rows);
  const client = rows.filter((r) => r.kind === "client");
  const models = new Set(client.map((r) => r.model));
  const body = client.map((r, i) => {
    const extra = byTurn.get(r.id) || { summary: 0, retrieval: 0 };
    const saved = r.tokens_before !== null && r.tokens_after !== null ? r.tokens_before - r.tokens_after : null;
    return h("tr", { "data-turn": i + 1, class: r.status >= 400 ? "failed" : null },
      h("th", { scope: "row" }, String(i + 1)),
      h("td", { title: fmtTime(r.at) }, fmtTime(r.at).slice(11)),
      models.size > 1 ? h("td", {}, r.model || "") : null,
      h("td", {}, String(r.status)),
      h("td", { class: "num" }, fmtInt(r.tokens_before)),
      h("td", { class: "num" }, fmtInt(r.tokens_after)),
      h("td", { class: "num", "data-saved": saved }, fmtInt(saved)),
      h("td", {}, Array.isArray(r.layers) ? r.layers.join(", ") || "none" : String(r.layers || "none").replaceAll(",", ", ")),
      h("td", {}, r.plan || "none"),
      h("td", { "data-summary-calls": extra.summary },
        (r.summary || "–") + (extra.summary ? ` · ${fmtInt(extra.summary)} ${extra.summary === 1 ? "call" : "calls"}` : "")),
      h("td", { class: "num" }, fmtInt(extra.retrieval)),
      h("td", { class: "num" }, fmtInt(r.usage ? r.usage.cache_read_input_tokens : null)),
      h("td", { class: "num" }, fmtInt(r.usage ? r.usage.cache_creation_input_tokens : null)),
      h("td", { class: "num" }, fmtUsd(r.cost_usd ? r.cost_usd.total : null)),
      h("td", { class: "num savings", "data-usd": r.savings_usd }, rowSavings(r)),
      h("td", {}, r.compaction_id
        ? h("code", { class: "short", title: r.compaction_id, "data-compaction-id": r.compaction_id }, r.compaction_id.slice(0, 12) + "…")
        : ""));
  });
  const headers = ["Turn", "Time", models.size > 1 ? "Model" : null, "Status", "Tokens before", "Tokens after", "Saved",
    "Layers", "Plan", "Summary", "Retrievals", "Cache read", "Cache write", "Cost", "Savings", "Compaction"]
    .filter((x) => x !== null);
  return section("Turns",
    models.size === 1 ? h("p", { class: "detail" }, `Model ${[...models][0]}; times in UTC.`) : null,
    h("div", { class: "scroll" }, h("table", { class: "compact" },
      h("caption", { class: "visually-hidden" }, "Turns"),
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, body))));
}

// --- compactions ----------------------------------------------------------------------------

// Each compaction collapsed to one line; opened, it lists only the cuts no earlier compaction
// of this session made (a plan extends the previous one: its manifest repeats the earlier cuts).
async function compactions(base, rows, viewer) {
  const ids = [];
  const turnOf = new Map();
  rows.filter((r) => r.kind === "client").forEach((r, i) => {
    if (r.compaction_id && r.plan === "new" && !ids.includes(r.compaction_id)) {
      ids.push(r.compaction_id);
      turnOf.set(r.compaction_id, i + 1);
    }
  });
  const out = section("Compactions");
  if (!ids.length) {
    out.append(message("notice", "No compaction in this session."));
    return out;
  }
  const session = decodeURIComponent(base.slice("/sessions/".length));
  const seen = new Set();
  for (const cid of ids.slice(0, MAX_MANIFESTS)) {
    let m;
    try {
      m = await admin("/manifests/" + enc(cid));
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      out.append(h("article", { "aria-label": "Compaction " + cid, class: "compaction" },
        h("p", { class: "line" }, "Compaction ", h("code", {}, cid), ": its manifest is not stored.")));
      continue;
    }
    const man = m.manifest || {};
    const all = man.records || [];
    const fresh = all.filter((rec) => {
      const key = JSON.stringify([man.agent || "", rec]);
      if (seen.has(key)) return false;
      seen.add(key);
      return true;
    });
    const repeated = all.length - fresh.length;
    const records = fresh.map((rec) => manifestRecord(rec, session, viewer, man));
    const turn = turnOf.get(cid);
    const summary = h("summary", {},
      `Turn ${turn} · ${fmtInt(man.tokens_before)} → ${fmtInt(man.tokens_after)} tokens · ${(man.layers || []).join(", ") || "none"}`
        + ` · ${fmtInt(fresh.length)} new ${fresh.length === 1 ? "cut" : "cuts"}`
        + (repeated ? ` (${fmtInt(repeated)} earlier not repeated)` : ""),
      man.agent ? [" · of agent ", h("code", {}, man.agent)] : "");
    out.append(h("article", { "aria-label": "Compaction " + cid, "data-agent": man.agent || "", class: "compaction" },
      h("details", { "data-compaction": cid },
        summary,
        h("p", { class: "detail" }, "Compaction ", h("code", {}, cid), ` · stored ${fmtTime(m.stored_at)} · summary ${man.summary || "–"}`),
        records.length ? h("ul", {}, records) : message("notice", "Every cut of this compaction was made by an earlier one."))));
  }
  if (ids.length > MAX_MANIFESTS) out.append(message("notice", `${ids.length - MAX_MANIFESTS} more compactions not shown.`));
  return out;
}

// One manifest record (proxy/core/compaction/manifest.py), each kind with its own figures:
// truncated (tokens before and after, the kept artifact), removed by dedup or by prune (tokens
// removed), summarized (tokens before, the summary's tokens, the summariser calls). A kind this
// page does not know is shown by its name and fields, never as another kind.
// The transcript pointer of a record's message i: the event the manifest says it was recorded as
// (its "events"); a manifest written before events were stored names the main conversation's
// messages as recorded from its start (message i is event i + 1).
function eventPointer(man, session, i) {
  const events = man && man.events;
  const prefix = man && man.agent ? `transcript:${session}:${man.agent}:` : `transcript:${session}:`;
  if (events && typeof events === "object") {
    const seq = events[String(i)];
    return seq ? prefix + seq : null;
  }
  return man && man.agent ? null : prefix + (i + 1);
}

function manifestRecord(rec, session, viewer, man) {
  const kind = rec && typeof rec === "object" ? rec.kind : undefined;
  if (kind === "truncated") {
    return h("li", { "data-record": "truncated" },
      `Tool result ${rec.tool_use_id} (message ${rec.message_index}) cut from ${fmtInt(rec.tokens_before)} to ${fmtInt(rec.tokens_after)} tokens`,
      rec.artifact_key ? [" — kept as ", h("code", {}, rec.artifact_key), " ", viewer.button("Show artifact", rec.artifact_key)] : " — not kept");
  }
  const indices = Array.isArray(rec && rec.message_indices) ? rec.message_indices : [];
  const tools = Array.isArray(rec && rec.tool_use_ids) && rec.tool_use_ids.length
    ? [" (tool calls ", rec.tool_use_ids.join(", "), ")"] : "";
  const shown = indices.slice(0, 50).map((i) => [i, eventPointer(man, session, i)]).filter(([, p]) => p);
  const messages = shown.length ? h("div", { class: "messages" }, h("span", { class: "label" }, "Messages "),
    h("ul", { class: "inline", "aria-label": "Removed messages" }, shown.map(([i, pointer]) =>
      h("li", {}, viewer.button(String(i), pointer, `Show message ${i}`))))) : "";
  const count = (n, one, many) => `${fmtInt(n)} ${n === 1 ? one : many}`;
  if (kind === "removed" && rec.reason === "dedup") {
    const what = indices.length
      ? `${count(indices.length, "message", "messages")}, ${fmtInt(rec.tokens)} tokens`
      : `${fmtInt(rec.tokens)} tokens from messages that stay`;
    return h("li", { "data-record": "dedup" }, `Superseded file read removed: ${what}`, tools, messages);
  }
  if (kind === "removed" && rec.reason === "prune") {
    return h("li", { "data-record": "prune" },
      `Old turns removed: ${count(indices.length, "message", "messages")}, ${fmtInt(rec.tokens)} tokens`,
      tools, messages);
  }
  if (kind === "summarized") {
    return h("li", { "data-record": "summarized" },
      `Old turns summarised: ${count(indices.length, "message", "messages")} of ${fmtInt(rec.tokens_before)} tokens`
        + ` replaced by a summary of ${fmtInt(rec.summary_tokens)} tokens`
        + ` written in ${count(rec.calls, "summariser call", "summariser calls")}`,
      tools, messages);
  }
  return h("li", { "data-record": "other" }, `A record of kind ${String(kind)}: `, h("code", {}, JSON.stringify(rec)));
}

// --- durable state --------------------------------------------------------------------------

async function durable(base, state, viewer) {
  const preview = await admin(base + "/preview");
  const status = new Map((preview.sources || []).map((s) => [s.pointer, s.status]));
  const out = section("Durable state");
  const counts = preview.counts || {};
  out.append(h("p", { class: "detail", "data-figure": "source_counts" },
    Object.entries(counts).map(([k, v]) => `${k} ${v}`).join(" · ")));
  const row = (rec, text) => {
    const item = rec.item;
    const st = status.get(item.source) || "unknown";
    return h("tr", { "data-item": rec.id },
      h("th", { scope: "row" }, h("code", {}, rec.id)),
      h("td", { class: "text" }, text),
      h("td", {}, h("code", {}, item.source)),
      h("td", {}, h("span", { class: "status " + st, "data-status": st }, st)),
      h("td", {}, fmtTime(item.last_confirmed_at)),
      h("td", {}, viewer.button("Show source", item.source)));
  };
  const tbl = (caption, recs, text) => h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ["Id", "Content", "Source", "Source status", "Last confirmed", ""].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, recs.length
      ? recs.map((r) => row(r, text(r.item)))
      : h("tr", {}, h("td", { colspan: 6, class: "detail" }, "None."))));
  if (!state.facts.length && !state.pending.length && !state.evidence.length) {
    out.append(message("notice", "No facts, pending items or evidence: nothing is injected for this session."));
  } else {
    out.append(
      tbl("Facts", state.facts, (i) => i.content),
      tbl("Pending items", state.pending, (i) => `[${i.status}] ${i.content}`),
      tbl("Evidence", state.evidence, (i) => `${i.title} (rank ${i.rank}, score ${i.score})`));
  }
  if (preview.block !== null && preview.block !== undefined) {
    out.append(h("details", {}, h("summary", {}, "Injected block"), h("pre", {}, preview.block)));
  }
  return out;
}

// --- the source viewer ----------------------------------------------------------------------

function sourceViewer(base) {
  const body = h("div", {}, message("notice", "Choose a source, an artifact or a removed message to see it here."));
  const element = h("section", { "aria-label": "Source", id: "source" }, h("h2", {}, "Source"), body);
  async function show(pointer) {
    clear(body).append(message("notice", "Loading " + pointer));
    const data = await admin(base + "/source", { pointer });
    append(clear(body), [
      h("p", {}, h("code", {}, data.pointer), " ",
        h("span", { class: "status " + data.status, "data-status": data.status }, data.status)),
      data.evidence_sha256 ? h("p", { class: "detail" }, "SHA-256 " + data.evidence_sha256) : null,
      data.content !== null && data.content !== undefined
        ? sourceContent(data.content)
        : message("notice", `This source is ${data.status}: nothing is shown.`),
      data.truncated ? message("notice", "Only the beginning is shown.") : null]);
    element.scrollIntoView({ block: "nearest" });
  }
  function button(label, pointer, name) {
    const b = h("button", { type: "button", class: "link", "data-pointer": pointer, "aria-label": name }, label);
    b.addEventListener("click", () => {
      show(pointer).catch((err) => clear(body).append(message("error", "Could not load the source: " + err.message)));
    });
    return b;
  }
  return { element, button };
}

// A transcript record (one JSON line) is shown as its event; anything else as text.
function sourceContent(text) {
  let parsed = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  if (parsed && typeof parsed === "object" && !Array.isArray(parsed) && "sequence" in parsed && "content" in parsed) {
    return h("div", { role: "group", class: "source", "aria-label": "Source content" },
      h("p", { class: "label" }, `transcript event #${parsed.sequence} · ${parsed.role} · ${parsed.type} · ${fmtTime(parsed.recorded_at)}`),
      contentView(parsed.content));
  }
  return h("pre", { class: "source", "aria-label": "Source content" },
    parsed !== null && typeof parsed === "object" ? JSON.stringify(parsed, null, 2) : text);
}

// --- transcript -----------------------------------------------------------------------------

function blockView(block) {
  if (typeof block === "string") return h("pre", {}, block);
  if (!block || typeof block !== "object") return h("pre", {}, JSON.stringify(block));
  switch (block.type) {
    case "text":
      return h("div", { class: "block text" }, h("pre", {}, String(block.text)));
    case "thinking":
      return h("details", { class: "block" }, h("summary", {}, "thinking"), h("pre", {}, String(block.thinking || "")));
    case "tool_use":
    case "server_tool_use":
      return h("div", { class: "block tool" }, h("p", { class: "label" }, `${block.type} ${block.name || ""} (${block.id || ""})`),
        h("pre", {}, JSON.stringify(block.input, null, 2)));
    case "tool_result": {
      const c = block.content;
      return h("div", { class: "block tool" }, h("p", { class: "label" }, `tool_result for ${block.tool_use_id || ""}${block.is_error ? " (error)" : ""}`),
        typeof c === "string" ? h("pre", {}, c) : Array.isArray(c) ? c.map(blockView) : h("pre", {}, JSON.stringify(c)));
    }
    default:
      return h("div", { class: "block" }, h("p", { class: "label" }, String(block.type || "block")), h("pre", {}, JSON.stringify(block, null, 2)));
  }
}

// The first words of an event, for its collapsed line: text, else what the blocks are.
function gist(content) {
  if (content && typeof content === "object" && !Array.isArray(content) && "content" in content) content = content.content;
  const blocks = Array.isArray(content) ? content : [content];
  const parts = blocks.map((b) => {
    if (typeof b === "string") return b;
    if (!b || typeof b !== "object") return "";
    if (b.type === "text") return String(b.text || "");
    if (b.type === "tool_use" || b.type === "server_tool_use") return `[${b.name || "tool"} ${JSON.stringify(b.input || {})}]`;
    if (b.type === "tool_result") return `[result for ${b.tool_use_id || ""}]`;
    return `[${b.type || "block"}]`;
  });
  const text = parts.join(" ").replace(/\s+/g, " ").trim();
  return text.length > 140 ? text.slice(0, 139) + "…" : text;
}

function contentView(content) {
  if (content && typeof content === "object" && !Array.isArray(content) && "content" in content) {
    content = content.content; // an answer: the message object
  }
  if (Array.isArray(content)) return content.map(blockView);
  return blockView(content);
}

// The session's conversations: the main one, then its agents under the one that spawned each.
async function conversations(base, log) {
  const data = await admin(base + "/agents");
  const out = section("Conversations");
  const children = new Map();
  for (const a of data.agents) {
    const parent = a.parent || "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(a);
  }
  const known = new Set(data.agents.map((a) => a.agent));
  const node = (agent, label, events, seen) => {
    const b = h("button", { type: "button", class: "link", "data-conversation": agent }, label);
    b.addEventListener("click", () => log.show(agent).catch(log.failed));
    const kids = seen.has(agent) ? [] : children.get(agent) || [];
    seen.add(agent);
    return h("li", { "data-agent": agent },
      b, ` · ${fmtInt(events)} ${events === 1 ? "event" : "events"}`,
      kids.length ? h("ul", {}, kids.map((k) => node(k.agent, `agent ${k.agent}`, k.events, seen))) : null);
  };
  const seen = new Set();
  const roots = [node("", "main conversation", data.main.events, seen)];
  // an agent whose parent never recorded here is shown at the top level, not lost
  for (const a of data.agents) {
    if (a.parent && !known.has(a.parent) && !seen.has(a.agent)) roots.push(node(a.agent, `agent ${a.agent} (spawned by ${a.parent})`, a.events, seen));
  }
  out.append(h("ul", { class: "tree", "aria-label": "Conversations of this session" }, roots));
  return out;
}

// One conversation's transcript, paged; ``show(agent)`` switches conversation ("": the main one).
function transcriptView(base) {
  const title = h("p", { class: "detail", "data-figure": "conversation" });
  const list = h("div", { class: "events" });
  const pager = h("nav", { class: "pager", "aria-label": "Transcript pages" });
  const element = section("Transcript", title, list, pager);
  let agent = "";
  let stack = [];
  const failed = (err) => clear(list).append(message("error", "Could not load the transcript: " + err.message));
  async function load(after) {
    const query = { after, limit: TRANSCRIPT_PAGE };
    if (agent) query.agent = agent;
    const data = await admin(base + "/transcript", query);
    clear(list);
    for (const e of data.events) {
      // one line an event (its first words); opened, the whole of it
      list.append(h("article", { class: "event " + e.role, "data-seq": e.seq, "aria-label": `Event ${e.seq}` },
        h("details", {},
          h("summary", { class: "label" },
            `#${e.seq} · ${e.role} · ${e.type}${e.complete ? "" : " (incomplete)"} · ${fmtTime(e.recorded_at)} · `,
            h("span", { class: "gist" }, gist(e.content))),
          contentView(e.content))));
    }
    if (!data.events.length) list.append(message("notice", "Nothing recorded."));
    clear(pager);
    if (stack.length) {
      const prev = h("button", { type: "button" }, "Previous events");
      prev.addEventListener("click", () => { stack.pop(); load(stack.length ? stack[stack.length - 1] : 0).catch(failed); });
      pager.append(prev, " ");
    }
    if (data.next_after !== null && data.next_after !== undefined) {
      const next = h("button", { type: "button" }, "Next events");
      next.addEventListener("click", () => { stack.push(data.next_after); load(data.next_after).catch(failed); });
      pager.append(next);
    }
  }
  async function show(which) {
    agent = which;
    stack = [];
    append(clear(title), which ? ["Agent ", h("code", {}, which)] : ["The main conversation"]);
    await load(0);
  }
  return { element, show, failed };
}
