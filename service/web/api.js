// The service's HTTP API as the page calls it: JSON requests with the API key (when the server
// asked for one), the short-lived token that EventSource and WebSocket URLs carry instead of a
// header, and what to do when the key is refused (the entry module decides: see auth.js).

import { API_KEY_KEY, USER_TOKEN_KEY, state, storageSet } from "./state.js";

export const SIGNIN_EXPIRED = "Your sign-in has expired. Open this page again from your app to sign in afresh.";

let onUnauthorized = () => {};

// Who hears that the server wants a (new) API key; `message` says why, when it is known.
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export function unauthorized(message) {
  onUnauthorized(message);
}

export function authHeaders() {
  const headers = {};
  const credential = state.userToken || state.apiKey;
  if (credential) headers.Authorization = "Bearer " + credential;
  return headers;
}

// When a JWT expires (epoch seconds), read from its payload; 0 when it cannot be read.
export function tokenExpiry(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return Number(JSON.parse(atob(part + "===".slice((part.length + 3) % 4))).exp) || 0;
  } catch (_) {
    return 0;
  }
}

// Forget a signed-in person's token (expired or refused): the page says so instead of failing.
export function dropUserToken() {
  state.userToken = "";
  storageSet("sessionStorage", USER_TOKEN_KEY, null);
}

// The key the user typed, kept for this tab only; null forgets it.
export function useKey(key) {
  state.apiKey = key || "";
  state.token = null;
  storageSet("sessionStorage", API_KEY_KEY, key || null);
}

// `{status, ok, data}`; a body that is not JSON comes back as `{error: body}`.
export async function api(method, path, body) {
  const headers = authHeaders();
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const raw = await response.text();
  let data = null;
  if (raw) {
    try {
      data = JSON.parse(raw);
    } catch (_) {
      data = { error: raw };
    }
  }
  if (response.status === 401) unauthorized();
  return { status: response.status, ok: response.ok, data: data || {} };
}

export function errorText(reply) {
  return (reply.data && reply.data.error) || "HTTP " + reply.status;
}

// A token for EventSource and WebSocket URLs: a signed-in person's own, or a short-lived one
// for the API key; null when none is needed, false when the credential was refused or expired.
export async function streamToken() {
  if (state.userToken) {
    const expiry = tokenExpiry(state.userToken);
    return expiry && expiry * 1000 <= Date.now() ? false : state.userToken;
  }
  if (!state.apiKey) return null;
  if (state.token && state.token.expiresAt * 1000 - Date.now() > 60000) return state.token.value;
  let reply;
  try {
    reply = await api("POST", "/auth/token");
  } catch (_) {
    return null; // unreachable: the connection attempt will fail and retry
  }
  if (reply.status === 401) return false;
  if (!reply.ok || !reply.data.token) return null; // 404: no keys configured, none needed
  state.token = { value: reply.data.token, expiresAt: Number(reply.data.expires_at) || 0 };
  return state.token.value;
}

export function withToken(url, token) {
  if (!token) return url;
  return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
}

export function sessionPath(suffix) {
  return "/sessions/" + encodeURIComponent(state.sessionId) + (suffix || "");
}
