#!/usr/bin/python3
"""What a candidate policy costs Redis, and how far a sampled one is from an exact one.

One Redis, one agent at a time (a fresh key prefix each run), the same replayed load in
every run: --clients API keys with Zipf-distributed request counts (weight 1/rank^--zipf),
--requests NOTIFYs in a fixed shuffled order (seeded), sent straight to the agent over 4 SPOP
connections, 64 in flight on each. The enforced policy has local quotas (an accuracy_budget),
so its Redis calls are what an operator who protects Redis with them pays today.

Runs: no candidate; the candidate in mode "exact"; the candidate in mode "sampled" at each
--samples share. For each, from INFO commandstats: the decision script's calls (EVALSHA and
EVAL: round trips) and the Redis time spent in them (usec), per decision; and the candidate's
would-be denials (spoa_ratelimit_candidate_decisions_total) raw and divided by the sample,
against the truth. The limits are daily (nothing refills during a run), so what enforcing the
candidate denies is known from the load alone: a client of n requests, n - 300 of them.
The sampled clients are found afterwards by their candidate limit's state in Redis (its entry
"c:per_day" in the client's key, or its own key in key layout 1): the raw count must be the
truth for them (exact for the sampled clients), the estimate is a sample's.

Standard library only (plus tests/integration/spop_client.py); everything on loopback.
Exit status 0, or 2 when something could not be set up.
"""

import argparse
import hashlib
import os
import random
import re
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlharness as rh  # noqa: E402

sys.path.insert(0, str(rh.REPO / "tests" / "integration"))
import spop_client as sc  # noqa: E402

ENFORCED = {"per_day": {"rate": 100000, "period": "1d", "accuracy_budget": 0.1}}
CAND_RATE = 300
CANDIDATE = {"per_day": {"rate": CAND_RATE, "period": "1d"}}


def load(clients, requests, zipf, seed):
    """The replayed requests: a list of API keys, the same for a given seed."""
    rnd = random.Random(seed)
    weights = [1.0 / (r + 1) ** zipf for r in range(clients)]
    keys = rnd.choices(["cc-%d" % i for i in range(clients)], weights, k=requests)
    return keys


def send_all(port, keys, conns=4, window=64):
    """Every key as one NOTIFY; returns (answers, degraded answers)."""
    clients = [sc.SpopClient((rh.LOCALHOST, port), timeout=10) for _ in range(conns)]
    answered = degraded = 0
    try:
        for c in clients:
            c.hello()
        chunks = [keys[i::conns] for i in range(conns)]
        pos = [0] * conns
        while any(pos[k] < len(chunks[k]) for k in range(conns)):
            sent = []
            for k, c in enumerate(clients):
                batch = chunks[k][pos[k]:pos[k] + window]
                base = pos[k]
                pos[k] += len(batch)
                c.send(b"".join(sc.notify(2 * (base + j) + 1, 1,
                                          [sc.rl_message(key=key, tier="t")])
                                for j, key in enumerate(batch)))
                sent.append(len(batch))
            for k, c in enumerate(clients):
                for _ in range(sent[k]):
                    f = c.recv_frame(10)
                    if f is None or f.type != sc.T_ACK:
                        raise rh.SetupError("no ACK from the agent: %r" % (f,))
                    answered += 1
                    if sc.ack_vars(f.payload).get("degraded"):
                        degraded += 1
    finally:
        for c in clients:
            c.close()
    return answered, degraded


def commandstats(port):
    """{command: (calls, usec)} from INFO commandstats."""
    info = rh.redis_cmd(port, "INFO", "commandstats")
    info = info.decode() if isinstance(info, bytes) else info
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^cmdstat_([a-z|_]+):calls=(\d+),usec=(\d+)", info, re.M)}


def metrics(port):
    """The agent's /metrics as {(name, labels): value}."""
    with urllib.request.urlopen("http://%s:%d/metrics" % (rh.LOCALHOST, port), timeout=5) as r:
        body = r.read().decode()
    out = {}
    for line in body.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def family(ms, name, **labels):
    """Sum of the samples of <name> whose labels include <labels>."""
    want = ['%s="%s"' % kv for kv in labels.items()]
    return sum(v for (n, l), v in ms.items() if n == name and all(w in l for w in want))


def principal(key):
    """The Redis principal of API key <key>: "k:" and 32 hex digits of its SHA-256."""
    return "k:" + hashlib.sha256(key.encode()).hexdigest()[:32]


def has_state(port, prefix, principal, field):
    """Whether Redis holds a state for limit <field> of <principal>: an entry in the
    principal's key "<prefix>:v2:{<principal>}" (key layout 2, the default), or the limit's
    own key "<prefix>:{<principal>}:<field>" (layout 1)."""
    v = rh.redis_cmd(port, "GET", "%s:v2:{%s}" % (prefix, principal))
    if v and ("|%s=" % field) in v:
        return True
    return bool(rh.redis_cmd(port, "EXISTS", "%s:{%s}:%s" % (prefix, principal, field)))


def one_run(h, args, redis_port, keys, name, mode):
    mport = rh.free_ports(1)[0]
    # a generous command timeout and no spoe_timeout: every decision reaches Redis, none
    # is degraded on a busy machine (a degraded one has no candidate verdict)
    cfg = {"log_level": "notice", "store": "redis",
           "redis": {"address": "%s:%d" % (rh.LOCALHOST, redis_port), "key_prefix": name,
                     "command_timeout_ms": 2000},
           "limits": ENFORCED, "tiers": {"t": {"limits": ["per_day"]}}, "default_tier": "t",
           "anonymous": {"limits": ["per_day"]},
           "metrics": {"listen": "%s:%d" % (rh.LOCALHOST, mport)}}
    if mode is not None:
        cfg["candidate"] = dict({"limits": CANDIDATE,
                                 "tiers": {"t": {"limits": ["per_day"]}},
                                 "default_tier": "t",
                                 "anonymous": {"limits": ["per_day"]}}, **mode)
    proc, port, _ = rh.start_agent(h, args.agent, cfg, name="agent-" + name)
    # local quotas start once the heartbeat counted this gateway
    rh.poll(lambda: family(metrics(mport), "spoa_ratelimit_gateways") == 1, 10, 0.1,
            "the gateway counted")
    before = commandstats(redis_port)
    m0 = metrics(mport)
    t0 = time.monotonic()
    answered, degraded = send_all(port, keys)
    took = time.monotonic() - t0
    time.sleep(0.6)                     # counters are published 4 times a second
    m1 = metrics(mport)
    after = commandstats(redis_port)
    h.stop(proc)
    script = [after.get(k, (0, 0))[i] - before.get(k, (0, 0))[i] for i in (0, 1)
              for k in ("evalsha", "eval")]
    sampled = set()
    if mode is not None:
        for k in set(keys):
            if has_state(redis_port, name, principal(k), "c:per_day"):
                sampled.add(k)

    def d(name, **labels):
        return family(m1, name, **labels) - family(m0, name, **labels)
    return {
        "name": name, "answered": answered, "degraded": degraded, "took": took,
        "calls": script[0] + script[1], "usec": script[2] + script[3], "sampled": sampled,
        "would_deny": d("spoa_ratelimit_candidate_decisions_total", result="would_deny"),
        "would_allow": d("spoa_ratelimit_candidate_decisions_total", result="would_allow"),
        "denied_clients": family(m1, "spoa_ratelimit_candidate_denied_clients"),
        "share": None if mode is None else mode.get("sample", 1.0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"))
    ap.add_argument("--clients", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=60000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--samples", default="0.1,0.25,0.5",
                    help="shares of clients of the sampled runs")
    ap.add_argument("--time-limit", type=int, default=600)
    args = ap.parse_args()
    rh.setup_stdout()
    h = rh.Harness("rl-cand-cost-", args.time_limit)
    return rh.run_guarded(h, lambda: run(h, args))


def run(h, args):
    _, redis_port = rh.start_redis(h)
    keys = load(args.clients, args.requests, args.zipf, args.seed)
    print("candidate cost: %d requests of %d keys (Zipf %.2f, seed %d), load average %.1f" % (
        len(keys), args.clients, args.zipf, args.seed, os.getloadavg()[0]))
    print("enforced: per_day 100000/d, accuracy_budget 0.1 (local quotas); candidate: "
          "per_day %d/d" % CAND_RATE)
    runs = [("none", None), ("exact", {})]
    runs += [("s%s" % s.replace(".", ""), {"mode": "sampled", "sample": float(s)})
             for s in args.samples.split(",") if s]
    rows = [one_run(h, args, redis_port, keys, n, m) for n, m in runs]
    per = {}
    for k in keys:
        per[k] = per.get(k, 0) + 1
    truth = sum(max(0, n - CAND_RATE) for n in per.values())
    truth_clients = sum(1 for n in per.values() if n > CAND_RATE)
    print("truth (enforcing the candidate): %d denials of %d clients" % (truth, truth_clients))
    print()
    print("%-6s %6s %9s %9s %8s %8s %10s %9s %8s %13s" % (
        "run", "sample", "calls/dec", "usec/dec", "degraded", "clients", "would_deny",
        "estimate", "error", "deny clients"))
    for r in rows:
        share = r["share"]
        n = r["answered"]
        if share is None:
            print("%-6s %6s %9.3f %9.2f %8d" % (r["name"], "-", r["calls"] / n, r["usec"] / n,
                                                 r["degraded"]))
            continue
        own = sum(max(0, per[k] - CAND_RATE) for k in r["sampled"])
        est = r["would_deny"] / share
        print("%-6s %6g %9.3f %9.2f %8d %8d %10s %9.0f %+7.1f%% %13s" % (
            r["name"], share, r["calls"] / n, r["usec"] / n, r["degraded"], len(r["sampled"]),
            "%d%s" % (r["would_deny"], "" if r["would_deny"] == own else " (!%d)" % own),
            est, 100.0 * (est - truth) / truth if truth else 0,
            "%.0f/%d" % (r["denied_clients"] / share, truth_clients)))
    print()
    print("calls/dec: decision script calls (EVALSHA + EVAL: decisions, grants, reports, "
          "refunds) per decision; usec/dec: Redis time in them per decision.")
    print("clients: clients sampled (with a candidate state in Redis); would_deny: the "
          "candidate's raw count, (!n) when not the truth for its sampled clients; estimate: "
          "would_deny / sample; deny clients: distinct clients it would deny (HyperLogLog) / "
          "sample, and the truth.")
    print("load average at the end %.1f" % os.getloadavg()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
