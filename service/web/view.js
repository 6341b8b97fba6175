// The page's chrome: its elements, the connection pill, the notice line, the buttons' state, the
// session's token count, and keeping the newest output in view. The transcript is transcript.js.

import { state } from "./state.js";

const byId = (id) => document.getElementById(id);

export const ui = {
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
  sessionAgent: byId("session-agent"),
  agentChoice: byId("agent-choice"),
  selftest: byId("selftest"),
};

export function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function transportLabel() {
  return state.transport === "ws" ? "WebSocket" : "SSE";
}

export function setPhase(phase, detail) {
  state.phase = phase;
  ui.status.dataset.state = phase;
  ui.status.textContent = phase + " · " + transportLabel() + (detail ? " (" + detail + ")" : "");
}

export function notice(text, kind) {
  ui.notice.textContent = text || "";
  ui.notice.dataset.kind = kind || "info";
}

// Whether the transcript's Edit / Regenerate buttons are off: while a query runs (they would
// cut back the conversation under it) or a request is on its way, and without a session.
let actionsOff = true;

export function updateControls() {
  ui.cancel.disabled = !state.running || !state.sessionId;
  ui.send.disabled = state.sending || !state.sessionId;
  ui.transcript.setAttribute("aria-busy", state.running ? "true" : "false");
  ui.empty.hidden = ui.transcript.childElementCount > 0;
  const off = state.running || state.sending || !state.sessionId;
  if (off !== actionsOff) {
    // Called on every event: the buttons are looked up only when their state changes.
    actionsOff = off;
    for (const button of ui.transcript.querySelectorAll(".message-action")) button.disabled = off;
  }
}

// A button acting on a message of the transcript (actions.js hears its clicks), enabled or not
// as the others are.
export function actionButton(className, label, title) {
  const button = make("button", "message-action quiet " + className, label);
  button.type = "button";
  button.disabled = actionsOff;
  if (title) button.title = title;
  return button;
}

export function updateUsage() {
  const input = state.usageDone.input + state.usageRun.input;
  const output = state.usageDone.output + state.usageRun.output;
  const total = state.usageDone.total + state.usageRun.total;
  ui.usage.textContent = total + " tokens";
  ui.usage.parentElement.title = "This session: " + input + " input + " + output + " output tokens";
}

export function readUsage(value) {
  const usage = value || {};
  return {
    input: Number(usage.input_tokens) || 0,
    output: Number(usage.output_tokens) || 0,
    total: Number(usage.total_tokens) || 0,
  };
}

export function usageText(value) {
  const usage = readUsage(value);
  return usage.total + " tokens (" + usage.input + " in / " + usage.output + " out)";
}

export function formatInput(input) {
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

export function followScrolling() {
  window.addEventListener("scroll", () => { state.follow = nearBottom(); }, { passive: true });
}

let scrollQueued = false;
export function keepInView() {
  if (!state.follow || scrollQueued) return;
  scrollQueued = true;
  requestAnimationFrame(() => {
    scrollQueued = false;
    window.scrollTo(0, document.documentElement.scrollHeight);
  });
}
