"""Run the model emulator standalone.

    python -m service.emulator --host 127.0.0.1 --port 8081 --ttft-ms 200 --tokens-per-second 20

then point the service at it with ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME=http://127.0.0.1:8081``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aiohttp import web

from service.emulator.records import DEFAULT_MAX_RECORDS
from service.emulator.script import DEFAULT_ANSWER_TOKENS
from service.emulator.server import LISTEN_BACKLOG, EmulatorConfig, create_emulator_app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m service.emulator",
        description="Serve a scripted model over Bedrock's ConverseStream wire format.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first frame")
    parser.add_argument(
        "--tokens-per-second", type=float, default=0.0, help="pace of the deltas; 0 = unpaced"
    )
    parser.add_argument("--default-tokens", type=int, default=DEFAULT_ANSWER_TOKENS)
    parser.add_argument("--max-records", type=int, default=DEFAULT_MAX_RECORDS)
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--record-token-times",
        action="store_true",
        help="keep when each token left the model in its record (token_times), for benchmarks",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until interrupted."""
    args = parse_args(argv)
    config = EmulatorConfig(
        ttft_ms=args.ttft_ms,
        tokens_per_second=args.tokens_per_second,
        default_tokens=args.default_tokens,
        max_records=args.max_records,
        record_token_times=args.record_token_times,
    )
    kwargs = {} if args.access_log else {"access_log": None}
    web.run_app(
        create_emulator_app(config),
        host=args.host,
        port=args.port,
        backlog=LISTEN_BACKLOG,
        handler_cancellation=True,
        shutdown_timeout=2.0,
        **kwargs,
    )


if __name__ == "__main__":
    main()
