#!/usr/bin/python3
"""spoa-ratelimit status page: the agent CPU one request of /status or /status.json costs.

Runs on loopback one Redis and one agent (one process) with a large page to build: 60 rules
(one tier each) whose denials fill every rule's top offenders (11 clients each, 10 shown),
and 10,000 block overrides loaded (keys' whole digests; the page matches each offender
against them). Then, for each path, N requests on fresh connections, one after another, and
the agent's CPU time (user + system, /proc/PID/stat) over them divided by N. /healthz,
answered with two bytes, is the cost of the HTTP exchange itself; /top and /metrics, which
merge the same shared memory, are shown beside for comparison. CPU ticks are 10 ms: the
default N (2000) gives a 5 us resolution; the machine's other work adds noise.

With --keep-alive the N requests of a path go over one connection, as a browser or
Prometheus sends them (the listener closes it after metrics.max_requests: the client opens
another); without, each request opens its own, as curl does.

Usage: tests/tools/status_cost.py [--agent build/spoa-ratelimit] [-n 2000] [--keep-alive]
                                  [--paths /healthz,/status.json,...]
"""
import argparse
import hashlib
import http.client
import os
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "integration"))
import rlharness as rh  # noqa: E402
import spop_client as sc  # noqa: E402

RULES = 60
CLIENTS = 11                    # per rule: one more than the page shows
OVERRIDES = 10000


def cpu_s(pid):
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(port, path, conn=None):
    c = conn or http.client.HTTPConnection(rh.LOCALHOST, port, timeout=5)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError("%s: %d" % (path, r.status))
        return body
    finally:
        if not conn:
            c.close()


def fill(port):
    """Denials for every rule: client k of rule t sends 3 + k requests (1 allowed)."""
    msgs = []
    for t in range(RULES):
        for k in range(CLIENTS):
            msgs += [sc.rl_message(key="cost-%d-%d" % (t, k), tier="t%d" % t)] * (3 + k)
    with sc.SpopClient((rh.LOCALHOST, port), timeout=10) as c:
        c.hello()
        for i in range(0, len(msgs), 64):
            batch = msgs[i:i + 64]
            c.send(b"".join(sc.notify(2 * (i + j) + 1, 1, [m]) for j, m in enumerate(batch)))
            for _ in batch:
                c.recv_frame()
    return len(msgs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"))
    ap.add_argument("-n", type=int, default=2000, help="requests per path")
    ap.add_argument("--keep-alive", action="store_true",
                    help="one connection per path (reopened when the agent closes it)")
    ap.add_argument("--paths", default="/healthz,/status.json,/status,/top,/metrics")
    ap.add_argument("--time-limit", type=int, default=600)
    args = ap.parse_args()
    h = rh.Harness("rl-status-cost-", args.time_limit)
    try:
        redis, rport = rh.start_redis(h)
        mport = rh.free_ports(1)[0]
        cfg = {"store": "redis",
               "redis": {"address": "%s:%d" % (rh.LOCALHOST, rport),
                         "command_timeout_ms": 2000, "key_prefix": "rl"},
               "metrics": {"listen": "%s:%d" % (rh.LOCALHOST, mport)},
               "limits": {"r%d" % t: {"rate": 1, "period": "1h"} for t in range(RULES)},
               "tiers": {"t%d" % t: {"limits": ["r%d" % t]} for t in range(RULES)},
               "default_tier": "t0",
               "anonymous": {"limits": ["r0"]},
               "overrides": {"max_entries": OVERRIDES}}
        agent, port, _ = rh.start_agent(h, args.agent, cfg)
        until = int(time.time()) + 3600
        for i in range(OVERRIDES):
            digest = hashlib.sha256(b"blocked-%d" % i).hexdigest()[:32]
            rh.redis_cmd(rport, "HSET", "rl:{ovr}:overrides", "block:k:" + digest,
                         "until=%d by=cost reason=load" % until)
        rh.redis_cmd(rport, "HINCRBY", "rl:{ovr}:overrides", "version", 1)
        sent = fill(port)
        deadline = time.monotonic() + 10
        while b'"entries":%d' % OVERRIDES not in get(mport, "/status.json"):
            if time.monotonic() > deadline:
                raise RuntimeError("the overrides were not loaded")
            time.sleep(0.1)
        print("agent: %d rules, %d decisions sent, %d overrides loaded; %d requests per path"
              " on %s" % (RULES, sent, OVERRIDES, args.n,
                          "one kept-alive connection" if args.keep_alive else
                          "fresh connections"))
        for path in args.paths.split(","):
            size = len(get(mport, path))
            conn = http.client.HTTPConnection(rh.LOCALHOST, mport, timeout=5) \
                if args.keep_alive else None
            c0 = cpu_s(agent.pid)
            for _ in range(args.n):
                get(mport, path, conn)
            us = (cpu_s(agent.pid) - c0) / args.n * 1e6
            if conn:
                conn.close()
            print("%-14s %7.0f us agent CPU per request  %7d bytes" % (path, us, size))
    except Exception:
        h.keep = True
        h.dump_logs()
        raise
    finally:
        h.close()


if __name__ == "__main__":
    main()
