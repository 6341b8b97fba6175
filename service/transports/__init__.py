"""Everything that speaks to clients, by kind and by face.

- ``edge/``: what every face stands on: keys, CORS and hosts, errors, inputs, admission, quotas at
  the door, the context the faces see, and answering approvals.
- ``stream/``: following a log (the follower), the one SSE writer that every SSE face hands its
  projector to, the pumps and outbox that feed WebSocket and MCP clients, and the session
  dialect (the service's own event payload, carried by several faces).
- one folder per face, each with its request models, its projector, its routes and its part of
  the OpenAPI document: ``native/`` (the agent, session and steps dialects, polling, the page),
  ``ws/``, ``mcp/``, ``aisdk/``, ``agui/``, ``openai/``.
- ``openapi/``: the document that merges the faces' fragments.

Faces import the edge and stream packages, never each other (``tests/test_structure.py``).
"""
