"""Following a log and writing it to clients: the follower, the one SSE writer with its
projectors' interface, the pumps and outbox (WebSocket, MCP), and the session dialect."""
