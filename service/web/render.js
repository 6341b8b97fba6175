// The view is a pure function of the session's event log: every event with an id is applied
// once (ids at or below `lastEventId` are ignored), so a reload replays the log from id 0 and
// ends up exactly where a page that watched live would be, with no text repeated. A purged log
// comes back as a snapshot instead (`renderSnapshot`). What only the stream says (heartbeats,
// an error without an id) is connection.js's business and never comes here.

import { closeApproval, dropApprovals, showApproval } from "./approvals.js";
import { emptyUsage, state } from "./state.js";
import {
  addStep, addTurnUsage, addUserMessage, appendAnswerText, currentAnswer, finishAnswer, newAnswer,
  part, resetView, setAnswerState, setToolInput, setToolResult, setToolState, toolCard,
} from "./transcript.js";
import { keepInView, make, notice, readUsage, updateControls, updateUsage, usageText } from "./view.js";

let onRunEnded = () => {};

// Who hears that a query ended (the side list shows when each chat was last updated).
export function whenRunEnded(handler) {
  onRunEnded = handler;
}

// One session event, applied once. Returns nothing; never throws.
export function applyEvent(ev) {
  if (!ev || typeof ev.type !== "string") return;
  const id = typeof ev.id === "number" ? ev.id : null;
  if (id !== null && id <= state.lastEventId) return; // already on screen
  try {
    const handler = Object.hasOwn(HANDLERS, ev.type) ? HANDLERS[ev.type] : null;
    if (handler) handler(ev);
    updateControls();
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
  state.usageRun = emptyUsage();
  updateUsage();
}

function endRun(answer, label, usage) {
  finishAnswer(answer, label);
  finishRunUsage(usage);
  dropApprovals();
  state.running = false;
  onRunEnded(); // coalesced by the side list while a replay goes by
}

// What each type of logged event does to the view; types not named here change nothing.
const HANDLERS = {
  processing(ev) {
    if (state.answer) finishAnswer(state.answer, "interrupted");
    addUserMessage(ev.message || "");
    newAnswer(ev.run_id);
    state.usageRun = emptyUsage();
    state.running = true;
  },
  tool_approval_request: showApproval,
  tool_approval_response: closeApproval,
  status_change(ev) {
    if (ev.status === "running" || ev.status === "waiting") state.running = true;
    else if (ev.status === "cancelled" && state.answer) setAnswerState(state.answer, "cancelling…");
  },
  assistant_text(ev) {
    state.textEvents += 1;
    const answer = currentAnswer();
    appendAnswerText(answer, ev.text);
    setAnswerState(answer, "writing…");
  },
  reasoning_text(ev) {
    const answer = currentAnswer();
    const box = part(answer, ".reasoning");
    box.hidden = false;
    box.querySelector(".reasoning-text").append(document.createTextNode(ev.text || ""));
    setAnswerState(answer, "reasoning…");
  },
  tool_use_start(ev) {
    setToolState(toolCard(ev.toolUseId, ev.toolName), "writing input…", "input");
    setAnswerState(currentAnswer(), "calling " + (ev.toolName || "a tool") + "…");
  },
  tool_input_delta(ev) {
    const card = toolCard(ev.toolUseId, ev.toolName);
    card.querySelector(".tool-input").append(document.createTextNode(ev.delta || ""));
  },
  tool_use(ev) {
    const card = toolCard(ev.toolUseId, ev.toolName);
    setToolInput(card, ev.toolInput);
    setToolState(card, "ready", "ready");
  },
  tool_executing(ev) {
    setToolState(toolCard(ev.toolUseId, ev.toolName), "running…", "running");
  },
  tool_result(ev) {
    setToolResult(toolCard(ev.toolUseId, ev.toolName), ev.result, ev.isError);
  },
  usage(ev) {
    state.usageRun = readUsage(ev.total_usage || ev.usage);
    addTurnUsage(currentAnswer(), ev);
    updateUsage();
  },
  plan(ev) {
    const plan = part(currentAnswer(), ".plan");
    plan.hidden = false;
    plan.replaceChildren(make("div", "plan-label", "Plan"), make("div", "plan-text", ev.plan || ""));
    state.usageRun = readUsage(ev.usage);
    updateUsage();
  },
  step(ev) {
    addStep(currentAnswer(), ev);
  },
  done(ev) {
    const answer = currentAnswer();
    const flags = [];
    if (ev.cancelled) { flags.push("cancelled"); answer.dataset.cancelled = "true"; }
    if (ev.truncated) flags.push("truncated (max tokens)");
    if (ev.max_turns_reached) flags.push("stopped at the turn limit");
    const turns = ev.turns ? ev.turns + (ev.turns === 1 ? " turn" : " turns") + " · " : "";
    part(answer, ".answer-usage").textContent = turns + "This answer: " + usageText(ev.usage);
    endRun(answer, flags.length ? flags.join(", ") : "done", ev.usage);
  },
  // A logged error ends the query.
  error(ev) {
    const answer = currentAnswer();
    const failure = part(answer, ".answer-error");
    failure.hidden = false;
    failure.textContent = "Error" + (ev.code ? " (" + ev.code + ")" : "") + ": " + (ev.message || "the query failed");
    answer.dataset.error = ev.code || "error";
    endRun(answer, "failed", ev.usage);
  },
};

// A user's own words (not a tool result carried in a user message).
function isUserText(message) {
  return message && message.role === "user" && Array.isArray(message.content)
    && message.content.some((b) => typeof b.text === "string") && !message.content.some((b) => b.toolResult);
}

// Rebuild the view from a purge snapshot: {status, messages, current_query, usage,
// pending_approvals}, as of log id `lastId`.
export function renderSnapshot(snapshot, lastId) {
  const hadView = state.lastEventId > 0; // a page that only just opened the session lost nothing
  resetView();
  const messages = Array.isArray(snapshot && snapshot.messages) ? snapshot.messages : [];
  const current = snapshot ? snapshot.current_query : null;
  let end = messages.length;
  if (current) {
    // The running query's own messages are in the log already; show them from current_query.
    for (let i = messages.length - 1; i >= 0; i--) {
      if (isUserText(messages[i])) { end = i; break; }
    }
  }
  showMessages(messages.slice(0, end));
  if (state.answer) finishAnswer(state.answer, "done");
  const session = readUsage(snapshot && snapshot.usage);
  if (current) showCurrentQuery(current, snapshot);
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

// Finished exchanges, from the conversation's messages.
function showMessages(messages) {
  for (const message of messages) {
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
}

// The query still running when the snapshot was taken, its pending approvals included.
function showCurrentQuery(current, snapshot) {
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
