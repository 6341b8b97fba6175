"""``bench_scaleout.py``'s table, from its result (the ``--json`` output, or ``--show FILE``)."""

from __future__ import annotations

import argparse
from typing import Any

from scaleout.cluster import CONFIGS


def fmt(value: Any, spec: str = "") -> str:
    """A figure for the table: ``-`` for none, a list as ``a/b/c``."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(fmt(v, spec) for v in value)
    return format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    """Print the tables and the warnings of a result."""
    configs = result["configs"]
    args = argparse.Namespace(**result["parameters"])
    print(
        f"scale-out benchmark ({result['service_version']}): {result['cpus']} CPUs, median of {result['rounds']} round(s), "
        f"gc tuning {'on' if result['gc_tuning'] else 'off'}, "
        f"Redis {'private' if result['private_redis'] else 'shared'} {result['redis_url'] or '-'}"
    )
    if "throughput" in args.scenarios:
        print(
            f"\n1. throughput: {args.sessions} sessions x {args.tokens} unpaced tokens, one SSE subscriber each (in c on the other instance)"
        )
        print(
            f"  {'configuration':22} {'events/s':>9} {'delivered':>10} {'expected':>10} {'svc us/ev':>9} {'redis us/ev':>11} {'client cpu':>10}"
        )
        for name, config in configs.items():
            r = config.get("throughput") or {}
            if "error" in r or "error" in config:
                print(f"  {name} {config['label']:20} error: {r.get('error') or config.get('error')}")
                continue
            print(
                f"  {name} {config['label']:20} {fmt(r.get('events_per_s'), ',d'):>9} {fmt(r.get('events_delivered')):>10} "
                f"{fmt(r.get('events_expected')):>10} {fmt(r.get('service_cpu_us_per_event')):>9} "
                f"{fmt(r.get('redis_cpu_us_per_event')):>11} {fmt(r.get('client_cpu')):>10}"
            )
    if "fanout" in args.scenarios:
        print(
            f"\n2. fan-out: 1 session, {args.fanout_tokens} tokens at {args.tps}/s, {args.subscribers} SSE subscribers "
            f"round-robin over the instances, {args.parsed} parse; latency = read - ts, ms"
        )
        print(
            f"  {'configuration':22} {'p50':>7} {'p99':>7} {'max':>7} {'svc us/ev':>9} {'redis us/ev':>11} {'incomplete':>10} {'client cpu':>10}"
        )
        for name, config in configs.items():
            r = config.get("fanout") or {}
            if "error" in r or "error" in config:
                print(f"  {name} {config['label']:20} error: {r.get('error') or config.get('error')}")
                continue
            lat = r.get("latency_ms") or {}
            print(
                f"  {name} {config['label']:20} {fmt(lat.get('p50')):>7} {fmt(lat.get('p99')):>7} {fmt(lat.get('max')):>7} "
                f"{fmt(r.get('service_cpu_us_per_event')):>9} {fmt(r.get('redis_cpu_us_per_event')):>11} "
                f"{fmt(r.get('incomplete_parsers')):>10} {fmt(r.get('client_cpu')):>10}"
            )
            for where, lat in (r.get("latency_ms_by_instance") or {}).items():
                if lat:
                    print(f"    {where:20} {fmt(lat['p50']):>7} {fmt(lat['p99']):>7} {fmt(lat['max']):>7}")
    cost = result.get("cost_of_redis_b_vs_a")
    if cost:
        print("\n3. cost of Redis per event (b: 1 instance on Redis, against a: 1 instance in memory)")
        for scenario in ("throughput", "fanout"):
            c = cost.get(f"{scenario}_service_cpu_us_per_event")
            if c:
                extra = cost.get(f"{scenario}_service_plus_redis_cpu_ratio")
                print(
                    f"  {scenario:10} service CPU per event: {c['memory']} -> {c['redis']} us (x{c['ratio']}); "
                    f"service + Redis: x{fmt(extra)}"
                )
        if "throughput_events_per_s_ratio" in cost:
            print(f"  throughput events/s, Redis / memory: {cost['throughput_events_per_s_ratio']}")
        if "fanout_latency_ms" in cost:
            parts = [
                f"{q} {v['memory']} -> {v['redis']} ms ({v['difference']:+})"
                for q, v in cost["fanout_latency_ms"].items()
            ]
            print("  fan-out latency: " + ", ".join(parts))
    for name, config in configs.items():
        if CONFIGS[name][2] and not config.get("redis_keys_under_prefix"):
            print(
                f"  warning: {name} left no keys under its AGENT_REDIS_PREFIX: was the service on Redis at all?"
            )
        for scenario in ("throughput", "fanout"):
            r = config.get(scenario) or {}
            if r.get("events_expected") is not None and r.get("events_delivered") != r.get("events_expected"):
                print(
                    f"  warning: {name} {scenario}: {r['events_delivered']} events delivered, {r['events_expected']} expected"
                )
            endings = r.get("query_endings") or ({r["query_ending"]: 1} if "query_ending" in r else {})
            if any(key != "done" for key in endings):
                print(f"  warning: {name} {scenario}: queries ended {endings}")
            if r.get("non_200_subscribers"):
                print(
                    f"  warning: {name} {scenario}: {r['non_200_subscribers']} subscribers got no stream: "
                    f"{r.get('non_200_by_status')} {r.get('non_200_sample')}"
                )
            if r.get("subscribers_connected_after_first_token"):
                print(
                    f"  warning: {name} {scenario}: {r['subscribers_connected_after_first_token']} subscribers connected after the first token (raise the ttft)"
                )
