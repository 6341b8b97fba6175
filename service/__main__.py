"""``python -m service`` (and the ``agentstream`` console script): start the service."""

from __future__ import annotations

import argparse
import gc
import sys

from aiohttp import web

from service.config import Settings, SettingsError, load_settings
from service.errors import AgentStreamError
from service.logs import configure as configure_logging


def main(argv: list[str] | None = None) -> None:
    """Parse ``--host``/``--port``, validate the settings, and serve until stopped."""
    parser = argparse.ArgumentParser(prog="agentstream", description="Start the agentstream service.")
    parser.add_argument("--host", help="address to listen on (overrides AGENT_HOST)")
    parser.add_argument("--port", type=int, help="port to listen on (overrides AGENT_PORT)")
    args = parser.parse_args(argv)
    overrides = {key: value for key, value in (("host", args.host), ("port", args.port)) if value is not None}
    try:
        settings = load_settings(**overrides)
    except SettingsError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    configure_logging(settings.log_format, settings.log_level)
    try:
        _serve(settings)
    except AgentStreamError as error:
        print(f"agentstream: cannot start: {error}", file=sys.stderr)
        raise SystemExit(2) from None


async def _tune_gc(app: web.Application) -> None:
    """Keep the garbage collector from stalling the event loop mid-stream.

    What start-up loaded (botocore's service models, pydantic's schemas) is frozen, so full
    collections never walk it, and collections run less often.
    """
    gc.collect()
    gc.freeze()
    # Young collections 14x rarer than the default (700): under load each full collection
    # otherwise lands mid-stream every second or so (scripts/bench_concurrency.py --compare-gc).
    # Full collections keep the default ratio to young ones: what clients leave behind when they
    # drop (exceptions, tracebacks, closed connections) is cyclic garbage, and with full
    # collections 10x rarer still (the first tuning) a 10-minute soak with 2,000 dropping streams
    # grew the heap from 255 to 538 MiB before it levelled (scripts/soak.py).
    gc.set_threshold(10_000, 10, 10)


def _serve(settings: Settings) -> None:
    from service.app import create_app, server_options

    app = create_app(settings)
    if settings.gc_tuning:
        app.on_startup.append(_tune_gc)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        handler_cancellation=True,
        shutdown_timeout=settings.shutdown_timeout_s,
        access_log=None,
        **server_options(settings),
        print=lambda message: print(
            message.replace("http://", f"agentstream ({settings.provider}) on http://"), flush=True
        ),
    )


if __name__ == "__main__":
    main()
