// agentstream browser client. Plain JavaScript, no build step, no external resources.
//
// The view is a pure function of the session's event log: every event with an id is applied
// once (ids at or below `lastEventId` are ignored), so a reload replays the log from id 0 and
// ends up exactly where a page that watched live would be, with no text repeated. Events reach
// the page over a WebSocket subscription or an EventSource; both feed `applyEvent`.
//
// Reconnecting: a closed WebSocket is reopened and resubscribed from `lastEventId`; a failed
// EventSource (the browser gives up for good on any non-200 answer, a 502/503 from a proxy
// included) is recreated from `lastEventId`. Both wait `backoff` between attempts, doubling
// from BACKOFF_START_MS up to BACKOFF_MAX_MS and starting over once a connection opens. The
// page's query string may set both (in ms), e.g. `?backoff_ms=50&backoff_max_ms=200` (the
// browser tests do, to see several retries within a second). `window.agentstream` shows the
// next delay (`backoffMs`) and the retries scheduled so far (`retries`).
//
// With the session database, a side list (sidelist.js) shows the user's sessions; choosing one
// switches the page to it as a reload with `?session=` would: the session is read with
// GET /sessions/{id} and its events followed from id 0 (or, when they were purged, from the
// snapshot the server builds from the database). Without one, the list stays hidden.
"use strict";

(function () {
  const EVENT_TYPES = [
    "processing", "status_change", "assistant_text", "reasoning_text", "tool_use_start",
    "tool_input_delta", "tool_use", "tool_executing", "tool_result", "usage", "plan", "step",
    "done", "error", "heartbeat", "tool_approval_request", "tool_approval_response",
  ];
  const TRANSPORT_KEY = "agentstream.transport";
  const API_KEY_KEY = "agentstream.apiKey";
  const PING_EVERY_MS = 20000;
  const BACKOFF_START_MS = queryMs("backoff_ms", 1000);
  const BACKOFF_MAX_MS = Math.max(BACKOFF_START_MS, queryMs("backoff_max_ms", 10000));
  const RETRY_LOG_SIZE = 50;
  const markdown = window.agentstreamMarkdown;

  // A positive whole number of milliseconds from the page's query string, or the default.
  function queryMs(name, fallback) {
    const raw = new URLSearchParams(location.search).get(name);
    const value = raw === null ? NaN : Number(raw);
    return Number.isInteger(value) && value > 0 && value <= 600000 ? value : fallback;
  }

  // ---------------------------------------------------------------------------- elements

  const byId = (id) => document.getElementById(id);
  const ui = {
    status: byId("status"),
    transport: byId("transport"),
    usage: byId("usage"),
    newChat: byId("new-chat"),
    sideNewChat: byId("side-new-chat"),
    auth: byId("auth"),
    authMessage: byId("auth-message"),
    apiKey: byId("api-key"),
    transcript: byId("transcript"),
    empty: byId("empty"),
    composer: byId("composer"),
    notice: byId("notice"),
    message: byId("message"),
    send: byId("send"),
    cancel: byId("cancel"),
    sessionLabel: byId("session-id"),
    selftest: byId("selftest"),
  };

  function make(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function storageGet(kind, key) {
    try {
      return window[kind].getItem(key);
    } catch (_) {
      return null;
    }
  }

  function storageSet(kind, key, value) {
    try {
      if (value === null || value === undefined) window[kind].removeItem(key);
      else window[kind].setItem(key, value);
    } catch (_) {
      // storage may be unavailable (private modes); the page works without it
    }
  }

  // ---------------------------------------------------------------------------- state

  function chosenTransport() {
    const fromUrl = new URLSearchParams(location.search).get("transport");
    if (fromUrl === "ws" || fromUrl === "sse") return fromUrl;
    const saved = storageGet("localStorage", TRANSPORT_KEY);
    return saved === "sse" ? "sse" : "ws";
  }

  const state = {
    sessionId: null,
    transport: chosenTransport(),
    lastEventId: 0, // highest event id applied to the view
    serverLastId: 0, // highest id the server is known to hold
    running: false,
    phase: "connecting",
    apiKey: storageGet("sessionStorage", API_KEY_KEY) || "",
    token: null, // {value, expiresAt}
    generation: 0, // bumped on every teardown so late callbacks of old connections do nothing
    socket: null,
    socketOpened: false,
    wsEverOpened: false,
    backoff: BACKOFF_START_MS, // the delay before the next reconnect attempt
    retries: [], // the last RETRY_LOG_SIZE reconnects scheduled: {transport, delayMs, reason, at}
    reconnectTimer: null,
    pingTimer: null,
    source: null,
    probeStreak: 0,
    sending: false,
    textEvents: 0, // assistant_text events applied (the browser tests compare renders with it)
    // view
    answer: null, // the answer element of the query in flight
    tools: new Map(), // toolUseId -> card element
    approvals: new Map(), // approval_id -> its Approve / Deny box
    usageDone: { input: 0, output: 0, total: 0 }, // finished queries
    usageRun: { input: 0, output: 0, total: 0 }, // the query in flight
    follow: true,
  };

  window.agentstream = {
    get sessionId() { return state.sessionId; },
    get transport() { return state.transport; },
    get lastEventId() { return state.lastEventId; },
    get connection() { return state.phase; },
    get running() { return state.running; },
    get backoffMs() { return state.backoff; },
    get retries() { return state.retries.map((retry) => ({ ...retry })); },
    // Text events applied, and renders of their Markdown (at most one per frame, however many).
    get textEvents() { return state.textEvents; },
    get markdownRenders() { return markdown.renders; },
    backoff: { startMs: BACKOFF_START_MS, maxMs: BACKOFF_MAX_MS },
    // The side list: null until GET /sessions answered, false without the session database.
    get sessionList() { return sideList.available; },
    open: (id) => openSession(id),
  };

  const sideList = window.agentstreamSideList({
    api: (method, path, body) => api(method, path, body),
    current: () => state.sessionId,
    open: (id) => openSession(id),
    deleted: () => newChat(),
  });

  // ---------------------------------------------------------------------------- chrome

  function transportLabel() {
    return state.transport === "ws" ? "WebSocket" : "SSE";
  }

  function setPhase(phase, detail) {
    state.phase = phase;
    ui.status.dataset.state = phase;
    ui.status.textContent = phase + " · " + transportLabel() + (detail ? " (" + detail + ")" : "");
  }

  function notice(text, kind) {
    ui.notice.textContent = text || "";
    ui.notice.dataset.kind = kind || "info";
  }

  function updateControls() {
    ui.cancel.disabled = !state.running || !state.sessionId;
    ui.send.disabled = state.sending || !state.sessionId;
    ui.transcript.setAttribute("aria-busy", state.running ? "true" : "false");
    ui.empty.hidden = ui.transcript.childElementCount > 0;
  }

  function updateUsage() {
    const input = state.usageDone.input + state.usageRun.input;
    const output = state.usageDone.output + state.usageRun.output;
    const total = state.usageDone.total + state.usageRun.total;
    ui.usage.textContent = total + " tokens";
    ui.usage.parentElement.title = "This session: " + input + " input + " + output + " output tokens";
  }

  function setSession(id, putInUrl) {
    state.sessionId = id;
    ui.sessionLabel.textContent = id || "–";
    sideList.draw();
    if (putInUrl && id) {
      const params = new URLSearchParams(location.search);
      params.set("session", id);
      history.replaceState(history.state, "", location.pathname + "?" + params.toString() + location.hash);
    }
    updateControls();
  }

  function readUsage(value) {
    const usage = value || {};
    return {
      input: Number(usage.input_tokens) || 0,
      output: Number(usage.output_tokens) || 0,
      total: Number(usage.total_tokens) || 0,
    };
  }

  function usageText(value) {
    const usage = readUsage(value);
    return usage.total + " tokens (" + usage.input + " in / " + usage.output + " out)";
  }

  function formatInput(input) {
    if (typeof input === "string") return input;
    try {
      const compact = JSON.stringify(input);
      return compact.length > 72 ? JSON.stringify(input, null, 2) : compact;
    } catch (_) {
      return String(input);
    }
  }

  // Keep the newest output in view unless the reader scrolled up.
  function nearBottom() {
    const doc = document.documentElement;
    return window.innerHeight + window.scrollY >= doc.scrollHeight - 120;
  }
  window.addEventListener("scroll", () => { state.follow = nearBottom(); }, { passive: true });
  let scrollQueued = false;
  function keepInView() {
    if (!state.follow || scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      scrollQueued = false;
      window.scrollTo(0, document.documentElement.scrollHeight);
    });
  }

  // ---------------------------------------------------------------------------- the view

  function resetView() {
    ui.transcript.replaceChildren();
    resetState();
  }

  // Forget what was rendered: the next events build the view from scratch.
  function resetState() {
    state.answer = null;
    state.tools.clear();
    state.approvals.clear();
    state.lastEventId = 0;
    state.serverLastId = 0;
    state.running = false;
    state.usageDone = { input: 0, output: 0, total: 0 };
    state.usageRun = { input: 0, output: 0, total: 0 };
    updateUsage();
    updateControls();
  }

  function addUserMessage(text) {
    const bubble = make("div", "user-message");
    bubble.append(make("span", "visually-hidden", "You: "));
    bubble.append(make("div", "user-text", text));
    ui.transcript.append(bubble);
    return bubble;
  }

  function newAnswer(runId) {
    const answer = make("article", "answer");
    answer.dataset.runId = runId || "";
    answer.setAttribute("aria-busy", "true");
    const head = make("div", "answer-head");
    head.append(make("span", "who", "Assistant"), make("span", "answer-state", "thinking…"));
    const plan = make("div", "plan");
    plan.hidden = true;
    const reasoning = make("details", "reasoning");
    reasoning.hidden = true;
    reasoning.append(make("summary", null, "Reasoning"), make("div", "reasoning-text"));
    const tools = make("div", "tools");
    const text = make("div", "answer-text");
    const failure = make("p", "answer-error");
    failure.hidden = true;
    const steps = make("details", "steps");
    steps.hidden = true;
    steps.append(make("summary", "steps-summary", "Steps"), make("ol", "step-list"), make("ul", "turn-list"));
    const usage = make("div", "answer-usage");
    answer.append(head, plan, reasoning, tools, text, failure, steps, usage);
    ui.transcript.append(answer);
    state.answer = answer;
    updateControls();
    return answer;
  }

  function currentAnswer() {
    return state.answer || newAnswer("");
  }

  function part(answer, selector) {
    return answer.querySelector(":scope > " + selector);
  }

  function setAnswerState(answer, text) {
    part(answer, ".answer-head").querySelector(".answer-state").textContent = text;
  }

  // The answer's text is Markdown (markdown.js): rendered, sanitized, at most once a frame.
  function appendAnswerText(answer, text) {
    if (!text) return;
    const holder = part(answer, ".answer-text");
    markdown.schedule(holder, markdown.source(holder) + text);
  }

  function finishAnswer(answer, label) {
    markdown.flush(part(answer, ".answer-text"));
    answer.dataset.done = "true";
    answer.removeAttribute("aria-busy");
    setAnswerState(answer, label);
    if (state.answer === answer) state.answer = null;
  }

  function toolCard(toolUseId, toolName) {
    let card = state.tools.get(toolUseId);
    if (!card) {
      card = make("div", "tool-call");
      card.dataset.toolUseId = toolUseId || "";
      const head = make("div", "tool-head");
      head.append(make("span", "tool-name", toolName || "tool"), make("span", "tool-state", "preparing…"));
      const inputLabel = make("div", "tool-label", "input");
      const input = make("pre", "tool-input");
      const resultLabel = make("div", "tool-label", "result");
      const result = make("pre", "tool-result");
      card.append(head, inputLabel, input, resultLabel, result);
      part(currentAnswer(), ".tools").append(card);
      if (toolUseId) state.tools.set(toolUseId, card);
    } else if (toolName) {
      card.querySelector(".tool-name").textContent = toolName;
    }
    return card;
  }

  function setToolState(card, text, kind) {
    const label = card.querySelector(".tool-state");
    label.textContent = text;
    card.dataset.state = kind || "";
  }

  function setToolInput(card, input) {
    card.querySelector(".tool-input").textContent = formatInput(input);
  }

  function setToolResult(card, result, isError) {
    card.querySelector(".tool-result").textContent = result === undefined || result === null ? "" : String(result);
    card.classList.toggle("is-error", !!isError);
    setToolState(card, isError ? "error" : "done", isError ? "error" : "done");
  }

  // A tool call waiting for a person: its input, a reason box and Approve / Deny. Every tab that
  // follows the session shows it; the logged answer (from whichever tab) takes it away in all.
  function showApproval(ev) {
    const card = toolCard(ev.toolUseId, ev.toolName);
    if (ev.toolInput !== undefined) setToolInput(card, ev.toolInput);
    setToolState(card, "waiting for approval", "approval");
    if (!ev.approval_id || card.querySelector(".approval")) return;
    const box = make("div", "approval");
    box.dataset.approvalId = ev.approval_id;
    const question = make("p", "approval-question", "Run " + (ev.toolName || "this tool") + " with this input?");
    const reason = make("input", "approval-reason");
    reason.type = "text";
    reason.placeholder = "Reason (optional)";
    reason.setAttribute("aria-label", "Reason");
    const approve = make("button", "approval-approve", "Approve");
    const deny = make("button", "approval-deny secondary", "Deny");
    approve.type = deny.type = "button";
    approve.addEventListener("click", () => answerApproval(box, true));
    deny.addEventListener("click", () => answerApproval(box, false));
    const row = make("div", "approval-row");
    row.append(reason, approve, deny);
    box.append(question, row);
    if (typeof ev.expires_at === "number") {
      box.append(make("p", "approval-expiry", "Counts as denied if unanswered by "
        + new Date(ev.expires_at * 1000).toLocaleTimeString() + "."));
    }
    card.append(box);
    state.approvals.set(ev.approval_id, box);
    setAnswerState(currentAnswer(), "waiting for your approval…");
  }

  function closeApproval(ev) {
    const box = state.approvals.get(ev.approval_id);
    state.approvals.delete(ev.approval_id);
    if (!box) return;
    const card = box.closest(".tool-call");
    box.remove();
    if (!card) return;
    if (ev.toolInput !== undefined) setToolInput(card, ev.toolInput);
    const why = ev.reason ? ": " + ev.reason : "";
    setToolState(card, ev.approved ? "approved" : "denied" + why, ev.approved ? "ready" : "error");
  }

  // The query ended: what it still asked can no longer be answered.
  function dropApprovals() {
    for (const box of state.approvals.values()) box.remove();
    state.approvals.clear();
  }

  async function answerApproval(box, approved) {
    const buttons = box.querySelectorAll("button");
    buttons.forEach((button) => { button.disabled = true; });
    const reason = box.querySelector(".approval-reason").value.trim();
    const body = { approved };
    if (reason) body.reason = reason;
    try {
      const reply = await api("POST", sessionPath("/approvals/" + encodeURIComponent(box.dataset.approvalId)), body);
      // The answer comes back as a logged event, which clears the box (here and in every tab).
      if (!reply.ok && reply.status !== 401) notice("Could not answer: " + errorText(reply), "error");
    } catch (_) {
      notice("Could not reach the server; the approval was not sent.", "error");
    }
    if (box.isConnected) buttons.forEach((button) => { button.disabled = false; });
  }

  function addStep(answer, ev) {
    const steps = part(answer, ".steps");
    steps.hidden = false;
    const item = make("li", "step");
    const bits = ["Step " + ev.step_number];
    if (ev.turn !== undefined && ev.turn !== null) bits.push("turn " + ev.turn);
    if (ev.usage) bits.push(readUsage(ev.usage).total + " tokens");
    item.append(make("div", "step-head", bits.join(" · ")));
    const calls = Array.isArray(ev.tool_calls) ? ev.tool_calls : [];
    if (calls.length) {
      const list = make("ul", "step-tools");
      for (const call of calls) {
        const line = make("li", call.is_error ? "step-tool is-error" : "step-tool");
        line.append(
          make("code", null, call.tool + " " + formatInput(call.input)),
          make("span", "arrow", " → "),
          make("code", null, call.result === undefined || call.result === null ? "(no result)" : call.result),
        );
        list.append(line);
      }
      item.append(list);
    }
    if (ev.text) item.append(make("p", "step-text", ev.text));
    if (ev.error) item.append(make("p", "step-error", "Error: " + ev.error));
    part(steps, ".step-list").append(item);
    countSteps(steps);
  }

  function addTurnUsage(answer, ev) {
    const steps = part(answer, ".steps");
    steps.hidden = false;
    const bits = ["Turn " + ev.turn];
    if (ev.stop_reason) bits.push(ev.stop_reason);
    bits.push(usageText(ev.usage));
    if (ev.latency_ms !== undefined && ev.latency_ms !== null) bits.push(ev.latency_ms + " ms");
    part(steps, ".turn-list").append(make("li", "turn-usage", bits.join(" · ")));
    countSteps(steps);
    part(answer, ".answer-usage").textContent = "This answer so far: " + usageText(ev.total_usage);
  }

  function countSteps(steps) {
    const stepCount = part(steps, ".step-list").childElementCount;
    const turnCount = part(steps, ".turn-list").childElementCount;
    const words = [];
    if (stepCount) words.push(stepCount + (stepCount === 1 ? " step" : " steps"));
    if (turnCount) words.push(turnCount + (turnCount === 1 ? " model turn" : " model turns"));
    part(steps, ".steps-summary").textContent = words.join(", ");
  }

  // A query's final usage: the terminal event's figures, never less than its turns reported.
  function finishRunUsage(usage) {
    const final = readUsage(usage);
    const run = {
      input: Math.max(final.input, state.usageRun.input),
      output: Math.max(final.output, state.usageRun.output),
      total: Math.max(final.total, state.usageRun.total),
    };
    state.usageDone = {
      input: state.usageDone.input + run.input,
      output: state.usageDone.output + run.output,
      total: state.usageDone.total + run.total,
    };
    state.usageRun = { input: 0, output: 0, total: 0 };
    updateUsage();
  }

  // One session event, applied once. Returns nothing; never throws.
  function applyEvent(ev) {
    if (!ev || typeof ev.type !== "string") return;
    const id = typeof ev.id === "number" ? ev.id : null;
    if (id !== null && id <= state.lastEventId) return; // already on screen
    try {
      render(ev);
    } catch (err) {
      console.error("agentstream: could not render", ev, err);
    }
    if (id !== null) {
      state.lastEventId = id;
      if (id > state.serverLastId) state.serverLastId = id;
      state.probeStreak = 0;
    }
    keepInView();
  }

  function render(ev) {
    switch (ev.type) {
      case "processing": {
        if (state.answer) finishAnswer(state.answer, "interrupted");
        addUserMessage(ev.message || "");
        newAnswer(ev.run_id);
        state.usageRun = { input: 0, output: 0, total: 0 };
        state.running = true;
        break;
      }
      case "tool_approval_request": {
        showApproval(ev);
        break;
      }
      case "tool_approval_response": {
        closeApproval(ev);
        break;
      }
      case "status_change": {
        if (ev.status === "running" || ev.status === "waiting") state.running = true;
        else if (ev.status === "cancelled" && state.answer) setAnswerState(state.answer, "cancelling…");
        break;
      }
      case "assistant_text": {
        state.textEvents += 1;
        const answer = currentAnswer();
        appendAnswerText(answer, ev.text);
        setAnswerState(answer, "writing…");
        break;
      }
      case "reasoning_text": {
        const answer = currentAnswer();
        const box = part(answer, ".reasoning");
        box.hidden = false;
        box.querySelector(".reasoning-text").append(document.createTextNode(ev.text || ""));
        setAnswerState(answer, "reasoning…");
        break;
      }
      case "tool_use_start": {
        const card = toolCard(ev.toolUseId, ev.toolName);
        setToolState(card, "writing input…", "input");
        setAnswerState(currentAnswer(), "calling " + (ev.toolName || "a tool") + "…");
        break;
      }
      case "tool_input_delta": {
        const card = toolCard(ev.toolUseId, ev.toolName);
        card.querySelector(".tool-input").append(document.createTextNode(ev.delta || ""));
        break;
      }
      case "tool_use": {
        const card = toolCard(ev.toolUseId, ev.toolName);
        setToolInput(card, ev.toolInput);
        setToolState(card, "ready", "ready");
        break;
      }
      case "tool_executing": {
        const card = toolCard(ev.toolUseId, ev.toolName);
        setToolState(card, "running…", "running");
        break;
      }
      case "tool_result": {
        const card = toolCard(ev.toolUseId, ev.toolName);
        setToolResult(card, ev.result, ev.isError);
        break;
      }
      case "usage": {
        state.usageRun = readUsage(ev.total_usage || ev.usage);
        addTurnUsage(currentAnswer(), ev);
        updateUsage();
        break;
      }
      case "plan": {
        const answer = currentAnswer();
        const plan = part(answer, ".plan");
        plan.hidden = false;
        plan.replaceChildren(make("div", "plan-label", "Plan"), make("div", "plan-text", ev.plan || ""));
        state.usageRun = readUsage(ev.usage);
        updateUsage();
        break;
      }
      case "step": {
        addStep(currentAnswer(), ev);
        break;
      }
      case "done": {
        const answer = currentAnswer();
        const flags = [];
        if (ev.cancelled) { flags.push("cancelled"); answer.dataset.cancelled = "true"; }
        if (ev.truncated) flags.push("truncated (max tokens)");
        if (ev.max_turns_reached) flags.push("stopped at the turn limit");
        const turns = ev.turns ? ev.turns + (ev.turns === 1 ? " turn" : " turns") + " · " : "";
        part(answer, ".answer-usage").textContent = turns + "This answer: " + usageText(ev.usage);
        finishAnswer(answer, flags.length ? flags.join(", ") : "done");
        finishRunUsage(ev.usage);
        dropApprovals();
        state.running = false;
        sideList.refresh(); // its update time (coalesced while a replay goes by)
        break;
      }
      case "error": {
        if (typeof ev.id !== "number") {
          streamError(ev);
          break;
        }
        // A logged error ends the query.
        const answer = currentAnswer();
        const failure = part(answer, ".answer-error");
        failure.hidden = false;
        failure.textContent = "Error" + (ev.code ? " (" + ev.code + ")" : "") + ": " + (ev.message || "the query failed");
        answer.dataset.error = ev.code || "error";
        finishAnswer(answer, "failed");
        finishRunUsage(ev.usage);
        dropApprovals();
        state.running = false;
        sideList.refresh();
        break;
      }
      case "heartbeat": {
        if (typeof ev.last_id === "number" && ev.last_id > state.serverLastId) state.serverLastId = ev.last_id;
        if (typeof ev.last_id === "number" && ev.last_id > state.lastEventId) {
          // The server holds events we never got: catch up from the last one applied.
          if (state.transport === "sse") reopenSse();
          else subscribe();
        }
        break;
      }
      default:
        break;
    }
    updateControls();
  }

  // Rebuild the view from a purge snapshot: {status, messages, current_query, usage}.
  function renderSnapshot(snapshot, lastId) {
    const hadView = state.lastEventId > 0; // a page that only just opened the session lost nothing
    resetView();
    const messages = Array.isArray(snapshot && snapshot.messages) ? snapshot.messages : [];
    const current = snapshot ? snapshot.current_query : null;
    const isUserText = (m) => m && m.role === "user" && Array.isArray(m.content)
      && m.content.some((b) => typeof b.text === "string") && !m.content.some((b) => b.toolResult);
    let end = messages.length;
    if (current) {
      // The running query's own messages are in the log already; show them from current_query.
      for (let i = messages.length - 1; i >= 0; i--) {
        if (isUserText(messages[i])) { end = i; break; }
      }
    }
    for (let i = 0; i < end; i++) {
      const message = messages[i];
      const blocks = Array.isArray(message.content) ? message.content : [];
      if (isUserText(message)) {
        if (state.answer) finishAnswer(state.answer, "done");
        addUserMessage(blocks.filter((b) => typeof b.text === "string").map((b) => b.text).join("\n"));
        newAnswer("");
        continue;
      }
      for (const block of blocks) {
        if (message.role === "assistant" && typeof block.text === "string") {
          appendAnswerText(currentAnswer(), block.text);
        } else if (block.toolUse) {
          const card = toolCard(block.toolUse.toolUseId, block.toolUse.name);
          setToolInput(card, block.toolUse.input);
          setToolState(card, "ready", "ready");
        } else if (block.toolResult) {
          const result = block.toolResult;
          const text = (Array.isArray(result.content) ? result.content : [])
            .map((c) => (typeof c.text === "string" ? c.text : JSON.stringify(c.json !== undefined ? c.json : c)))
            .join("\n");
          setToolResult(toolCard(result.toolUseId, null), text, result.status === "error");
        }
      }
    }
    if (state.answer) finishAnswer(state.answer, "done");
    const session = readUsage(snapshot && snapshot.usage);
    if (current) {
      addUserMessage(current.message || "");
      const answer = newAnswer("");
      appendAnswerText(answer, current.text || "");
      for (const call of Array.isArray(current.tool_calls) ? current.tool_calls : []) {
        const card = toolCard(call.tool_use_id, call.tool);
        setToolInput(card, call.input);
        setToolResult(card, call.result, call.is_error);
      }
      setAnswerState(answer, "writing…");
      state.usageRun = readUsage(current.usage);
      state.running = true;
      for (const pending of Array.isArray(snapshot.pending_approvals) ? snapshot.pending_approvals : []) {
        showApproval(pending);
      }
    }
    state.usageDone = {
      input: Math.max(0, session.input - state.usageRun.input),
      output: Math.max(0, session.output - state.usageRun.output),
      total: Math.max(0, session.total - state.usageRun.total),
    };
    state.lastEventId = Number(lastId) || 0;
    state.serverLastId = Math.max(state.serverLastId, state.lastEventId);
    if (snapshot && (snapshot.status === "running" || snapshot.status === "waiting")) state.running = true;
    if (hadView) notice("Older events were purged; the conversation was rebuilt from a snapshot.");
    updateUsage();
    updateControls();
    keepInView();
  }

  // ---------------------------------------------------------------------------- HTTP and auth

  async function api(method, path, body) {
    const headers = {};
    if (state.apiKey) headers.Authorization = "Bearer " + state.apiKey;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    const raw = await response.text();
    let data = null;
    if (raw) {
      try {
        data = JSON.parse(raw);
      } catch (_) {
        data = { error: raw };
      }
    }
    if (response.status === 401) askForKey();
    return { status: response.status, ok: response.ok, data: data || {} };
  }

  function errorText(reply) {
    return (reply.data && reply.data.error) || "HTTP " + reply.status;
  }

  function askForKey(message) {
    teardown();
    if (state.apiKey) {
      state.apiKey = "";
      storageSet("sessionStorage", API_KEY_KEY, null);
      message = message || "That API key was refused. Enter another one.";
    }
    state.token = null;
    ui.authMessage.textContent = message || "This server needs an API key.";
    ui.auth.hidden = false;
    setPhase("closed", "API key needed");
    ui.apiKey.focus();
  }

  // A short-lived token for EventSource and WebSocket URLs: null when none is needed,
  // false when the key was refused (the key field is showing then).
  async function streamToken() {
    if (!state.apiKey) return null;
    if (state.token && state.token.expiresAt * 1000 - Date.now() > 60000) return state.token.value;
    let reply;
    try {
      reply = await api("POST", "/auth/token");
    } catch (_) {
      return null; // unreachable: the connection attempt will fail and retry
    }
    if (reply.status === 401) return false;
    if (!reply.ok || !reply.data.token) return null; // 404: no keys configured, none needed
    state.token = { value: reply.data.token, expiresAt: Number(reply.data.expires_at) || 0 };
    return state.token.value;
  }

  function withToken(url, token) {
    if (!token) return url;
    return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
  }

  function sessionPath(suffix) {
    return "/sessions/" + encodeURIComponent(state.sessionId) + (suffix || "");
  }

  // ---------------------------------------------------------------------------- sessions

  async function boot() {
    teardown();
    resetView();
    setPhase("connecting");
    const wanted = new URLSearchParams(location.search).get("session");
    if (!wanted) await startNewSession();
    else await loadSession(wanted);
    sideList.refresh();
  }

  // Switch the page to another of the user's sessions (from the side list).
  async function openSession(id) {
    teardown();
    resetView();
    notice("");
    setPhase("connecting");
    await loadSession(id);
  }

  async function newChat() {
    teardown();
    resetView();
    notice("");
    setPhase("connecting");
    await startNewSession();
    ui.message.focus();
  }

  // Read the session and follow its events from the start.
  async function loadSession(wanted) {
    let reply;
    try {
      reply = await api("GET", "/sessions/" + encodeURIComponent(wanted));
    } catch (_) {
      setPhase("closed", "server unreachable");
      notice("The server cannot be reached. Reload to try again.", "error");
      return;
    }
    if (reply.status === 401) return;
    if (reply.status === 404) {
      notice("That session no longer exists; a new one was started.");
      await startNewSession();
      return;
    }
    if (!reply.ok) {
      setPhase("closed");
      notice("Could not open the session: " + errorText(reply), "error");
      return;
    }
    setSession(wanted, true);
    state.serverLastId = Number(reply.data.last_event_id) || 0;
    state.running = reply.data.status === "running";
    updateControls();
    connect();
  }

  async function startNewSession() {
    let reply;
    try {
      reply = await api("POST", "/sessions", {});
    } catch (_) {
      setPhase("closed", "server unreachable");
      notice("The server cannot be reached. Reload to try again.", "error");
      return;
    }
    if (reply.status === 401) return;
    if (reply.status !== 201 || !reply.data.id) {
      setPhase("closed");
      notice("Could not start a session: " + errorText(reply), "error");
      return;
    }
    setSession(reply.data.id, true);
    connect();
    sideList.refresh();
  }

  // The session vanished under a live page (expired, or the server restarted).
  async function sessionLost() {
    teardown();
    ui.transcript.append(make("div", "divider", "The previous session ended; this is a new one."));
    resetState();
    await startNewSession();
  }

  // ---------------------------------------------------------------------------- connections

  function teardown() {
    state.generation += 1;
    clearTimeout(state.reconnectTimer);
    clearInterval(state.pingTimer);
    state.reconnectTimer = null;
    state.pingTimer = null;
    const socket = state.socket;
    state.socket = null;
    if (socket) {
      try { socket.close(1000, "client switched"); } catch (_) { /* already closed */ }
    }
    closeSse();
  }

  function connect() {
    if (!state.sessionId) return;
    state.backoff = BACKOFF_START_MS;
    if (state.transport === "ws") connectWs();
    else if (state.running || state.serverLastId > state.lastEventId) openSse();
    else setPhase("live", "idle");
  }

  // ---- WebSocket

  async function connectWs() {
    const generation = state.generation;
    const token = await streamToken();
    if (generation !== state.generation) return;
    if (token === false) {
      askForKey("That API key was refused. Enter another one.");
      return;
    }
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    let socket;
    try {
      socket = new WebSocket(withToken(scheme + "://" + location.host + "/ws", token));
    } catch (_) {
      fallBackToSse();
      return;
    }
    state.socket = socket;
    state.socketOpened = false;
    if (state.phase !== "reconnecting") setPhase("connecting");

    socket.onopen = () => {
      if (socket !== state.socket) return;
      state.socketOpened = true;
      state.wsEverOpened = true;
      state.backoff = BACKOFF_START_MS;
      setPhase("connecting", "subscribing");
      subscribe();
      clearInterval(state.pingTimer);
      state.pingTimer = setInterval(() => wsSend({ type: "ping" }), PING_EVERY_MS);
    };
    socket.onmessage = (message) => {
      if (socket !== state.socket || typeof message.data !== "string") return;
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch (_) {
        return;
      }
      onWsFrame(frame);
    };
    socket.onclose = () => {
      if (socket !== state.socket) return; // closed on purpose
      state.socket = null;
      clearInterval(state.pingTimer);
      state.pingTimer = null;
      if (!state.socketOpened && !state.wsEverOpened) fallBackToSse();
      else scheduleWsReconnect();
    };
    socket.onerror = () => { /* a close event follows */ };
  }

  function wsSend(payload) {
    const socket = state.socket;
    if (!socket || socket.readyState !== WebSocket.OPEN) return false;
    socket.send(JSON.stringify(payload));
    return true;
  }

  function subscribe() {
    if (!state.sessionId) return;
    wsSend({ type: "subscribe", session_id: state.sessionId, last_event_id: state.lastEventId });
  }

  function scheduleWsReconnect() {
    retryLater(connectWs, "socket closed");
  }

  // Call `attempt` after the current backoff delay (unless the connection is torn down first),
  // and double the delay for the next time, up to BACKOFF_MAX_MS.
  function retryLater(attempt, reason) {
    const delay = state.backoff;
    state.backoff = Math.min(state.backoff * 2, BACKOFF_MAX_MS);
    state.retries.push({ transport: state.transport, delayMs: delay, reason, at: Date.now() });
    if (state.retries.length > RETRY_LOG_SIZE) state.retries.shift();
    const wait = delay < 1000 ? delay + " ms" : Math.round(delay / 1000) + " s";
    setPhase("reconnecting", reason + ", retry in " + wait);
    clearTimeout(state.reconnectTimer);
    const generation = state.generation;
    state.reconnectTimer = setTimeout(() => {
      if (generation === state.generation) attempt();
    }, delay);
  }

  function fallBackToSse() {
    teardown();
    state.transport = "sse";
    ui.transport.value = "sse";
    notice("WebSocket could not connect; using SSE instead.", "warn");
    connect();
  }

  function onWsFrame(frame) {
    if (frame.session_id && frame.session_id !== state.sessionId) return; // an old session's frame
    switch (frame.type) {
      case "subscribed":
        setPhase("live");
        return;
      case "pong":
      case "accepted":
      case "cancel_requested":
        return;
      case "unsubscribed": {
        // The server ended the subscription (we never ask it to): follow the session again.
        const generation = state.generation;
        clearTimeout(state.reconnectTimer);
        state.reconnectTimer = setTimeout(() => {
          if (generation === state.generation) subscribe();
        }, BACKOFF_START_MS);
        return;
      }
      case "error":
        if (typeof frame.id === "number") break; // a query's error: an event of the log
        if (frame.code === "events_purged") {
          if (frame.snapshot) renderSnapshot(frame.snapshot, frame.last_id);
          subscribe();
        } else if (frame.code === "not_found") {
          sessionLost();
        } else if (frame.code === "conflict") {
          notice("A query is already running in this session; wait for it or cancel it.", "warn");
        } else {
          notice(frame.error || "The server reported an error.", "error");
        }
        return;
      default:
        break;
    }
    applyEvent(frame);
  }

  // ---- Server-Sent Events

  function closeSse() {
    const source = state.source;
    state.source = null;
    if (source) source.close();
  }

  function reopenSse() {
    closeSse();
    openSse();
  }

  // Open the session stream from the last id applied, unless one is open or reconnecting.
  async function openSse() {
    if (state.source && state.source.readyState !== EventSource.CLOSED) return;
    const generation = state.generation;
    setPhase(state.phase === "reconnecting" ? "reconnecting" : "connecting");
    const token = await streamToken();
    if (generation !== state.generation) return;
    if (token === false) {
      askForKey("That API key was refused. Enter another one.");
      return;
    }
    if (state.source && state.source.readyState !== EventSource.CLOSED) return;
    const url = withToken(sessionPath("/events?last_event_id=" + state.lastEventId), token);
    const source = new EventSource(url);
    state.source = source;
    source.addEventListener("open", () => {
      if (source !== state.source) return;
      state.backoff = BACKOFF_START_MS; // it connected: the next failure starts over
      setPhase("live");
    });
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, (event) => {
        if (source !== state.source) return;
        if (type === "error" && !(event instanceof MessageEvent)) {
          onSseFailure(source);
          return;
        }
        let payload;
        try {
          payload = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        applyEvent(payload);
      });
    }
  }

  function onSseFailure(source) {
    if (source.readyState === EventSource.CONNECTING) {
      // The browser reconnects by itself with Last-Event-ID. After the `done` that ends the
      // log this is the expected end of the stream (the server's 204 stops it).
      if (!state.running && state.lastEventId >= state.serverLastId) setPhase("live", "idle");
      else setPhase("reconnecting");
      return;
    }
    // CLOSED: the browser gave up (204, or an HTTP error it cannot show us).
    state.source = null;
    if (!state.running && state.lastEventId >= state.serverLastId) {
      setPhase("live", "idle");
      return;
    }
    probeSse();
  }

  // EventSource hides status codes, so ask the same URL once with fetch to learn why it ended.
  async function probeSse() {
    const generation = state.generation;
    state.probeStreak += 1;
    if (state.probeStreak > 5) {
      setPhase("closed", "stream keeps failing");
      notice("The event stream keeps failing; reload the page to try again.", "error");
      return;
    }
    const controller = new AbortController();
    const headers = {};
    if (state.apiKey) headers.Authorization = "Bearer " + state.apiKey;
    let response;
    try {
      response = await fetch(sessionPath("/events?last_event_id=" + state.lastEventId), {
        headers, cache: "no-store", signal: controller.signal,
      });
    } catch (_) {
      if (generation !== state.generation) return;
      state.probeStreak -= 1; // a network outage is not the stream failing
      retryLater(openSse, "server unreachable");
      return;
    }
    if (generation !== state.generation) {
      controller.abort();
      return;
    }
    switch (response.status) {
      case 204:
        state.running = false;
        updateControls();
        setPhase("live", "idle");
        return;
      case 200:
        controller.abort(); // there is something to read after all: let EventSource read it
        openSse();
        return;
      case 410: {
        let body = {};
        try { body = await response.json(); } catch (_) { /* keep the empty body */ }
        if (generation !== state.generation) return;
        renderSnapshot(body.snapshot || {}, body.last_id);
        if (state.running) openSse();
        else setPhase("live", "idle");
        return;
      }
      case 401:
        if (state.apiKey) {
          state.token = null; // expired or revoked: a fresh one, or the key field
          openSse();
        } else {
          askForKey();
        }
        return;
      case 404:
        sessionLost();
        return;
      case 400:
        // Our last id is ahead of the server's log (it restarted with the same id?): rebuild.
        resetView();
        openSse();
        return;
      default:
        controller.abort();
        // A 502/503/504 from a proxy while the service restarts (or a 5xx, 408, 429 of its
        // own) passes: keep retrying at the capped backoff, as after a network failure, and
        // give up only on answers that will not change by waiting.
        if (response.status >= 500 || response.status === 408 || response.status === 429) {
          state.probeStreak -= 1;
        }
        retryLater(openSse, "HTTP " + response.status);
    }
  }

  // An `error` event without an id: the stream's own trouble, not the query's.
  function streamError(ev) {
    if (ev.code === "events_purged") {
      // We fell behind the purge horizon; the reconnect answers 410 with a snapshot.
      if (state.transport === "sse") {
        closeSse();
        probeSse();
      } else {
        subscribe();
      }
      return;
    }
    notice(ev.message || ev.error || "The stream reported an error.", "error");
  }

  // ---------------------------------------------------------------------------- actions

  async function sendMessage() {
    const text = ui.message.value;
    if (!text.trim() || !state.sessionId || state.sending) return;
    state.sending = true;
    updateControls();
    try {
      const reply = await api("POST", sessionPath("/messages"), { content: text });
      if (reply.status === 202) {
        sideList.refresh(); // the first query names the chat
        ui.message.value = "";
        notice("");
        state.running = true;
        if (state.transport === "sse") openSse();
        else if (!state.socket) connectWs();
      } else if (reply.status === 409) {
        notice("A query is already running in this session; wait for it to finish or cancel it.", "warn");
      } else if (reply.status === 404) {
        notice("The session had ended; a new one was started. Send again.", "warn");
        await sessionLost();
      } else if (reply.status !== 401) {
        notice("Could not send: " + errorText(reply), "error");
      }
    } catch (_) {
      notice("Could not reach the server; the message was not sent.", "error");
    } finally {
      state.sending = false;
      updateControls();
    }
  }

  async function cancelQuery() {
    if (!state.sessionId) return;
    ui.cancel.disabled = true;
    try {
      const reply = await api("POST", sessionPath("/cancel"));
      if (reply.ok && reply.data.cancelled === false) notice("Nothing was running.");
      else if (!reply.ok && reply.status !== 401) notice("Could not cancel: " + errorText(reply), "error");
    } catch (_) {
      notice("Could not reach the server to cancel.", "error");
    }
    updateControls();
  }

  function switchTransport(value) {
    if (value !== "ws" && value !== "sse") return;
    storageSet("localStorage", TRANSPORT_KEY, value);
    const params = new URLSearchParams(location.search);
    if (params.has("transport")) {
      params.set("transport", value);
      history.replaceState(history.state, "", location.pathname + "?" + params.toString() + location.hash);
    }
    if (value === state.transport) return;
    teardown();
    state.transport = value;
    state.wsEverOpened = false;
    notice("");
    setPhase("connecting");
    connect();
  }

  // ---------------------------------------------------------------------------- wiring

  ui.transport.value = state.transport;
  ui.transport.addEventListener("change", () => switchTransport(ui.transport.value));

  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });
  ui.message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendMessage();
    }
  });
  ui.cancel.addEventListener("click", cancelQuery);

  ui.newChat.addEventListener("click", newChat);
  ui.sideNewChat.addEventListener("click", newChat);

  // ------------------------------------------------------------------ connection check

  // Reads GET /selftest/stream: ticks written interval_ms apart, each stamped with the server's
  // clock. Ticks that arrive together although written apart mean a proxy buffers the stream;
  // a Content-Encoding means it was compressed; the lag is how far behind the page reads.
  async function checkConnection(ticks, intervalMs) {
    const headers = {};
    if (state.apiKey) headers.Authorization = "Bearer " + state.apiKey;
    const url = "/selftest/stream?ticks=" + ticks + "&interval_ms=" + intervalMs;
    const started = Date.now();
    const response = await fetch(url, { headers, cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const encoding = response.headers.get("content-encoding");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const arrivals = [];
    let buffer = "";
    let ended = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const now = Date.now();
      buffer += decoder.decode(value, { stream: true });
      const blocks = buffer.split(/\r\n\r\n|\n\n/);
      buffer = blocks.pop();
      for (const block of blocks) {
        const data = block.split(/\r?\n/).find((line) => line.startsWith("data:"));
        if (!data) continue;
        const payload = JSON.parse(data.slice(5));
        if (payload.type === "tick") arrivals.push({ at: now, ts: payload.ts * 1000 });
        if (payload.type === "end") ended = true;
      }
    }
    const gaps = arrivals.slice(1).map((tick, i) => tick.at - arrivals[i].at);
    const bunched = gaps.filter((gap) => gap < intervalMs / 4).length;
    const lags = arrivals.map((tick) => tick.at - tick.ts).sort((a, b) => a - b);
    return {
      ticks: arrivals.length,
      ended,
      buffered: gaps.length > 0 && bunched > gaps.length / 2,
      compressed: Boolean(encoding && encoding !== "identity"),
      lagMs: lags.length ? Math.round(lags[Math.floor(lags.length / 2)]) : null,
      tookMs: Date.now() - started,
    };
  }

  ui.selftest.addEventListener("click", async () => {
    ui.selftest.disabled = true;
    notice("Checking the connection to the server…");
    try {
      const result = await checkConnection(10, 100);
      const problems = [];
      if (!result.ended) problems.push("the stream was cut before its end");
      if (result.buffered) problems.push("something on the way buffers streams (answers will arrive in bursts)");
      if (result.compressed) problems.push("something on the way compresses streams");
      const verdict = problems.length
        ? "Connection check: " + problems.join("; ") + "."
        : "Connection check: streams arrive live, unbuffered and uncompressed" +
          (result.lagMs !== null ? " (about " + Math.max(0, result.lagMs) + " ms behind the server)." : ".");
      notice(verdict, problems.length ? "error" : "info");
      window.agentstream.selftest = result;
    } catch (error) {
      notice("Connection check failed: " + error.message, "error");
    } finally {
      ui.selftest.disabled = false;
    }
  });

  ui.auth.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = ui.apiKey.value.trim();
    if (!key) return;
    state.apiKey = key;
    state.token = null;
    storageSet("sessionStorage", API_KEY_KEY, key);
    ui.apiKey.value = "";
    ui.auth.hidden = true;
    boot();
  });

  window.addEventListener("pagehide", () => teardown());
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) boot(); // restored from the back/forward cache with dead connections
  });

  updateUsage();
  updateControls();
  setPhase("connecting");
  boot();
})();
