"""Stores shared by several instances (sessions, event logs and run claims on Redis)."""
