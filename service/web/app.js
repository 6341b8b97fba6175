// agentstream's browser client: one page, no build step.
//
// The view is built from the session's events, each rendered once by id. On load the page
// replays the session's log (polling, page by page) so that a reload shows the conversation and
// the answer in flight without repeating text, then follows live events over WebSocket or SSE.
"use strict";

(() => {
  const $ = (selector) => document.querySelector(selector);
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  const params = new URLSearchParams(location.search);
  const state = {
    sessionId: null,
    transport: params.get("transport") || localStorage.getItem("agentstream.transport") || "ws",
    lastEventId: 0,
    running: false,
    answer: null, // the answer element of the query in flight
    tools: new Map(), // toolUseId -> card
    sessionTokens: 0, // tokens of finished queries
    apiKey: sessionStorage.getItem("agentstream.key") || "",
    token: null,
    source: null, // EventSource
    socket: null, // WebSocket
    backoff: 1000,
    pinger: null,
  };
  if (!["ws", "sse"].includes(state.transport)) state.transport = "ws";

  function publish() {
    window.agentstream = { sessionId: state.sessionId, transport: state.transport, lastEventId: state.lastEventId };
  }

  function setStatus(text, kind) {
    const status = $("#status");
    status.textContent = text;
    status.className = "pill" + (kind ? " " + kind : "");
  }

  function notice(text) {
    $("#notice").textContent = text || "";
  }

  function transportName() {
    return state.transport === "ws" ? "WebSocket" : "SSE";
  }

  // -- HTTP ---------------------------------------------------------------------------------

  class Unauthorized extends Error {}

  async function api(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    if (state.apiKey) headers.Authorization = `Bearer ${state.apiKey}`;
    const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (response.status === 401) {
      $("#key-form").hidden = false;
      throw new Unauthorized("an API key is needed");
    }
    return response;
  }

  async function tokenQuery() {
    if (!state.apiKey) return "";
    if (!state.token || state.token.expires_at * 1000 < Date.now() + 60000) {
      const response = await api("POST", "/auth/token");
      state.token = await response.json();
    }
    return `token=${encodeURIComponent(state.token.token)}`;
  }

  // -- rendering ------------------------------------------------------------------------------

  function scrollDown() {
    window.scrollTo(0, document.body.scrollHeight);
  }

  function addUser(text) {
    $("#transcript").append(el("div", "user-message", text));
  }

  function newAnswer(runId) {
    const answer = el("div", "answer");
    answer.dataset.runId = runId || "";
    answer.dataset.done = "false";
    answer.append(el("div", "answer-text"));
    $("#transcript").append(answer);
    state.answer = answer;
    state.tools.clear();
    return answer;
  }

  function currentAnswer() {
    return state.answer || newAnswer("");
  }

  function answerText(answer) {
    return answer.querySelector(".answer-text");
  }

  function toolCard(id, name) {
    let card = state.tools.get(id);
    if (!card) {
      card = el("div", "tool-call running");
      card.dataset.toolUseId = id;
      card.append(el("span", "tool-name", name || "tool"), document.createTextNode(" "));
      card.append(el("span", "tool-input", ""), el("div", "tool-result", ""));
      const answer = currentAnswer();
      answer.insertBefore(card, answerText(answer));
      state.tools.set(id, card);
    }
    return card;
  }

  function showUsage(runningTotal) {
    $("#usage").textContent = `${state.sessionTokens + (runningTotal || 0)} tokens`;
  }

  function finish(answer, done) {
    answer.dataset.done = "true";
    const meta = el("div", "meta");
    if (done) {
      const usage = done.usage || {};
      const notes = ["truncated", "max_turns_reached", "cancelled"].filter((flag) => done[flag]);
      meta.textContent = `${done.turns} turn(s) · ${usage.input_tokens || 0} in / ${usage.output_tokens || 0} out tokens` +
        (notes.length ? ` · ${notes.join(", ").replaceAll("_", " ")}` : "");
      state.sessionTokens += usage.total_tokens || 0;
      showUsage(0);
    }
    answer.append(meta);
  }

  // Render one session-dialect event, once: events at or below the last rendered id are skipped.
  function render(event) {
    if (event.id !== undefined && event.id !== null) {
      if (event.id <= state.lastEventId) return;
      state.lastEventId = event.id;
      publish();
    }
    switch (event.type) {
      case "processing":
        addUser(event.message);
        newAnswer(event.run_id);
        break;
      case "status_change":
        setRunning(event.status === "running");
        break;
      case "assistant_text":
        answerText(currentAnswer()).append(event.text);
        break;
      case "reasoning_text": {
        const answer = currentAnswer();
        let reasoning = answer.querySelector(".reasoning");
        if (!reasoning) {
          reasoning = el("div", "reasoning");
          answer.insertBefore(reasoning, answerText(answer));
        }
        reasoning.append(event.text);
        break;
      }
      case "plan": {
        const answer = currentAnswer();
        answer.insertBefore(el("div", "plan", event.plan), answerText(answer));
        break;
      }
      case "tool_use_start":
        toolCard(event.toolUseId, event.toolName);
        break;
      case "tool_input_delta":
        toolCard(event.toolUseId).querySelector(".tool-input").append(event.delta);
        break;
      case "tool_use":
        toolCard(event.toolUseId, event.toolName).querySelector(".tool-input").textContent = JSON.stringify(event.toolInput);
        break;
      case "tool_result": {
        const card = toolCard(event.toolUseId, event.toolName);
        card.classList.remove("running");
        if (event.isError) card.classList.add("failed");
        card.querySelector(".tool-result").textContent = event.result;
        break;
      }
      case "usage":
        showUsage(event.total_usage ? event.total_usage.total_tokens : 0);
        break;
      case "step": {
        const answer = currentAnswer();
        let steps = answer.querySelector(".steps");
        if (!steps) {
          steps = el("ol", "steps");
          answer.append(steps);
        }
        const calls = (event.tool_calls || []).map((call) => `${call.tool} → ${call.result ?? "…"}`).join("; ");
        steps.append(el("li", "", `step ${event.step_number}` + (calls ? `: ${calls}` : "") + (event.error ? ` (error: ${event.error})` : "")));
        break;
      }
      case "done":
        finish(currentAnswer(), event);
        state.answer = null;
        setRunning(false);
        break;
      case "error":
        if (event.id !== undefined) {
          const answer = currentAnswer();
          answer.append(el("div", "failure", event.message || event.error));
          finish(answer, null);
          state.answer = null;
          setRunning(false);
        } else {
          notice(event.message || event.error);
        }
        break;
      default:
        break; // heartbeat and types this page does not show
    }
    scrollDown();
  }

  // A snapshot (from a 410 or a purged poll) stands for the events that are gone.
  function renderSnapshot(snapshot) {
    const results = new Map();
    for (const message of snapshot.messages || []) {
      for (const block of message.content || []) {
        if (block.toolResult) results.set(block.toolResult.toolUseId, block.toolResult);
      }
    }
    for (const message of snapshot.messages || []) {
      const texts = (message.content || []).filter((block) => block.text !== undefined).map((block) => block.text);
      if (message.role === "user") {
        if (texts.length) addUser(texts.join(""));
        continue;
      }
      const answer = state.answer || newAnswer("");
      for (const block of message.content || []) {
        if (!block.toolUse) continue;
        const card = toolCard(block.toolUse.toolUseId, block.toolUse.name);
        card.querySelector(".tool-input").textContent = JSON.stringify(block.toolUse.input);
        const result = results.get(block.toolUse.toolUseId);
        card.classList.remove("running");
        if (result) card.querySelector(".tool-result").textContent = (result.content || []).map((c) => c.text).join("");
      }
      if (texts.length) {
        answerText(answer).append(texts.join(""));
        finish(answer, null);
        state.answer = null;
      }
    }
    const current = snapshot.current_query;
    if (current) {
      addUser(current.message);
      const answer = newAnswer("");
      for (const call of current.tool_calls || []) {
        const card = toolCard(call.tool_use_id, call.tool);
        card.querySelector(".tool-input").textContent = JSON.stringify(call.input);
        card.classList.remove("running");
        card.querySelector(".tool-result").textContent = call.result ?? "";
      }
      answerText(answer).append(current.text || "");
    }
    state.sessionTokens = (snapshot.usage && snapshot.usage.total_tokens) || 0;
    showUsage(0);
  }

  function setRunning(running) {
    state.running = running;
    $("#cancel").disabled = !running;
  }

  // -- the session's past: replay by polling, page by page ----------------------------------------

  async function replay() {
    for (;;) {
      const response = await api("GET", `/sessions/${state.sessionId}/events/poll?since_index=${state.lastEventId}`);
      if (response.status === 404) return false;
      const page = await response.json();
      if (page.purged) {
        renderSnapshot(page.snapshot);
        state.lastEventId = page.last_id;
        publish();
        setRunning(page.status === "running");
        return true;
      }
      page.events.forEach(render);
      if (!page.events.length || page.next_index >= page.last_id) {
        setRunning(page.status === "running");
        return true;
      }
    }
  }

  // -- live: WebSocket ------------------------------------------------------------------------------

  async function connectWs() {
    const query = await tokenQuery();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws${query ? "?" + query : ""}`);
    state.socket = socket;
    setStatus("connecting · WebSocket", "warn");
    socket.onopen = () => {
      socket.send(JSON.stringify({ type: "subscribe", session_id: state.sessionId, last_event_id: state.lastEventId }));
      clearInterval(state.pinger);
      state.pinger = setInterval(() => socket.readyState === 1 && socket.send('{"type":"ping"}'), 20000);
    };
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      if (frame.type === "subscribed") {
        state.backoff = 1000;
        setStatus("live · WebSocket", "live");
        return;
      }
      if (frame.type === "pong" || frame.type === "accepted" || frame.type === "cancel_requested" || frame.type === "unsubscribed") return;
      if (frame.type === "error" && frame.id === undefined) {
        if (frame.code === "events_purged") {
          renderSnapshot(frame.snapshot);
          state.lastEventId = frame.last_id;
          publish();
          socket.send(JSON.stringify({ type: "subscribe", session_id: state.sessionId, last_event_id: state.lastEventId }));
        } else {
          notice(frame.error);
        }
        return;
      }
      if (frame.session_id === state.sessionId) render(frame);
    };
    socket.onclose = () => {
      clearInterval(state.pinger);
      if (state.socket !== socket) return; // replaced on purpose
      setStatus("reconnecting · WebSocket", "warn");
      const delay = state.backoff;
      state.backoff = Math.min(state.backoff * 2, 10000);
      setTimeout(() => state.socket === socket && connectWs(), delay);
    };
  }

  // -- live: SSE -----------------------------------------------------------------------------------

  const SSE_TYPES = ["processing", "status_change", "assistant_text", "reasoning_text", "tool_use_start",
    "tool_input_delta", "tool_use", "tool_executing", "tool_result", "usage", "plan", "step", "done", "error", "heartbeat"];

  async function openSse() {
    if (state.source && state.source.readyState !== EventSource.CLOSED) return; // one stream at a time
    const query = await tokenQuery();
    // The id goes in the URL too, so a first connection is a resume; EventSource then sends
    // Last-Event-ID itself when it reconnects, and a 204 at the end stops it for good.
    const source = new EventSource(`/sessions/${state.sessionId}/events?last_event_id=${state.lastEventId}${query ? "&" + query : ""}`);
    state.source = source;
    for (const type of SSE_TYPES) {
      source.addEventListener(type, (message) => render(JSON.parse(message.data)));
    }
    source.onopen = () => setStatus("live · SSE", "live");
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        setStatus("live · SSE", "live"); // nothing more to stream: the next query opens a new one
      } else {
        setStatus("reconnecting · SSE", "warn");
      }
    };
  }

  // -- wiring ----------------------------------------------------------------------------------------

  function stopLive() {
    const socket = state.socket;
    state.socket = null;
    if (socket) socket.close();
    clearInterval(state.pinger);
    if (state.source) state.source.close();
    state.source = null;
  }

  async function goLive() {
    stopLive();
    if (state.transport === "ws") {
      try {
        await connectWs();
      } catch (error) {
        state.transport = "sse"; // WebSocket unavailable: fall back to SSE
        publish();
      }
    }
    if (state.transport === "sse") {
      setStatus("live · SSE", "live");
      if (state.running) await openSse();
    }
  }

  async function createSession() {
    const response = await api("POST", "/sessions", {});
    const body = await response.json();
    state.sessionId = body.id;
    const url = new URL(location.href);
    url.searchParams.set("session", body.id);
    history.replaceState(null, "", url);
  }

  async function boot() {
    $("#transport").value = state.transport;
    publish();
    try {
      state.sessionId = params.get("session");
      if (!state.sessionId || !(await replay())) {
        $("#transcript").replaceChildren();
        state.lastEventId = 0;
        await createSession();
      }
      publish();
      await goLive();
    } catch (error) {
      if (!(error instanceof Unauthorized)) notice(String(error));
      setStatus("closed", "");
    }
  }

  async function send() {
    const text = $("#message").value;
    if (!text.trim()) return;
    notice("");
    try {
      const response = await api("POST", `/sessions/${state.sessionId}/messages`, { content: text });
      if (response.status === 409) return notice("A query is already running; wait for it or cancel it.");
      if (!response.ok) return notice((await response.json()).error);
      $("#message").value = "";
      setRunning(true);
      if (state.transport === "sse") await openSse();
    } catch (error) {
      if (!(error instanceof Unauthorized)) notice(String(error));
    }
  }

  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("#message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      send();
    }
  });
  $("#cancel").addEventListener("click", () => api("POST", `/sessions/${state.sessionId}/cancel`).catch(() => {}));
  $("#transport").addEventListener("change", (event) => {
    state.transport = event.target.value;
    localStorage.setItem("agentstream.transport", state.transport);
    publish();
    goLive();
  });
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.apiKey = $("#api-key").value.trim();
    sessionStorage.setItem("agentstream.key", state.apiKey);
    state.token = null;
    $("#key-form").hidden = true;
    boot();
  });

  boot();
})();
