// agentstream browser client: plain JavaScript modules, no build step, no external resources.
// This entry wires them together and starts the page:
//
//   state.js       the shared state, and settings from the query string
//   events.js      the event types the page handles (checked against the service's by a test)
//   api.js         HTTP calls with the API key, stream tokens
//   auth.js        the API key form
//   connection.js  WebSocket / EventSource, reconnects with backoff
//   render.js      session events (or a purge snapshot) into the transcript
//   transcript.js  answers, tool calls, steps and turns
//   approvals.js   Approve / Deny on a tool call waiting for a person; a browser-side tool's wait
//   actions.js     Regenerate and Edit, through the server's rewind
//   view.js        the page's chrome: status, notice, buttons, usage
//   sessions.js    the session on screen; sidelist.js the list of the user's sessions
//   agents.js      the agent a new chat is made for, when the server has several
//   composer.js    send and cancel
//   selftest.js    "Check connection"
//   markdown.js    answers as sanitized Markdown, at most one render per frame
//
// `window.agentstream` shows the page's state to the browser tests (and to anyone debugging).

import { initActions } from "./actions.js";
import { agentNames, whenAgentPicked } from "./agents.js";
import { initAuth } from "./auth.js";
import { initComposer } from "./composer.js";
import { switchTransport, teardown, whenSessionLost } from "./connection.js";
import { markdown } from "./markdown.js";
import { whenOutOfStep, whenRunEnded } from "./render.js";
import { initSelftest } from "./selftest.js";
import { boot, initSessions, newChat, openSession, sessionLost } from "./sessions.js";
import { refresh as refreshSideList, sideListAvailable } from "./sidelist.js";
import { BACKOFF_MAX_MS, BACKOFF_START_MS, state } from "./state.js";
import { followScrolling, setPhase, ui, updateControls, updateUsage } from "./view.js";

window.agentstream = {
  get sessionId() { return state.sessionId; },
  get agent() { return state.agent; },
  get agents() { return agentNames(); },
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
  get sessionList() { return sideListAvailable(); },
  open: (id) => openSession(id),
};

initSessions();
initAuth();
initComposer();
initActions();
initSelftest((result) => { window.agentstream.selftest = result; });
whenSessionLost(sessionLost);
whenRunEnded(refreshSideList);
whenOutOfStep(() => { if (state.sessionId) openSession(state.sessionId); });
followScrolling();

ui.transport.value = state.transport;
ui.transport.addEventListener("change", () => switchTransport(ui.transport.value));
ui.newChat.addEventListener("click", newChat);
ui.sideNewChat.addEventListener("click", newChat);
whenAgentPicked(newChat);

window.addEventListener("pagehide", () => teardown());
window.addEventListener("pageshow", (event) => {
  if (event.persisted) boot(); // restored from the back/forward cache with dead connections
});

updateUsage();
updateControls();
setPhase("connecting");
boot();
