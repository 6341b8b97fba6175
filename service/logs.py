"""Logging: plain text by default, or one JSON object per line with the session and run ids.

The ids travel in context variables: a request sets the session it names, a run sets its own
ids before its task starts (a task copies the context it was created in), so every line logged
while serving that session or running that query carries them, even from deep in a provider.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time

from opentelemetry import trace

session_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("session_id", default="")
run_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("run_id", default="")


class ContextFilter(logging.Filter):
    """Put the current session and run ids on every record, and the current span's trace and span
    ids when traces are on (service.telemetry): a log line leads to its place in the trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = session_id_var.get()
        record.run_id = run_id_var.get()
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            record.trace_id = trace.format_trace_id(span.trace_id)
            record.span_id = trace.format_span_id(span.span_id)
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "session_id", "run_id", "trace_id"?, "span_id"?,
    "exc"?}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "session_id": getattr(record, "session_id", "") or None,
            "run_id": getattr(record, "run_id", "") or None,
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line["trace_id"], line["span_id"] = trace_id, getattr(record, "span_id", "")
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs each request its parser refuses (an oversized header, a control character in
    one, a broken request line) at ERROR with a traceback, although the client got its 400 and the
    fault is the client's: a client could flood the log that way. Such a record becomes one
    WARNING line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if record.name == "aiohttp.server" and isinstance(exc, HttpProcessingError):
            record.msg = "refused a malformed request: %s"
            record.args = (f"{type(exc).__name__}: {exc.message}",)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


MALFORMED_REQUESTS = MalformedRequestFilter()


def quiet_malformed_requests() -> None:
    """Install :class:`MalformedRequestFilter` on aiohttp's server logger (once)."""
    logger = logging.getLogger("aiohttp.server")
    if MALFORMED_REQUESTS not in logger.filters:
        logger.addFilter(MALFORMED_REQUESTS)


def configure(log_format: str = "text", level: str = "INFO") -> None:
    """Set up the root logger for ``python -m service``."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
