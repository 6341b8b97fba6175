"""Transports: authenticate, validate, subscribe to the core, project, write."""
