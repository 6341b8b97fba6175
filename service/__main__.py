"""``python -m service`` (and the ``agentstream`` console script): start the service.

``agentstream db upgrade`` instead brings the session database (``AGENT_DATABASE_URL``) up to
the newest migration and exits, for operators who migrate before they roll out.
"""

from __future__ import annotations

import argparse
import sys

from service.config import SettingsError, load_settings
from service.errors import AgentStreamError
from service.logs import configure as configure_logging
from service.workers import Supervisor, serve


def db_command(argv: list[str]) -> None:
    """``agentstream db upgrade [--revision R]``: migrate the database and exit."""
    parser = argparse.ArgumentParser(prog="agentstream db", description="Manage the session database.")
    commands = parser.add_subparsers(dest="command", required=True)
    upgrade = commands.add_parser("upgrade", help="apply the migrations (AGENT_DATABASE_URL)")
    upgrade.add_argument("--revision", default="head", help="the revision to reach (default: the newest)")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as error:
        print(f"agentstream: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    url = settings.database()
    if not url:
        print("agentstream: AGENT_DATABASE_URL is empty: there is no database to upgrade", file=sys.stderr)
        raise SystemExit(2)
    import asyncio

    from service.db.migrate import upgrade_url

    try:
        before, after = asyncio.run(upgrade_url(url, args.revision))
    except Exception as error:  # noqa: BLE001 - any failure is reported, with its kind, and exits 1
        print(f"agentstream: the upgrade failed: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"database upgraded from {before or 'empty'} to {after}")


def main(argv: list[str] | None = None) -> None:
    """Parse ``--host``/``--port``/``--workers``, validate the settings, and serve until stopped."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["db"]:
        db_command(argv[1:])
        return
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
