"""``bench_peers.py``'s scenarios, one module each, and the peer servers it measures the service against.

- ``config``: the sizes of every scenario, the targets' names, the service and peer processes.
- ``replay``: replay fan-out over SSE and over WebSocket (scenarios 1 and 2).
- ``live``: one paced answer to many subscribers, SSE, WebSocket or AI SDK (3), read by the client
  processes of ``viewers``.
- ``concurrency``: many paced ``POST /agent/stream`` runs at once (4).
- ``idle``: memory per idle connection (5).
- ``slow``: a subscriber that never reads (6).
- ``servers``: the peers (bare aiohttp-sse, FastAPI + sse-starlette, websockets), run in a process
  of their own with ``bench_peers.py --serve-peer``.
- ``report``: the tables.
"""
