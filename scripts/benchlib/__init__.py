"""The benchmark scripts' shared harness (not a benchmark itself).

- ``procs``: child processes (pinned to a core when asked), free ports, waiting for a URL, a
  process's CPU time and memory from ``/proc``, and a :class:`~benchlib.procs.Meter` over them.
- ``stack``: the emulator and the service as one unit; a git ref checked out for ``--baseline``.
- ``baseline``: ``--baseline``'s trees (current, baseline) and its ratios, every one above 1 when
  the current tree is better.
- ``api``: what a benchmark asks of the service: sessions, messages, the whole log.
- ``streams``: the benchmark clients' reads (SSE replays, WebSocket replays, idle connections,
  ``POST /agent/stream``), all on the one client-side SSE reader, ``service/loadtest/sse.py``.
- ``stats``: percentiles, medians, ratios.

The scripts run as ``python scripts/<name>.py``, with ``scripts/`` first on ``sys.path``; this
package puts the checkout next, so that the scripts read with this checkout's ``service`` package
rather than an installed copy of another.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))
