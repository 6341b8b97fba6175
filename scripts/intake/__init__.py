"""``bench_concurrency.py --paced``: hundreds of paced ``POST /agent/stream`` runs on one pinned
core, the service of this tree beside its ``--baseline`` and a bare aiohttp relay (the floor), and
optionally the service with ``--workers N`` on Redis.

- ``relay``: the bare relay, a script of its own (frames in, SSE out, nothing else);
- ``targets``: the processes under test, each with an emulator of its own;
- ``batch``: one batch of paced runs against one target, and its figures;
- ``compare``: the alternating rounds, the medians, the ratios;
- ``report``: the table.
"""
