"""Test support: a real redis-server per session or per test, and the service in its own processes."""
