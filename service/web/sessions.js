// The session on screen: the one named by `?session=` or a new one at start, another of the
// user's chosen from the side list (sidelist.js), a new chat, and a new session when the one on
// screen vanished. Switching reads the session (GET /sessions/{id}) and follows its events from
// id 0, as a reload with `?session=` would (or, when they were purged, from the snapshot the
// server builds from the database).

import { chosenAgent, loadAgents, showAgent } from "./agents.js";
import { api, errorText } from "./api.js";
import { connect, teardown } from "./connection.js";
import { draw, initSideList, refresh } from "./sidelist.js";
import { state } from "./state.js";
import { resetState, resetView } from "./transcript.js";
import { make, notice, setPhase, ui, updateControls } from "./view.js";

export function initSessions() {
  initSideList({
    api: (method, path, body) => api(method, path, body),
    current: () => state.sessionId,
    open: (id) => openSession(id),
    deleted: () => newChat(),
  });
}

export async function boot() {
  teardown();
  resetView();
  setPhase("connecting");
  if (!(await loadAgents())) return; // the server wants an API key first
  const wanted = new URLSearchParams(location.search).get("session");
  if (!wanted) await startNewSession();
  else await loadSession(wanted);
  refresh();
}

// Switch the page to another of the user's sessions (from the side list).
export async function openSession(id) {
  teardown();
  resetView();
  notice("");
  setPhase("connecting");
  await loadSession(id);
}

export async function newChat() {
  teardown();
  resetView();
  notice("");
  setPhase("connecting");
  await startNewSession();
  ui.message.focus();
}

// The session vanished under a live page (expired, or the server restarted).
export async function sessionLost() {
  teardown();
  ui.transcript.append(make("div", "divider", "The previous session ended; this is a new one."));
  resetState();
  await startNewSession();
}

function setSession(id, putInUrl, agent) {
  state.sessionId = id;
  ui.sessionLabel.textContent = id || "–";
  showAgent(agent);
  draw();
  if (putInUrl && id) {
    const params = new URLSearchParams(location.search);
    params.set("session", id);
    history.replaceState(history.state, "", location.pathname + "?" + params.toString() + location.hash);
  }
  updateControls();
}

// Read the session and follow its events from the start.
async function loadSession(wanted) {
  let reply;
  try {
    reply = await api("GET", "/sessions/" + encodeURIComponent(wanted));
  } catch (_) {
    unreachable();
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
  setSession(wanted, true, reply.data.agent);
  state.serverLastId = Number(reply.data.last_event_id) || 0;
  state.running = reply.data.status === "running";
  updateControls();
  connect();
}

async function startNewSession() {
  let reply;
  try {
    const agent = chosenAgent();
    reply = await api("POST", "/sessions", agent ? { agent } : {});
  } catch (_) {
    unreachable();
    return;
  }
  if (reply.status === 401) return;
  if (reply.status !== 201 || !reply.data.id) {
    setPhase("closed");
    notice("Could not start a session: " + errorText(reply), "error");
    return;
  }
  setSession(reply.data.id, true, reply.data.agent);
  connect();
  refresh();
}

function unreachable() {
  setPhase("closed", "server unreachable");
  notice("The server cannot be reached. Reload to try again.", "error");
}
