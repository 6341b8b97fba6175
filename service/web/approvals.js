// A tool call waiting for a person: its input, a reason box and Approve / Deny. Every tab that
// follows the session shows it; the logged answer (from whichever tab) takes it away in all.
//
// A call of a tool the client runs itself (a browser-side tool another front end declared) waits
// the same way, for that client's result: this page runs no such tool, so it shows the call as
// waiting, without buttons, until the result (or the timeout's error) is logged.

import { api, errorText, sessionPath } from "./api.js";
import { state } from "./state.js";
import { currentAnswer, setAnswerState, setToolInput, setToolState, toolCard } from "./transcript.js";
import { make, notice } from "./view.js";

export function showApproval(ev) {
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

export function closeApproval(ev) {
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

export function showClientTool(ev) {
  const card = toolCard(ev.toolUseId, ev.toolName);
  if (!card.classList.contains("client-tool")) {
    card.classList.add("client-tool");
    card.querySelector(".tool-name").after(make("span", "tool-where", "runs in the app"));
  }
  if (ev.toolInput !== undefined) setToolInput(card, ev.toolInput);
  setToolState(card, "waiting for the app's result", "client");
  const key = clientKey(ev.toolUseId);
  if (state.approvals.has(key)) return;
  let text = "This tool runs in the app that offered it; the answer goes on once its result comes";
  if (typeof ev.expires_at === "number") {
    text += " (or without it at " + new Date(ev.expires_at * 1000).toLocaleTimeString() + ")";
  }
  const box = make("p", "client-wait", text + ".");
  card.append(box);
  state.approvals.set(key, box);
  setAnswerState(currentAnswer(), "waiting for a tool's result…");
}

export function closeClientTool(ev) {
  const key = clientKey(ev.toolUseId);
  const box = state.approvals.get(key);
  state.approvals.delete(key);
  if (box) box.remove();
  const card = state.tools.get(ev.toolUseId);
  if (!card) return;
  if (typeof ev.error === "string") {
    const why = ev.by === "timeout" ? "no result in time" : "failed in the app";
    setToolState(card, why, "error");
  } else {
    setToolState(card, "result from the app", "ready");
  }
}

// Client tool calls are kept beside the approvals, under a key no approval id can have.
function clientKey(toolUseId) {
  return "ct:" + (toolUseId || "");
}

// The query ended: what it still asked can no longer be answered.
export function dropApprovals() {
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
