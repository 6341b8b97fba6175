// "Check connection": does anything between this page and the server hold streams back?

import { authHeaders } from "./api.js";
import { notice, ui } from "./view.js";

// Reads GET /selftest/stream: ticks written interval_ms apart, each stamped with the server's
// clock. Ticks that arrive together although written apart mean a proxy buffers the stream;
// a Content-Encoding means it was compressed; the lag is how far behind the page reads.
async function checkConnection(ticks, intervalMs) {
  const url = "/selftest/stream?ticks=" + ticks + "&interval_ms=" + intervalMs;
  const started = Date.now();
  const response = await fetch(url, { headers: authHeaders(), cache: "no-store" });
  if (!response.ok) throw new Error("HTTP " + response.status);
  const encoding = response.headers.get("content-encoding");
  const { arrivals, ended } = await readTicks(response.body.getReader());
  const gaps = arrivals.slice(1).map((tick, i) => tick.at - arrivals[i].at);
  const bunched = gaps.filter((gap) => gap < intervalMs / 4).length;
  const lags = arrivals.map((tick) => tick.at - tick.ts).sort((a, b) => a - b);
  return {
    ticks: arrivals.length,
    ended,
    buffered: gaps.length > 0 && bunched > gaps.length / 2,
    compressed: Boolean(encoding && encoding !== "identity"),
    lagMs: lags.length ? Math.round(lags[Math.floor(lags.length / 2)]) : null,
    tookMs: Date.now() - started,
  };
}

// Each tick's arrival time and the server's time for it, and whether the closing `end` came.
async function readTicks(reader) {
  const decoder = new TextDecoder();
  const arrivals = [];
  let buffer = "";
  let ended = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const now = Date.now();
    buffer += decoder.decode(value, { stream: true });
    const blocks = buffer.split(/\r\n\r\n|\n\n/);
    buffer = blocks.pop();
    for (const block of blocks) {
      const data = block.split(/\r?\n/).find((line) => line.startsWith("data:"));
      if (!data) continue;
      const payload = JSON.parse(data.slice(5));
      if (payload.type === "tick") arrivals.push({ at: now, ts: payload.ts * 1000 });
      if (payload.type === "end") ended = true;
    }
  }
  return { arrivals, ended };
}

function verdict(result) {
  const problems = [];
  if (!result.ended) problems.push("the stream was cut before its end");
  if (result.buffered) problems.push("something on the way buffers streams (answers will arrive in bursts)");
  if (result.compressed) problems.push("something on the way compresses streams");
  if (problems.length) return { text: "Connection check: " + problems.join("; ") + ".", kind: "error" };
  const lag = result.lagMs !== null ? " (about " + Math.max(0, result.lagMs) + " ms behind the server)." : ".";
  return { text: "Connection check: streams arrive live, unbuffered and uncompressed" + lag, kind: "info" };
}

// The button runs the check and tells the user; `onResult` gets the figures of a check that ran.
export function initSelftest(onResult) {
  ui.selftest.addEventListener("click", async () => {
    ui.selftest.disabled = true;
    notice("Checking the connection to the server…");
    try {
      const result = await checkConnection(10, 100);
      const { text, kind } = verdict(result);
      notice(text, kind);
      onResult(result);
    } catch (error) {
      notice("Connection check failed: " + error.message, "error");
    } finally {
      ui.selftest.disabled = false;
    }
  });
}
