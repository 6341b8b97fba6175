// The API key form: shown when the server refuses the page (no key, or a key it does not take);
// a key typed there is kept for this tab and the page starts over with it. A signed-in person's
// token that expires or is refused shows the form's message saying so, rather than failing.

import { SIGNIN_EXPIRED, dropUserToken, useKey, whenUnauthorized } from "./api.js";
import { teardown } from "./connection.js";
import { boot } from "./sessions.js";
import { state } from "./state.js";
import { setPhase, ui } from "./view.js";

function askForKey(message) {
  teardown();
  if (state.userToken || state.signInExpired) {
    // A signed-in person's token (handed by the app) expired or was refused: say so, also to
    // the requests that were under way with it.
    dropUserToken();
    state.signInExpired = true;
    message = SIGNIN_EXPIRED;
  } else if (state.apiKey) {
    useKey(null);
    message = message || "That API key was refused. Enter another one.";
  }
  state.token = null;
  ui.authMessage.textContent = message || "This server needs an API key.";
  ui.auth.hidden = false;
  setPhase("closed", message === SIGNIN_EXPIRED ? "signed out" : "API key needed");
  ui.apiKey.focus();
}

export function initAuth() {
  whenUnauthorized(askForKey);
  ui.auth.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = ui.apiKey.value.trim();
    if (!key) return;
    useKey(key);
    state.signInExpired = false;
    ui.apiKey.value = "";
    ui.auth.hidden = true;
    boot();
  });
}
