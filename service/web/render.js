// The view is a pure function of the session's event log: every event with an id is applied
// once (ids at or below `lastEventId` are ignored), so a reload replays the log from id 0 and
// ends up exactly where a page that watched live would be, with no text repeated. A purged log
// comes back as a snapshot instead (`renderSnapshot`). What only the stream says (heartbeats,
// an error without an id) is connection.js's business and never comes here.

import { closeApproval, closeClientTool, dropApprovals, showApproval, showClientTool } from "./approvals.js";
import { emptyUsage, state } from "./state.js";
import {
  addStep, addTurnUsage, addUserMessage, appendAnswerText, currentAnswer, cutBack, finishAnswer,
  lastUserMessage, newAnswer, part, resetView, setAnswerState, setToolInput, setToolResult,
  setToolState, toolCard,
} from "./transcript.js";
import { keepInView, make, notice, readUsage, updateControls, updateUsage, usageText } from "./view.js";

let onRunEnded = () => {};
let onOutOfStep = () => {};

// Who hears that a query ended (the side list shows when each chat was last updated).
export function whenRunEnded(handler) {
  onRunEnded = handler;
}

// Who reads the session again when an event names a message the view does not show.
export function whenOutOfStep(handler) {
  onOutOfStep = handler;
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
    // A regenerate asks the message on screen again; any other query adds the user's message.
    if (!lastUserMessage(ev.message_id)) addUserMessage(ev.message || "", ev.message_id);
    newAnswer(ev.run_id, ev.reply_id);
    state.usageRun = emptyUsage();
    state.running = true;
  },
  tool_approval_request: showApproval,
  tool_approval_response: closeApproval,
  client_tool_request: showClientTool,
  client_tool_result: closeClientTool,
  // A regenerate, an edit or a rollback (from this tab or any other): the message named and
  // everything after it go, and the session's usage is what the kept answers used.
  conversation_rewound(ev) {
    if (!cutBack(ev.message_id, ev.kept)) {
      // An answer on screen without its id (rebuilt mid-query from a snapshot another instance
      // made, or from a log older than message ids): read the session again, once per rewind,
      // after this event is counted as applied.
      if (state.rereadFor !== ev.id) {
        state.rereadFor = ev.id;
        setTimeout(onOutOfStep, 0);
      } else {
        notice("The conversation was cut back on the server in a way this page cannot show.", "warn");
      }
    }
    state.usageDone = readUsage(ev.usage);
    state.usageRun = emptyUsage();
    updateUsage();
  },
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
    // Stopped before its end: what it wrote is kept, marked `interrupted` in the conversation.
    if (ev.cancelled) { flags.push("interrupted"); answer.dataset.cancelled = answer.dataset.interrupted = "true"; }
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

// The conversation's id of `messages[index]`: its own, or the one the service gives a message
// stored before messages had ids.
function idOf(messages, index) {
  const id = messages[index] && messages[index].id;
  return typeof id === "string" && id ? id : "m" + index;
}

// Rebuild the view from a purge snapshot: {status, messages, current_query, usage,
// pending_approvals, pending_tool_calls}, as of log id `lastId`.
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
  if (state.answer) finishShown(state.answer);
  const session = readUsage(snapshot && snapshot.usage);
  if (current) showCurrentQuery(current, snapshot, end < messages.length ? idOf(messages, end) : "");
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

// An answer rebuilt from the conversation is finished, or was cut short by a cancel.
function finishShown(answer) {
  finishAnswer(answer, answer.dataset.interrupted ? "interrupted" : "done");
}

// Finished exchanges, from the conversation's messages (each keyed by its id, as the events
// would have keyed it: an answer by the id of its first assistant message).
function showMessages(messages) {
  messages.forEach((message, index) => {
    const blocks = Array.isArray(message.content) ? message.content : [];
    if (isUserText(message)) {
      if (state.answer) finishShown(state.answer);
      const text = blocks.filter((b) => typeof b.text === "string").map((b) => b.text).join("\n");
      addUserMessage(text, idOf(messages, index));
      newAnswer("");
      return;
    }
    const answer = currentAnswer();
    if (message.role === "assistant") {
      if (!answer.dataset.messageId) answer.dataset.messageId = idOf(messages, index);
      if (message.interrupted) answer.dataset.cancelled = answer.dataset.interrupted = "true";
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
  });
}

// The query still running when the snapshot was taken, what it waits on included. Its answer's
// id comes with it when the instance answering runs the query; without it, Regenerate asks the
// question again instead, and a rewind naming the answer has the view read again.
function showCurrentQuery(current, snapshot, messageId) {
  addUserMessage(current.message || "", messageId);
  const answer = newAnswer("", typeof current.reply_id === "string" ? current.reply_id : "");
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
  for (const pending of Array.isArray(snapshot.pending_tool_calls) ? snapshot.pending_tool_calls : []) {
    showClientTool(pending);
  }
}
