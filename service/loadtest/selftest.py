"""The path check: read ``GET /selftest/stream`` and say whether something between this client and
the service buffers the stream, compresses it or cuts idle streams."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from service.loadtest.checks import QueryFailed, error_kind
from service.loadtest.sse import SSEParser
from service.loadtest.stats import median, pct


async def selftest(
    http: aiohttp.ClientSession, url: str, ticks: int = 20, interval_ms: int = 50, idle_ms: int = 2000
) -> dict[str, Any]:
    """Read ``GET /selftest/stream`` and judge the path: buffering, compression, idle cut, lag.

    Returns the findings with ``problems`` (a list, empty when the path is clean) and ``lines``,
    one verdict per check.
    """
    ticks = max(3, ticks)
    query = f"?ticks={ticks}&interval_ms={interval_ms}&idle_ms={idle_ms}"
    arrivals: list[tuple[int, float, float]] = []  # (n, server ts, arrival wall clock)
    ended = False
    broken: str | None = None
    encoding = None
    responded = False
    timeout = (ticks * interval_ms + idle_ms) / 1000 + 30
    started = time.time()
    try:
        async with asyncio.timeout(timeout):
            async with http.get(url.rstrip("/") + "/selftest/stream" + query) as response:
                if response.status != 200:
                    body = (await response.text())[:200]
                    raise QueryFailed(f"GET /selftest/stream answered {response.status}: {body}")
                responded = True
                encoding = response.headers.get("Content-Encoding")
                parser = SSEParser()
                async for chunk in response.content.iter_any():
                    at = time.time()
                    for name, _, data in parser.feed(chunk):
                        if name == "tick":
                            tick = json.loads(data)
                            arrivals.append((tick["n"], tick["ts"], at))
                        elif name == "end":
                            ended = True
    except QueryFailed as exc:
        return _unavailable(str(exc))
    except TimeoutError:
        broken = f"no end within {timeout:.0f} s"
    except (aiohttp.ClientError, OSError) as exc:
        if not responded:
            return _unavailable(error_kind(exc))
        broken = error_kind(exc)
    cut_after = time.time() - started
    return judge_selftest(arrivals, ticks, interval_ms, idle_ms, encoding, ended, broken, cut_after)


def _unavailable(why: str) -> dict[str, Any]:
    return {"available": False, "problems": [why], "lines": [f"selftest unavailable: {why}"]}


def judge_selftest(
    arrivals: list[tuple[int, float, float]],
    ticks: int,
    interval_ms: int,
    idle_ms: int,
    encoding: str | None,
    ended: bool,
    broken: str | None,
    elapsed: float,
) -> dict[str, Any]:
    """The verdicts of a selftest from what arrived when (see :func:`selftest`)."""
    problems: list[str] = []
    lines: list[str] = []
    # Buffering: ticks written interval_ms apart that arrive together, or an arrival lag that grows.
    regular = [
        (b[1] - a[1], b[2] - a[2])
        for a, b in zip(arrivals, arrivals[1:], strict=False)
        if b[0] == a[0] + 1 and b[0] != ticks  # the last tick follows the idle pause
    ]
    lags = [(at - ts) * 1000 for _, ts, at in arrivals]
    bursts = sum(1 for written, arrived in regular if written > 0.005 and arrived < 0.2 * written)
    growth = 0.0
    if len(lags) >= 4:
        quarter = max(1, len(lags) // 4)
        growth = median(lags[-quarter:]) - median(lags[:quarter])
    buffering = bool(regular) and (bursts * 3 > len(regular) or growth > max(3 * interval_ms, 500))
    if len(regular) < 2:
        lines.append(f"buffering:   unknown: only {len(arrivals)} tick(s) arrived")
        problems.append("buffering unknown")
    elif buffering:
        problems.append("buffering")
        lines.append(
            f"buffering:   BUFFERED: {bursts} of {len(regular)} ticks written {interval_ms} ms apart "
            f"arrived together; arrival lag grew {growth:.0f} ms"
        )
    else:
        arrived = median([gap for _, gap in regular]) * 1000
        lines.append(
            f"buffering:   ok: ticks written {interval_ms} ms apart arrived a median {arrived:.1f} ms apart "
            f"({bursts} bunched of {len(regular)}); lag grew {growth:.1f} ms"
        )
    # Compression.
    if encoding:
        problems.append("compressed")
        lines.append(f"compression: COMPRESSED (Content-Encoding: {encoding}); events may be held back")
    else:
        lines.append("compression: ok: no Content-Encoding")
    # Idle streams cut.
    idle_cut = False
    if ended:
        lines.append(f"idle:        ok: the stream stayed open through a {idle_ms} ms pause")
    else:
        seen = arrivals[-1][0] if arrivals else 0
        why = broken or "closed"
        if seen == ticks - 1:
            idle_cut = True
            problems.append("idle streams cut")
            lines.append(
                f"idle:        CUT: the stream ended ({why}) {elapsed:.1f} s in, during the {idle_ms} ms "
                "idle pause"
            )
        else:
            problems.append("stream broken")
            lines.append(f"idle:        BROKEN: the stream ended ({why}) after tick {seen} of {ticks}")
    lag = {"p50": pct(lags, 0.5), "max": max(lags)} if lags else {"p50": None, "max": None}
    if lags:
        lines.append(
            f"lag:         p50 {lag['p50']:.1f} ms, max {lag['max']:.1f} ms (arrival - server ts; "
            "includes any clock offset between the hosts)"
        )
    return {
        "available": True,
        "ticks_received": len(arrivals),
        "ticks": ticks,
        "interval_ms": interval_ms,
        "idle_ms": idle_ms,
        "buffering": buffering,
        "bunched_ticks": bursts,
        "lag_growth_ms": round(growth, 3),
        "compressed": bool(encoding),
        "content_encoding": encoding,
        "idle_cut": idle_cut,
        "ended": ended,
        "lag_ms": {k: None if v is None else round(v, 3) for k, v in lag.items()},
        "problems": problems,
        "lines": [f"selftest {line}" for line in lines],
    }
