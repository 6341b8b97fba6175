// The side list of the user's sessions, from the session database (GET /sessions): newest first,
// each with its title and when it was last updated, more on demand (`before` cursor), and per
// session a rename (PATCH /sessions/{id}) and a delete (DELETE /sessions/{id}). Clicking one asks
// the page to switch to it. Without a database the service answers 501 `no_database`: the list
// stays hidden and the page works with its one session as before.
//
// sessions.js starts it with `initSideList({api, current, open, deleted})`: `api` is its
// authenticated fetch (`{status, ok, data}`), `current()` the session on screen, `open(id)`
// switches to one, `deleted(id)` hears that the session on screen was deleted. The page calls
// `refresh()` whenever the list may have changed (a new chat, a query started or ended).
import { make } from "./view.js";

const PAGE_SIZE = 20;

const byId = (id) => document.getElementById(id);
const root = byId("sidelist");
const list = byId("session-list");
const more = byId("more-sessions");
let options = null;
let sessions = []; // summaries as GET /sessions gives them, newest first
let nextBefore = null;
let available = null; // null: not asked yet; false: no database (the list stays hidden)
let editing = null; // the id whose title is being edited (the list is not redrawn meanwhile)
let queued = false;
let busy = null;

function when(seconds) {
  const date = new Date(Number(seconds) * 1000);
  const today = new Date();
  const sameDay = date.toDateString() === today.toDateString();
  return sameDay
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleDateString([], { month: "short", day: "numeric", year: "numeric" });
}

function disable() {
  available = false;
  root.hidden = true;
  document.body.classList.remove("with-sidelist");
}

export function draw() {
  if (editing) return;
  const current = options.current();
  list.replaceChildren(...sessions.map((session) => item(session, session.id === current)));
  more.hidden = !nextBefore;
}

function item(session, isCurrent) {
  const li = make("li", "session-item");
  li.dataset.sessionId = session.id;
  if (isCurrent) li.setAttribute("aria-current", "true");
  const open = make("button", "session-open");
  open.type = "button";
  const title = make("span", "session-title", session.title || "New chat");
  if (!session.title) title.classList.add("untitled");
  const time = make("time", "session-time", when(session.updated_at));
  time.dateTime = new Date(Number(session.updated_at) * 1000).toISOString();
  time.title = new Date(Number(session.updated_at) * 1000).toLocaleString();
  open.append(title, time);
  open.addEventListener("click", () => {
    if (session.id !== options.current()) options.open(session.id);
  });
  const rename = make("button", "session-rename quiet", "✎");
  rename.type = "button";
  rename.title = "Rename";
  rename.setAttribute("aria-label", "Rename " + (session.title || "this chat"));
  rename.addEventListener("click", () => startRename(li, session));
  const remove = make("button", "session-delete quiet", "✕");
  remove.type = "button";
  remove.title = "Delete";
  remove.setAttribute("aria-label", "Delete " + (session.title || "this chat"));
  remove.addEventListener("click", () => removeSession(session));
  li.append(open, rename, remove);
  return li;
}

function startRename(li, session) {
  editing = session.id;
  const form = make("form", "session-rename-form");
  const input = make("input", "session-title-input");
  input.value = session.title || "";
  input.maxLength = 200;
  input.setAttribute("aria-label", "New title");
  form.append(input);
  li.replaceChildren(form);
  input.focus();
  input.select();
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (save && title && title !== session.title) {
      const reply = await options.api("PATCH", "/sessions/" + encodeURIComponent(session.id), { title });
      if (reply.ok) session.title = reply.data.title;
    }
    editing = null;
    await refresh();
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    finish(true);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
}

async function removeSession(session) {
  if (!window.confirm("Delete “" + (session.title || "New chat") + "”? This cannot be undone.")) return;
  const reply = await options.api("DELETE", "/sessions/" + encodeURIComponent(session.id));
  if (!reply.ok && reply.status !== 404) return;
  sessions = sessions.filter((s) => s.id !== session.id);
  draw();
  if (session.id === options.current()) options.deleted(session.id);
  await refresh();
}

async function fetchPage(limit, before) {
  const params = new URLSearchParams({ limit: String(limit) });
  if (before) params.set("before", before);
  let reply;
  try {
    reply = await options.api("GET", "/sessions?" + params.toString());
  } catch (_) {
    return null; // unreachable now; the next refresh tries again
  }
  if (reply.status === 501 || reply.status === 404) {
    disable(); // no database (or a service without the list)
    return null;
  }
  if (!reply.ok) return null;
  if (available === null) {
    available = true;
    root.hidden = false;
    document.body.classList.add("with-sidelist");
  }
  return reply.data;
}

// Reload the pages shown so far (at least the first): titles, times and order change.
export async function refresh() {
  if (available === false) return;
  if (busy) {
    queued = true;
    return busy;
  }
  busy = (async () => {
    do {
      queued = false;
      const page = await fetchPage(Math.min(100, Math.max(PAGE_SIZE, sessions.length)));
      if (page) {
        sessions = page.sessions || [];
        nextBefore = page.next_before || null;
        draw();
      }
    } while (queued && available !== false);
  })();
  try {
    await busy;
  } finally {
    busy = null;
  }
}

async function loadMore() {
  if (!nextBefore) return;
  more.disabled = true;
  const page = await fetchPage(PAGE_SIZE, nextBefore);
  more.disabled = false;
  if (!page) return;
  const known = new Set(sessions.map((s) => s.id));
  sessions = sessions.concat((page.sessions || []).filter((s) => !known.has(s.id)));
  nextBefore = page.next_before || null;
  draw();
}


// Start the list with the page's callbacks (see above); it asks the server at the first refresh.
export function initSideList(callbacks) {
  options = callbacks;
  more.addEventListener("click", loadMore);
}

// null until GET /sessions answered, false without the session database.
export function sideListAvailable() {
  return available;
}
