// The page's state, shared by its modules: what session is on screen, how far its event log has
// been applied, the connection in use, and the parts of the view that later events update.
//
// Reconnect timing comes from the query string when given (in ms), e.g.
// `?backoff_ms=50&backoff_max_ms=200`: the browser tests set it to see several retries within a
// second.

export const TRANSPORT_KEY = "agentstream.transport";
export const API_KEY_KEY = "agentstream.apiKey";
export const USER_TOKEN_KEY = "agentstream.userToken";
export const PING_EVERY_MS = 20000;
export const BACKOFF_START_MS = queryMs("backoff_ms", 1000);
export const BACKOFF_MAX_MS = Math.max(BACKOFF_START_MS, queryMs("backoff_max_ms", 10000));
export const RETRY_LOG_SIZE = 50;
// How often an idle SSE page asks whether the session moved on (connection.js), e.g.
// `?idle_check_ms=100` in the browser tests.
export const IDLE_CHECK_MS = queryMs("idle_check_ms", 5000);

// A positive whole number of milliseconds from the page's query string, or the default.
function queryMs(name, fallback) {
  const raw = new URLSearchParams(location.search).get(name);
  const value = raw === null ? NaN : Number(raw);
  return Number.isInteger(value) && value > 0 && value <= 600000 ? value : fallback;
}

export function storageGet(kind, key) {
  try {
    return window[kind].getItem(key);
  } catch (_) {
    return null;
  }
}

export function storageSet(kind, key, value) {
  try {
    if (value === null || value === undefined) window[kind].removeItem(key);
    else window[kind].setItem(key, value);
  } catch (_) {
    // storage may be unavailable (private modes); the page works without it
  }
}

// A signed-in person's token handed to the page as `/#token=...` by the app that opened it: read
// once, kept for this tab, and taken out of the address bar so it is not bookmarked or shared.
function handedToken() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (match) {
    let token = "";
    try {
      token = decodeURIComponent(match[1]);
    } catch (_) {
      token = "";
    }
    storageSet("sessionStorage", USER_TOKEN_KEY, token || null);
    history.replaceState(null, "", location.pathname + location.search);
    return token;
  }
  return storageGet("sessionStorage", USER_TOKEN_KEY) || "";
}

function chosenTransport() {
  const fromUrl = new URLSearchParams(location.search).get("transport");
  if (fromUrl === "ws" || fromUrl === "sse") return fromUrl;
  const saved = storageGet("localStorage", TRANSPORT_KEY);
  return saved === "sse" ? "sse" : "ws";
}

export function emptyUsage() {
  return { input: 0, output: 0, total: 0 };
}

export const state = {
  sessionId: null,
  agent: null, // the agent of the session on screen (GET /sessions/{id}, POST /sessions)
  transport: chosenTransport(),
  lastEventId: 0, // highest event id applied to the view
  serverLastId: 0, // highest id the server is known to hold
  running: false,
  phase: "connecting",
  apiKey: storageGet("sessionStorage", API_KEY_KEY) || "",
  userToken: handedToken(), // a signed-in person's token (JWT), used as it is
  signInExpired: false, // that token expired or was refused: the page says so
  token: null, // {value, expiresAt}
  generation: 0, // bumped on every teardown so late callbacks of old connections do nothing
  socket: null,
  socketOpened: false,
  wsEverOpened: false,
  backoff: BACKOFF_START_MS, // the delay before the next reconnect attempt
  retries: [], // the last RETRY_LOG_SIZE reconnects scheduled: {transport, delayMs, reason, at}
  reconnectTimer: null,
  pingTimer: null,
  idleTimer: null, // the next check of an idle SSE page
  source: null,
  probeStreak: 0,
  sending: false,
  rereadFor: null, // the rewind (event id) that last had the session read again
  textEvents: 0, // assistant_text events applied (the browser tests compare renders with it)
  // view
  answer: null, // the answer element of the query in flight
  tools: new Map(), // toolUseId -> card element
  approvals: new Map(), // approval_id -> its Approve / Deny box
  usageDone: emptyUsage(), // finished queries
  usageRun: emptyUsage(), // the query in flight
  follow: true,
};
