// The transcript's pieces: a user's message, and an answer with its plan, reasoning, tool calls,
// Markdown text, steps, model turns and usage. render.js decides which event changes what.
//
// Each user message and answer carries the conversation's id for it as `data-message-id` (the
// user's message: `processing.message_id`; the answer: `processing.reply_id`, the id of its first
// assistant message), so that a rewind, which names the message it cuts back to, removes exactly
// that message and what follows it. An answer spans all its model turns; a rewind never names a
// later turn's message (`<reply_id>-<turn>`), only a user's message or an answer's first.

import { markdown } from "./markdown.js";
import { emptyUsage, state } from "./state.js";
import {
  actionButton, formatInput, make, readUsage, ui, updateControls, updateUsage, usageText,
} from "./view.js";

export function resetView() {
  ui.transcript.replaceChildren();
  resetState();
}

// Forget what was rendered: the next events build the view from scratch.
export function resetState() {
  state.answer = null;
  state.tools.clear();
  state.approvals.clear();
  state.lastEventId = 0;
  state.serverLastId = 0;
  state.running = false;
  state.usageDone = emptyUsage();
  state.usageRun = emptyUsage();
  updateUsage();
  updateControls();
}

export function addUserMessage(text, messageId) {
  const bubble = make("div", "user-message");
  if (messageId) bubble.dataset.messageId = messageId;
  bubble.append(make("span", "visually-hidden", "You: "));
  bubble.append(make("div", "user-text", text));
  if (messageId) {
    // Only a message with its id can be named in an edit.
    const actions = make("div", "message-actions");
    actions.append(actionButton("edit-message", "Edit", "Change this message and ask again from here"));
    bubble.append(actions);
  }
  ui.transcript.append(bubble);
  return bubble;
}

// The user's message `messageId` when it is the last thing in the transcript: a regenerate asks
// it again, after the rewind took its answer away, and adds no message of its own.
export function lastUserMessage(messageId) {
  const last = ui.transcript.lastElementChild;
  if (!messageId || !last || !last.classList.contains("user-message")) return null;
  return last.dataset.messageId === messageId ? last : null;
}

export function newAnswer(runId, replyId) {
  const answer = make("article", "answer");
  answer.dataset.runId = runId || "";
  if (replyId) answer.dataset.messageId = replyId;
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
  const actions = make("div", "answer-actions");
  actions.append(actionButton("regenerate", "Regenerate", "Answer this question again"));
  answer.append(head, plan, reasoning, tools, text, failure, steps, usage, actions);
  ui.transcript.append(answer);
  state.answer = answer;
  updateControls();
  return answer;
}

// The conversation was cut back to before the message `messageId` (`kept` messages remain):
// remove it and everything after it. False when no message on screen has that id (a log written
// before messages had ids); with nothing kept, everything goes whatever the id.
export function cutBack(messageId, kept) {
  const nodes = [...ui.transcript.children];
  let at = -1;
  for (let i = nodes.length - 1; i >= 0 && at < 0; i--) {
    if (nodes[i].dataset.messageId === messageId) at = i;
  }
  if (at < 0 && kept === 0) at = 0;
  if (at < 0) return false;
  for (const node of nodes.slice(at)) node.remove();
  if (state.answer && !state.answer.isConnected) state.answer = null;
  for (const [key, node] of state.tools) if (!node.isConnected) state.tools.delete(key);
  for (const [key, node] of state.approvals) if (!node.isConnected) state.approvals.delete(key);
  updateControls();
  return true;
}

export function currentAnswer() {
  return state.answer || newAnswer("");
}

export function part(answer, selector) {
  return answer.querySelector(":scope > " + selector);
}

export function setAnswerState(answer, text) {
  part(answer, ".answer-head").querySelector(".answer-state").textContent = text;
}

// The answer's text is Markdown (markdown.js): rendered, sanitized, at most once a frame.
export function appendAnswerText(answer, text) {
  if (!text) return;
  const holder = part(answer, ".answer-text");
  markdown.schedule(holder, markdown.source(holder) + text);
}

export function finishAnswer(answer, label) {
  markdown.flush(part(answer, ".answer-text"));
  answer.dataset.done = "true";
  answer.removeAttribute("aria-busy");
  setAnswerState(answer, label);
  if (state.answer === answer) state.answer = null;
}

export function toolCard(toolUseId, toolName) {
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

export function setToolState(card, text, kind) {
  const label = card.querySelector(".tool-state");
  label.textContent = text;
  card.dataset.state = kind || "";
}

export function setToolInput(card, input) {
  card.querySelector(".tool-input").textContent = formatInput(input);
}

export function setToolResult(card, result, isError) {
  card.querySelector(".tool-result").textContent = result === undefined || result === null ? "" : String(result);
  card.classList.toggle("is-error", !!isError);
  setToolState(card, isError ? "error" : "done", isError ? "error" : "done");
}

export function addStep(answer, ev) {
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

export function addTurnUsage(answer, ev) {
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
