"""``python -m service`` (and the ``agentstream`` console script): start the service."""

from __future__ import annotations

import argparse
import sys

from service.config import SettingsError, load_settings
from service.errors import AgentStreamError
from service.logs import configure as configure_logging
from service.workers import Supervisor, serve


def main(argv: list[str] | None = None) -> None:
    """Parse ``--host``/``--port``/``--workers``, validate the settings, and serve until stopped."""
    parser = argparse.ArgumentParser(prog="agentstream", description="Start the agentstream service.")
    parser.add_argument("--host", help="address to listen on (overrides AGENT_HOST)")
    parser.add_argument("--port", type=int, help="port to listen on (overrides AGENT_PORT)")
    parser.add_argument(
        "--workers",
        type=int,
        help="processes sharing the port, sessions shared through Redis (overrides AGENT_WORKERS)",
    )
    args = parser.parse_args(argv)
    overrides = {
        key: value
        for key, value in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if value is not None
    }
    try:
        settings = load_settings(**overrides)
    except SettingsError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    configure_logging(settings.log_format, settings.log_level)
    if settings.workers > 1:
        raise SystemExit(Supervisor(settings).run())
    try:
        serve(settings)
    except AgentStreamError as error:
        print(f"agentstream: cannot start: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
