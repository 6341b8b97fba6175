// Following the session's events, over a WebSocket subscription or an EventSource; both feed
// `receive`, which hands logged events to render.js.
//
// Reconnecting: a closed WebSocket is reopened and resubscribed from `lastEventId`; a failed
// EventSource (the browser gives up for good on any non-200 answer, a 502/503 from a proxy
// included) is recreated from `lastEventId`. Both wait `backoff` between attempts, doubling
// from BACKOFF_START_MS up to BACKOFF_MAX_MS and starting over once a connection opens.
// `window.agentstream` shows the next delay (`backoffMs`) and the retries scheduled so far.
//
// At rest, SSE has no stream: the service ends it after the `done` that ends the log. So that a
// query started elsewhere (another tab, another app, a rewind) still shows here, an idle SSE page
// asks every IDLE_CHECK_MS whether the log has moved on, and follows it when it has. A WebSocket
// subscription stays open and needs no such check.

import { SIGNIN_EXPIRED, api, authHeaders, sessionPath, streamToken, unauthorized, withToken } from "./api.js";
import { EVENT_TYPES } from "./events.js";
import { applyEvent, renderSnapshot } from "./render.js";
import {
  BACKOFF_MAX_MS, BACKOFF_START_MS, IDLE_CHECK_MS, PING_EVERY_MS, RETRY_LOG_SIZE, TRANSPORT_KEY, state,
  storageSet,
} from "./state.js";
import { resetView } from "./transcript.js";
import { notice, setPhase, ui, updateControls } from "./view.js";

const KEY_REFUSED = "That API key was refused. Enter another one.";

let onSessionLost = () => {};

// Who hears that the session vanished under a live page (expired, or the server restarted).
export function whenSessionLost(handler) {
  onSessionLost = handler;
}

export function teardown() {
  state.generation += 1;
  clearTimeout(state.reconnectTimer);
  clearInterval(state.pingTimer);
  clearTimeout(state.idleTimer);
  state.reconnectTimer = null;
  state.pingTimer = null;
  state.idleTimer = null;
  const socket = state.socket;
  state.socket = null;
  if (socket) {
    try { socket.close(1000, "client switched"); } catch (_) { /* already closed */ }
  }
  closeSse();
}

export function connect() {
  if (!state.sessionId) return;
  state.backoff = BACKOFF_START_MS;
  if (state.transport === "ws") connectWs();
  else if (state.running || state.serverLastId > state.lastEventId) openSse();
  else atRest();
}

// A query was just started: make sure something is listening for its events.
export function follow() {
  if (state.transport === "sse") openSse();
  else if (!state.socket) connectWs();
}

export function switchTransport(value) {
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

// An event from either transport. Heartbeats and errors without an id are the stream's own;
// everything else belongs to the log and the view.
function receive(ev) {
  if (ev && ev.type === "heartbeat") heartbeat(ev);
  else if (ev && ev.type === "error" && typeof ev.id !== "number") streamError(ev);
  else applyEvent(ev);
}

function heartbeat(ev) {
  if (typeof ev.last_id === "number" && ev.last_id > state.serverLastId) state.serverLastId = ev.last_id;
  if (typeof ev.last_id === "number" && ev.last_id > state.lastEventId) {
    // The server holds events we never got: catch up from the last one applied.
    if (state.transport === "sse") reopenSse();
    else subscribe();
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
  if (ev.code === "token_expired") {
    // The stream ended at its token's expiry: again with a fresh one, from the last id seen.
    state.token = null;
    closeSse();
    if (state.userToken) unauthorized(SIGNIN_EXPIRED);
    else openSse();
    return;
  }
  notice(ev.message || ev.error || "The stream reported an error.", "error");
}

// ---- WebSocket

async function connectWs() {
  const generation = state.generation;
  const token = await streamToken();
  if (generation !== state.generation) return;
  if (token === false) {
    unauthorized(KEY_REFUSED);
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
  watchSocket(socket);
}

function watchSocket(socket) {
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
    else retryLater(connectWs, "socket closed");
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
      onWsError(frame);
      return;
    default:
      break;
  }
  receive(frame);
}

// A WebSocket `error` frame without an id: about this subscription or request, not the query.
function onWsError(frame) {
  if (frame.code === "events_purged") {
    if (frame.snapshot) renderSnapshot(frame.snapshot, frame.last_id);
    subscribe();
  } else if (frame.code === "not_found") {
    onSessionLost();
  } else if (frame.code === "token_expired") {
    // The socket closes (4401) and reconnects with a fresh token; a handed one cannot be renewed.
    state.token = null;
    if (state.userToken) unauthorized(SIGNIN_EXPIRED);
  } else if (frame.code === "conflict") {
    notice("A query is already running in this session; wait for it or cancel it.", "warn");
  } else {
    notice(frame.error || "The server reported an error.", "error");
  }
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
    unauthorized(KEY_REFUSED);
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
  // An EventSource delivers only the event names it listens for (the SSE event is the type).
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
      receive(payload);
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
    atRest();
    return;
  }
  probeSse();
}

// Idle on SSE with nothing open: look again in IDLE_CHECK_MS.
function atRest() {
  setPhase("live", "idle");
  clearTimeout(state.idleTimer);
  const generation = state.generation;
  state.idleTimer = setTimeout(() => {
    if (generation === state.generation) checkAtRest();
  }, IDLE_CHECK_MS);
}

// Has the session's log moved on since the last event applied? (One event at most is read: the
// stream reads the rest.) A hidden tab does not ask; it looks again once the timer comes round.
async function checkAtRest() {
  if (state.transport !== "sse" || (state.source && state.source.readyState !== EventSource.CLOSED)) return;
  if (document.visibilityState === "hidden") {
    atRest();
    return;
  }
  const generation = state.generation;
  let reply = null;
  try {
    reply = await api("GET", sessionPath("/events/poll?limit=1&since_index=" + state.lastEventId));
  } catch (_) {
    reply = null; // unreachable now: ask again later
  }
  if (generation !== state.generation) return;
  if (reply && reply.ok) {
    const lastId = Number(reply.data.last_id) || 0;
    if (lastId > state.serverLastId) state.serverLastId = lastId;
    if (lastId > state.lastEventId || reply.data.status === "running" || reply.data.status === "waiting") {
      openSse();
      return;
    }
  } else if (reply && reply.status === 404) {
    onSessionLost();
    return;
  } else if (reply && reply.status === 400) {
    openSse(); // our last id is ahead of the log: the stream's answer rebuilds the view
    return;
  } else if (reply && reply.status === 401) {
    return; // the key form is up; the next connection starts over
  }
  atRest();
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
  let response;
  try {
    response = await fetch(sessionPath("/events?last_event_id=" + state.lastEventId), {
      headers: authHeaders(), cache: "no-store", signal: controller.signal,
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
  await onProbeAnswer(response, controller, generation);
}

async function onProbeAnswer(response, controller, generation) {
  switch (response.status) {
    case 204:
      state.running = false;
      updateControls();
      atRest();
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
      else atRest();
      return;
    }
    case 401:
      if (state.apiKey) {
        state.token = null; // expired or revoked: a fresh one, or the key field
        openSse();
      } else {
        unauthorized();
      }
      return;
    case 404:
      onSessionLost();
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
