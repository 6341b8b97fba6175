"""agentstream: streams an LLM agent's work live over SSE and WebSocket."""
