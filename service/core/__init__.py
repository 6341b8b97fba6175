"""The event core: canonical events, event logs, sessions and runs. No transport, no provider."""
