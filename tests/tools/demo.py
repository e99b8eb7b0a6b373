#!/usr/bin/python3
"""spoa-ratelimit demo: two gateways, two agents, one Redis, one shared budget.

    /usr/bin/python3 tests/tools/demo.py --agent build/spoa-ratelimit     (or: make demo)

Starts on free loopback ports: redis-server, the stand-in upstream (haproxy/upstream.cfg),
two agents (each with its own config, same Redis) and two HAProxy gateways running the
unmodified haproxy/haproxy.cfg. Then one API key sends requests alternately through both
gateways. With per-gateway counters each gateway would admit the full limit; with the
shared Redis budget the two together admit exactly the limit.

Exit status: 0 when the total admitted equals the limit (limit + 1 is accepted only if the
run lasted long enough for the bucket to refill one token), 1 otherwise, 2 when the setup
could not be started. Bounded to 30 s; every process started is stopped on exit.
"""

import argparse
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rlharness as rh  # noqa: E402

TIME_LIMIT = 30
LIMIT = 20                 # requests per minute, the bucket holds LIMIT tokens
PERIOD_S = 60
DAY_LIMIT = 100000
API_KEY = "demo-free-key"
SPOE_TIMEOUT = "100ms"

RL_HEADERS = ("RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining",
              "RateLimit-Reset")
FAIL_OPEN_HEADERS = ("X-RateLimit-Agent-Error", "X-RateLimit-Degraded")


def agent_config(redis_port):
    return {
        "log_level": "notice",
        "store": "redis",
        "redis": {
            "address": "%s:%d" % (rh.LOCALHOST, redis_port),
            "connect_timeout_ms": 200,
            "command_timeout_ms": 50,
            "key_prefix": "rl",
        },
        "limits": {
            "free_minute": {"rate": LIMIT, "period": "1m", "burst": LIMIT},
            "free_day": {"rate": DAY_LIMIT, "period": "1d"},
            "anon_minute": {"rate": 600, "period": "1m"},
        },
        "tiers": {"free": {"limits": ["free_minute", "free_day"]}},
        "default_tier": "free",
        "anonymous": {"limits": ["anon_minute"], "ipv6_prefix": 64},
        "response": {"legacy_headers": True},
    }


def wait_gateway(client, timeout):
    """Until a request through the gateway is decided by the agent (RateLimit-Policy
    present). The probe is anonymous (limited per source address, anon_minute): the demo
    key's budget stays untouched."""
    def ok():
        r = client.get("/")
        return r.status == 200 and r.h("RateLimit-Policy") and not r.h("X-RateLimit-Agent-Error")
    rh.poll(ok, timeout, 0.1, "a rate-limited answer from gateway port %d" % client.port)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"),
                    help="agent binary (default: build/spoa-ratelimit)")
    ap.add_argument("--requests", type=int, default=60, help="requests to send (default 60)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    rh.setup_stdout()
    agent_bin = os.path.abspath(args.agent)
    if not os.access(agent_bin, os.X_OK):
        print("agent binary %s not found: run `make` first" % agent_bin, file=sys.stderr)
        return 2
    nreq = max(1, min(args.requests, 1000))

    h = rh.Harness("rl-demo-", TIME_LIMIT)
    h.keep = args.keep
    rc = rh.run_guarded(h, lambda: run(h, agent_bin, nreq))
    if rc != 0 and not args.keep:
        print("(rerun with --keep to keep the process logs and configs)", file=sys.stderr)
    return rc


def run(h, agent_bin, nreq):
    t_start = time.monotonic()
    interval = PERIOD_S / LIMIT
    print("spoa-ratelimit demo: one API key, two gateways, one shared budget")
    print("=" * 72)
    print("setup")

    # ---- start everything
    tier_map = h.tmp / "tiers.map"
    tier_map.write_text("%s free\n" % API_KEY)
    _, redis_port = rh.start_redis(h)
    _, up_port = rh.start_upstream(h)
    agents, gws = [], []
    for i in (1, 2):
        _, port, _ = rh.start_agent(h, agent_bin, agent_config(redis_port), name="agent%d" % i)
        agents.append(port)
    for i in (1, 2):
        _, port = rh.start_gateway(h, "gateway%d" % i, agents[i - 1], up_port, tier_map,
                                   SPOE_TIMEOUT)
        gws.append(port)
    clients = [rh.Client(p) for p in gws]
    for c in clients:
        wait_gateway(c, max(1.0, 12 - (time.monotonic() - t_start)))
    print("  redis, upstream, 2 agents, 2 gateways started on loopback; ready in %.1f s"
          % (time.monotonic() - t_start))
    print("  (each gateway answered an anonymous probe with RateLimit headers: its agent"
          " is UP)")
    print()
    print("  client --+--> gateway 1  HAProxy :%-5d --SPOE--> agent 1 :%-5d --+" % (gws[0], agents[0]))
    print("           |                                                        +--> Redis :%d" % redis_port)
    print("           +--> gateway 2  HAProxy :%-5d --SPOE--> agent 2 :%-5d --+" % (gws[1], agents[1]))
    print("                both gateways forward admitted requests to the upstream :%d" % up_port)
    print()
    print("  tier \"free\" = free_minute: %d requests per 1m (burst %d)  +  free_day: %d per 1d"
          % (LIMIT, LIMIT, DAY_LIMIT))
    print("  API key %r is in the tier map of both gateways; SPOE timeout %s, fail-open"
          % (API_KEY, SPOE_TIMEOUT))
    print("  HAProxy %s, haproxy/haproxy.cfg unmodified; agent %s"
          % (rh.haproxy_version(), os.path.relpath(agent_bin, rh.REPO)
             if agent_bin.startswith(str(rh.REPO)) else agent_bin))
    print()

    # ---- drive the key through both gateways alternately
    results = []          # (n, gateway index, Response)
    first_admit_t = None
    t0 = time.monotonic()
    for n in range(1, nreq + 1):
        g = (n - 1) % 2
        r = clients[g].get("/", {"X-API-Key": API_KEY})
        if r.status == 200 and first_admit_t is None:
            first_admit_t = time.monotonic()
        results.append((n, g, r))
    elapsed = time.monotonic() - t0
    for c in clients:
        c.close()

    admitted = [[0, 0], [0, 0]]       # per gateway: [admitted, denied]
    other = []
    fail_open = 0
    for n, g, r in results:
        if r.status == 200:
            admitted[g][0] += 1
        elif r.status == 429:
            admitted[g][1] += 1
        else:
            other.append((n, g, r.status))
        if any(r.h(x) for x in FAIL_OPEN_HEADERS):
            fail_open += 1
    total_ok = admitted[0][0] + admitted[1][0]
    total_denied = admitted[0][1] + admitted[1][1]

    print("run: %d requests with X-API-Key: %s, alternating gateway 1 / 2, in %.2f s"
          % (nreq, API_KEY, elapsed))
    line = "".join("#" if r.status == 200 else ("." if r.status == 429 else "?")
                   for _, _, r in results)
    for i in range(0, len(line), 60):
        print("  %3d-%-3d %s" % (i + 1, min(i + 60, len(line)), line[i:i + 60]))
    print("          # admitted (200)   . denied (429)   odd: gateway 1, even: gateway 2")
    print()
    print("  RateLimit-Remaining as each response reported it (one counter, both gateways):")
    shown = [(n, g, r) for n, g, r in results if n <= 4 or LIMIT - 2 <= n <= LIMIT + 2]
    prev = 0
    for n, g, r in shown:
        if n != prev + 1:
            print("      ...")
        prev = n
        print(("    #%-3d gateway %d  %d  remaining=%-3s %s" % (
            n, g + 1, r.status, r.h("RateLimit-Remaining"),
            ("Retry-After=%s" % r.h("Retry-After")) if r.status == 429 else "")).rstrip())
    print()

    print("result")
    print("  %-12s %9s %14s" % ("", "admitted", "denied (429)"))
    for g in (0, 1):
        print("  %-12s %9d %14d" % ("gateway %d" % (g + 1), admitted[g][0], admitted[g][1]))
    print("  %-12s %9d %14d" % ("total", total_ok, total_denied))
    if other:
        print("  other statuses: %s" % ", ".join("#%d gw%d: %d" % o for o in other))
    print()

    # Tokens the bucket can have regained since the first admitted request.
    since = (time.monotonic() - first_admit_t) if first_admit_t else 0.0
    refill = int(since // interval)
    tolerance = min(1, refill)
    print("  configured limit (free_minute burst)       %4d" % LIMIT)
    print("  admitted through both gateways together    %4d" % total_ok)
    print("  per-gateway counters would have admitted   %4d  (2 x %d: each gateway its own"
          " bucket)" % (2 * LIMIT, LIMIT))
    if fail_open:
        print("  responses that failed open (agent error / Redis degraded): %d" % fail_open)

    keys = sorted(k for k in rh.redis_cmd(redis_port, "KEYS", "rl:*") or [] if "{k:" in k)
    print("  Redis keys of the API key (one per limit, or in key layout 2 one per principal"
          " with an entry per limit; written by both agents; the principal is a digest):")
    for k in keys[:4]:
        v = rh.redis_cmd(redis_port, "GET", k) if ":v2:{" in k else None
        fields = [e.partition("=")[0] for e in v.split("|")[1:]] if v else []
        print("    %s%s" % (k, "  (limits: %s)" % ", ".join(fields) if fields else ""))
    print()

    # ---- sample headers
    print("sample responses")
    ok_sample = next(((n, g, r) for n, g, r in results if r.status == 200), None)
    deny_sample = next(((n, g, r) for n, g, r in results if r.status == 429), None)
    if ok_sample:
        n, g, r = ok_sample
        print("  admitted response (#%d via gateway %d):" % (n, g + 1))
        print_headers(r)
    if deny_sample:
        n, g, r = deny_sample
        print("  denied response (#%d via gateway %d):" % (n, g + 1))
        print_headers(r, ("Retry-After",) + RL_HEADERS + ("Content-Type",))
        print("    body: %s" % r.body.decode(errors="replace"))

    # ---- verdict
    problems = []
    if deny_sample:
        r = deny_sample[2]
        missing = [x for x in ("Retry-After",) + RL_HEADERS if not r.h(x)]
        if missing:
            problems.append("the 429 lacks %s" % ", ".join(missing))
    elif nreq > LIMIT:
        problems.append("no request was denied")
    if ok_sample:
        missing = [x for x in RL_HEADERS if not ok_sample[2].h(x)]
        if missing:
            problems.append("the admitted response lacks %s" % ", ".join(missing))
    if other:
        problems.append("%d responses were neither 200 nor 429" % len(other))
    expected = min(LIMIT, nreq)
    if total_ok == expected and nreq <= LIMIT:
        verdict = "all within the budget (send more than %d to see denials)" % LIMIT
    elif total_ok == expected:
        verdict = "exactly the limit, one budget shared by both gateways"
    elif nreq > LIMIT and LIMIT < total_ok <= LIMIT + tolerance:
        verdict = ("limit + %d: the run lasted %.1f s since the first admitted request, and"
                   " the bucket refills one token every %.0f s" % (total_ok - LIMIT, since,
                                                                   interval))
    else:
        problems.append("admitted %d, expected %d%s" % (
            total_ok, expected, " (or %d after a refill)" % (LIMIT + tolerance) if tolerance
            else ""))
        verdict = None
    print("-" * 72)
    if problems:
        for p in problems:
            print("FAIL: %s" % p)
        return 1
    print("PASS: %d of %d requests admitted, limit %d: %s." % (total_ok, nreq, LIMIT,
                                                                verdict))
    print("(total %.1f s)" % (time.monotonic() - t_start))
    return 0


def print_headers(r, names=None):
    print("    HTTP %d" % r.status)
    if names is None:
        names = RL_HEADERS
    for name in names:
        v = r.h(name)
        if v is not None:
            print("    %s: %s" % (name, v))
    for name in FAIL_OPEN_HEADERS:
        v = r.h(name)
        if v is not None:
            print("    %s: %s" % (name, v))


if __name__ == "__main__":
    sys.exit(main())
