// The event types the page handles: the session dialect's (service/transports/stream/payloads.py,
// `SessionPayload`) and the two a session stream makes up for one reader (`heartbeat`, and an
// `error` without an id). An EventSource delivers only the event names it listens for, so a
// type missing here would silently never reach the page. tests/transports/test_web_client.py
// compares this list with the service's, so the two cannot drift apart.
export const EVENT_TYPES = Object.freeze([
  "processing",
  "status_change",
  "assistant_text",
  "reasoning_text",
  "tool_use_start",
  "tool_input_delta",
  "tool_use",
  "tool_executing",
  "tool_result",
  "usage",
  "context_trimmed",
  "plan",
  "step",
  "done",
  "error",
  "tool_approval_request",
  "tool_approval_response",
  "client_tool_request",
  "client_tool_result",
  "conversation_rewound",
  "heartbeat",
]);
