FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGENT_HOST=0.0.0.0 \
    AGENT_PORT=8080 \
    AGENT_DATA_DIR=/data

WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY service ./service
RUN pip install --no-cache-dir . \
    && groupadd --system --gid 10001 agentstream \
    && useradd --system --uid 10001 --gid 10001 --no-create-home agentstream \
    && mkdir /data && chown 10001:10001 /data

# The embedded SQLite database (AGENT_DATABASE_URL unset); mount a volume here to keep it.
VOLUME ["/data"]

USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('AGENT_PORT', '8080') + '/healthz', timeout=2)"]
CMD ["python", "-m", "service"]
