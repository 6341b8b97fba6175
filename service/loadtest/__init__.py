"""``agentstream-load``: drive many concurrent clients at a service (``python -m service.loadtest --help``).

- ``cli``: the command line; ``load``: a run from the path check to the report's figures.
- ``run``: the settings and the state the clients share; ``clients``: the kinds of client (session
  SSE, WebSocket, ``POST /agent/stream``).
- ``checks``: id contiguity and error kinds; ``stats``: timings and percentiles; ``selftest``: the
  path check; ``report``: the progress line, the table, the plot.
- ``sse``: the client-side SSE reader, standard library only, shared with ``scripts/``.

Nothing is imported here but on demand, so that importing ``service.loadtest.sse`` needs no aiohttp.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The console script ``agentstream-load``: see :func:`service.loadtest.cli.main`."""
    from service.loadtest.cli import main as cli_main

    return cli_main(argv)
