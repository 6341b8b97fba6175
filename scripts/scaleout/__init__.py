"""``bench_scaleout.py``'s parts: the service scaled out on Redis, measured from one client.

- ``cluster``: the configurations, their service processes, the Redis server, the CPU meter.
- ``readers``: the SSE subscribers and what they read; the service calls the scenarios check with.
- ``scenarios``: throughput (many sessions) and fan-out (one session, many subscribers).
- ``rounds``: the configurations in alternation, medians over the rounds, the cost of Redis.
- ``report``: the table.
"""
