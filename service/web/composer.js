// The composer: send a message (Send, or Enter without Shift), cancel the query in flight.

import { api, errorText, sessionPath } from "./api.js";
import { follow } from "./connection.js";
import { sessionLost } from "./sessions.js";
import { refresh as refreshSideList } from "./sidelist.js";
import { state } from "./state.js";
import { notice, ui, updateControls } from "./view.js";

async function sendMessage() {
  const text = ui.message.value;
  if (!text.trim() || !state.sessionId || state.sending) return;
  state.sending = true;
  updateControls();
  try {
    const reply = await api("POST", sessionPath("/messages"), { content: text });
    if (reply.status === 202) {
      refreshSideList(); // the first query names the chat
      ui.message.value = "";
      notice("");
      state.running = true;
      follow();
    } else if (reply.status === 409) {
      notice("A query is already running in this session; wait for it to finish or cancel it.", "warn");
    } else if (reply.status === 404) {
      notice("The session had ended; a new one was started. Send again.", "warn");
      await sessionLost();
    } else if (reply.status !== 401) {
      notice("Could not send: " + errorText(reply), "error");
    }
  } catch (_) {
    notice("Could not reach the server; the message was not sent.", "error");
  } finally {
    state.sending = false;
    updateControls();
  }
}

async function cancelQuery() {
  if (!state.sessionId) return;
  ui.cancel.disabled = true;
  try {
    const reply = await api("POST", sessionPath("/cancel"));
    if (reply.ok && reply.data.cancelled === false) notice("Nothing was running.");
    else if (!reply.ok && reply.status !== 401) notice("Could not cancel: " + errorText(reply), "error");
  } catch (_) {
    notice("Could not reach the server to cancel.", "error");
  }
  updateControls();
}

export function initComposer() {
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });
  ui.message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendMessage();
    }
  });
  ui.cancel.addEventListener("click", cancelQuery);
}
