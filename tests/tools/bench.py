#!/usr/bin/python3
"""spoa-ratelimit benchmark: what a decision costs, against the real Redis ceiling.

    /usr/bin/python3 tests/tools/bench.py --agent build/spoa-ratelimit     (or: make bench)

Everything runs on loopback on this machine, one setup after the other (only the setup
under test is running, plus what drives it). Every agent runs with the default settings of
a production configuration (command_timeout_ms, breaker, failure ladder), one GCRA limit
so high that nothing is denied (rate = burst = 10^9 per second), and keys of its tier.

Rows:

  A  wrk -> HAProxy -> upstream, without SPOE: a temporary copy of haproxy.cfg without the
     `filter spoe` and `send-spoe-group` lines and the agents' backend;
  B  the same with the agent, store = "allow" (the null agent: answers allow, no Redis);
  C  the same with the agent deciding against Redis (exact: one EVALSHA per request).
     A, B and C each at light load (wrk -t1 -c1 --latency) and in throughput (wrk -t2
     -c32 --latency); logging is removed from the copies of haproxy.cfg. A wrk script
     counts, in every response, X-RateLimit-Degraded, X-RateLimit-Agent-Error and
     non-200 statuses.
  N  HAProxy's example agent (spoa-example), the reference null agent, driven over SPOP
     by spop-load paced at --rate (4 connections x 32 in flight; open loop: a 1 ms clock
     sends what is due, one NOTIFY per connection in turn): only if installed.
  D  the agent with store = "allow", the same load.
  E  the agent deciding against Redis, the same load. Before it, the argv of one of its
     EVALSHA calls is captured with MONITOR and checked against the argv P sends.
  G  row E in key layout 2 (redis.key_layout = 2: one key per client, lua/state.lua).
  K  row E with a concurrency limit beside the rate limit: a slot taken in each decision's
     call and given back by the response message, which spop-load -L sends after each ACK
     naming a slot, as HAProxy does; Redis script calls per decision against row E's.
  R  row E against a 3-master Redis Cluster of its own (no replicas): Redis CPU summed
     over the masters per decision, and script calls per decision, against row E's.
  U  row E at a third of its rate, on the same Redis: the rate each master of row R sees.
  T  row E over TLS (a Redis of its own with --tls-port).
     E, R, U and T run again, interleaved, for --rounds in all (3): the ratios R / E,
     R / U and T / E are taken within each round and their median is the figure (a single
     run moves with whatever else the machine does); the agent's CPU of row E likewise.
  W  /status.json asked 1,000 times a second by two threads, on the agent of row E's
     setup: first alone (its idle CPU measured before and subtracted), on fresh connections
     and on kept-alive ones: agent CPU per request; then with row E's paced load, on fresh
     connections: SPOP p99 against row E's (the ratio W / E).
  P  redis-benchmark -P 32 -c 8 of the agent's EVALSHA (script body of
     build/gen/ratelimit.lua, same argv: key shape, alg, a, b, shadow, cost as the agent
     computes them; 1000 keys): the script's ceiling on this Redis.
  Q  the same for the seed's naive token bucket (HMGET tokens/ts, refill, HSET, EXPIRE;
     SEED_LUA below), the reference the scripts are compared against.
  F  the same for the floor of a one-decision script (FLOOR_LUA: TIME, GET, SET PX and
     nothing else): what P cannot go below, so F / Q bounds P / Q.
  M  the same for our script's multi form, 32 decisions a call (each one limit, its own
     key), as the agent sends them under load: Redis CPU per decision.
  S  sustained: spop-load paced (-r) at stepped rates against a fresh exact agent each
     step, with the default command timeout; the highest rate answered with 0 degraded
     answers (and nothing unanswered).
  L  Redis memory per client in each key layout: 100,000 clients of a tier of 100/s and
     1,000,000/day, each decided once by the script on an empty Redis of its own; again
     on Valkey when valkey-server is installed (or VALKEY_BIN names one).

CPU per decision: utime + stime of the agent (and its workers), of Redis and of HAProxy
read from /proc/PID/stat before and after the measured run, divided by the decisions
(requests, calls) of that run. A row with degraded answers, SPOE errors or unanswered
requests is marked: it is not a throughput figure.

The ratios of the targets are printed at the end, each with PASS or FAIL.

Exit status: 0 when every setup ran (whatever the numbers), 2 on a setup failure,
130 when interrupted. Bounded to about 4 minutes; every process started is stopped on exit.
"""

import argparse
import hashlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import pathlib
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rlharness as rh  # noqa: E402

API_KEY = "bench"
BIG = 10 ** 9
LIMIT = "bench_second"
FLAGS = "2#" + LIMIT                # the flags argument of the limit in key layout 2
KEY_PREFIX = "bench"
ALG_GCRA = 1
DEFAULT_COMMAND_TIMEOUT_MS = 5      # src/config/config.c: what the agents here run with
MULTI_D = 32                        # decisions a call in row M (the agent's batch_max)
BENCH_KEYS = 1000                   # distinct API keys / Redis keys in the SPOP and -P runs

# The seed's script: the naive token bucket the issue compares our scripts against.
# KEYS[1] the bucket; ARGV rate (tokens/s), burst, cost. Time from Redis, like ours.
SEED_LUA = r"""
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1]) or burst
local ts = tonumber(s[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local ok = 0
if tokens >= cost then
  tokens = tokens - cost
  ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return {ok, math.floor(tokens)}
"""

# The least any one-decision script of a TIME-based limit does: read the clock, read the
# key, write it back with a TTL. Row F: the floor of a call of the single form, so P / F
# says how much our script adds to it, and F / Q the best P / Q any such script can reach.
FLOOR_LUA = r"""
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], t[1], 'PX', 1000)
return {1, 1, tonumber(t[1])}
"""

# Counts the responses that carry the headers that matter, in every wrk run (the same
# cost for every setup, so the rows stay comparable).
COUNT_LUA = r"""
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) n = 0; non200 = 0; agent_error = 0; degraded = 0; ratelimit = 0 end
function response(status, headers, body)
  n = n + 1
  if status ~= 200 then non200 = non200 + 1 end
  for k, v in pairs(headers) do
    local l = string.lower(k)
    if l == "x-ratelimit-agent-error" then agent_error = agent_error + 1
    elseif l == "x-ratelimit-degraded" then degraded = degraded + 1
    elseif l == "ratelimit-policy" then ratelimit = ratelimit + 1 end
  end
end
function done(summary, latency, requests)
  local t = {n = 0, non200 = 0, agent_error = 0, degraded = 0, ratelimit = 0}
  for _, th in ipairs(threads) do
    for k, _ in pairs(t) do t[k] = t[k] + (th:get(k) or 0) end
  end
  io.write(string.format("RLCOUNT n=%d non200=%d agent_error=%d degraded=%d ratelimit=%d\n",
    t.n, t.non200, t.agent_error, t.degraded, t.ratelimit))
end
"""


# ---------------------------------------------------------------------------------------
# CPU from /proc

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return text[text.rindex(")") + 2:].split()     # fields 3.. of proc(5)


def _children(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if int(_stat_fields(int(d))[1]) == pid:
                kids.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def cpu_s(pid):
    """utime + stime of <pid> and its live descendants, in seconds (0 if gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = _stat_fields(p)
            total += int(f[11]) + int(f[12])
        except (OSError, ValueError, IndexError):
            continue
        todo += _children(p)
    return total / CLK_TCK


class CpuMeter:
    """CPU seconds spent by named processes between start() and stop()."""

    def __init__(self, procs):
        self.procs = {k: p for k, p in procs.items() if p is not None}

    def start(self):
        self.t0 = {k: cpu_s(p.pid) for k, p in self.procs.items()}

    def stop(self):
        return {k: cpu_s(p.pid) - self.t0[k] for k, p in self.procs.items()}


def us_per(cpu, n):
    return {k: v * 1e6 / n for k, v in cpu.items()} if n else {}


# ---------------------------------------------------------------------------------------
# HAProxy configuration copies

SECTION_RE = re.compile(r"^(global|defaults|frontend|backend|listen|peers|resolvers|"
                        r"userlist|program|http-errors|ring|cache|mailers)\b")


def derive_cfg(text, spoe):
    """haproxy.cfg without logging, and without SPOE when <spoe> is false. Every edit is
    checked, so a change in haproxy.cfg makes the benchmark fail instead of silently
    measuring something else."""
    out, removed = [], {"log": 0, "log-format": 0, "filter spoe": 0, "send-spoe-group": 0,
                        "be_rl_agents": 0}
    section = ""
    for line in text.splitlines():
        st = line.strip()
        if SECTION_RE.match(line):
            section = st
        if not spoe and section.startswith("backend be_rl_agents"):
            removed["be_rl_agents"] += 1
            continue
        if st.startswith("log-format"):
            removed["log-format"] += 1
            continue
        if st.startswith("log ") or st == "log":
            removed["log"] += 1
            continue
        if not spoe and st.startswith("filter spoe"):
            removed["filter spoe"] += 1
            continue
        if not spoe and (st.startswith("http-request send-spoe-group") or
                         st.startswith("http-response send-spoe-group")):
            removed["send-spoe-group"] += 1
            continue
        out.append(line)
    need = ["log", "log-format"] + ([] if spoe else ["filter spoe", "send-spoe-group",
                                                     "be_rl_agents"])
    missing = [k for k in need if not removed[k]]
    if missing:
        raise rh.SetupError("haproxy.cfg changed: no %s line to remove" % ", ".join(missing))
    live = [l for l in out if l.strip() and not l.strip().startswith("#")]
    if not spoe and any(re.match(r"\s*(filter\s+spoe|http-request\s+send-spoe)", l)
                        or "be_rl_agents" in l for l in live):
        raise rh.SetupError("the no-SPOE copy of haproxy.cfg still mentions spoe")
    if spoe and not any(l.strip().startswith("filter spoe") for l in live):
        raise rh.SetupError("haproxy.cfg has no `filter spoe` line")
    if any(l.strip().startswith("log") for l in live):
        raise rh.SetupError("a log line survived in the copy of haproxy.cfg")
    return "# derived from haproxy/haproxy.cfg by tests/tools/bench.py\n" + "\n".join(out) + "\n"


def agent_config(store, redis_port):
    """Production defaults (command timeout, breaker, failure ladder) but for the limit,
    which never denies, and keys: every key sent is given the bench tier."""
    return {
        "log_level": "notice",
        "store": store,
        "redis": {
            "address": "%s:%d" % (rh.LOCALHOST, redis_port or 1),
            "key_prefix": KEY_PREFIX,
        },
        "limits": {LIMIT: {"rate": BIG, "period": "1s", "burst": BIG}},
        "tiers": {"bench": {"limits": [LIMIT]}},
        # HAProxy sends the tier of the map; spop-load sends it too (-t): never anonymous
        "unknown_keys": "default_tier",
        "default_tier": "bench",
        "anonymous": {"limits": [LIMIT]},       # required; no request here is anonymous
        "response": {"legacy_headers": True},
    }


# ---------------------------------------------------------------------------------------
# wrk

UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}


def parse_wrk(out):
    def num(pattern, conv=float):
        m = re.search(pattern, out)
        return conv(m.group(1)) if m else None
    res = {"rps": num(r"Requests/sec:\s+([\d.]+)"),
           "requests": num(r"(\d+) requests in", int),
           "non2xx": num(r"Non-2xx or 3xx responses:\s+(\d+)", int) or 0,
           "sock_errors": 0}
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["sock_errors"] = sum(int(x) for x in m.groups())
    for pct, val, unit in re.findall(r"^\s+(50|75|90|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m|h)\s*$",
                                     out, re.M):
        res["p%s" % pct] = float(val) * UNIT_MS[unit]
    m = re.search(r"RLCOUNT (.*)", out)
    if m:
        res["count"] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
    return res


def run_wrk(h, name, port, threads, conns, duration, script, latency=True):
    wrk = rh.which("wrk", "WRK_BIN")
    argv = [wrk, "-t%d" % threads, "-c%d" % conns, "-d%ds" % duration, "--timeout", "2s",
            "-H", "X-API-Key: %s" % API_KEY, "-s", script]
    if latency:
        argv.append("--latency")
    argv.append("http://%s:%d/" % (rh.LOCALHOST, port))
    rc, out = h.run(name, argv, timeout=duration + 20)
    res = parse_wrk(out)
    if rc != 0 or res["rps"] is None or res["requests"] is None or "count" not in res or \
            (latency and not all(("p%d" % p) in res for p in (50, 90, 99))):
        raise rh.SetupError("wrk failed (exit %s):\n%s" % (rc, rh.indent(out)))
    if res["requests"] == 0:
        raise rh.SetupError("wrk completed no request:\n%s" % rh.indent(out))
    return res


def check_response(client, setup):
    """One request; None when it has the shape expected for the setup, else the reason."""
    r = client.get("/", {"X-API-Key": API_KEY})
    if r.status != 200:
        return None, "status %d" % r.status
    if r.h("X-RateLimit-Agent-Error"):
        return None, "X-RateLimit-Agent-Error: %s (SPOE did not get an answer)" % (
            r.h("X-RateLimit-Agent-Error"))
    if r.h("X-RateLimit-Degraded"):
        return None, "X-RateLimit-Degraded: 1 (agent did not reach Redis)"
    if setup in ("A", "B") and (r.h("RateLimit") or r.h("RateLimit-Policy")):
        return None, "unexpected RateLimit headers"
    if setup == "C" and not (r.h("RateLimit") and r.h("RateLimit-Policy")):
        return None, "no RateLimit headers"
    return r, None


def wait_ready(client, setup, timeout):
    """Until several consecutive requests have the expected shape (agent health checks
    passed, SPOE connections up)."""
    deadline = time.monotonic() + timeout
    reason = None
    good, last = 0, None
    for _ in range(int(timeout / 0.05) + 1):
        try:
            r, reason = check_response(client, setup)
        except OSError as e:
            r, reason = None, str(e)
            client.close()
        good = good + 1 if r else 0
        last = r or last
        if good >= 3:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    raise rh.SetupError("setup %s: no good answer after %.0f s (last: %s)" % (
        setup, timeout, reason))


def wrk_row(setup, label, res, cpu):
    c = res["count"]
    return {"setup": setup, "label": label, "rate": res["rps"], "n": res["requests"],
            "p50": res["p50"], "p99": res["p99"], "degraded": c["degraded"],
            "errors": c["agent_error"] + c["non200"] + res["sock_errors"]
            + (res["requests"] - c["n"] if c["n"] < res["requests"] else 0),
            "cpu": us_per(cpu, res["requests"]), "res": res}


def run_http_setup(h, setup, args, agent_bin, up_port, tier_map, cfgs, lua):
    t0 = time.monotonic()
    started = []
    agent = red = None
    try:
        if setup == "C":
            red, redis_port = rh.start_redis(h, "redis-C")
            started.append(red)
        else:
            redis_port = None
        if setup in ("B", "C"):
            agent, aport, _ = rh.start_agent(
                h, agent_bin, agent_config("allow" if setup == "B" else "redis", redis_port),
                name="agent-%s" % setup)
            started.append(agent)
        else:
            aport = 1          # unreferenced: the agents' backend is gone from the copy
        gw, gport = rh.start_gateway(h, "haproxy-%s" % setup, aport, up_port, tier_map,
                                     args.spoe_timeout, cfg_path=cfgs[setup])
        started.append(gw)
        client = rh.Client(gport)
        try:
            r = wait_ready(client, setup, 10)
        finally:
            client.close()
        print("[%s] %s" % (setup, HTTP_SETUPS[setup]))
        print("    ready in %.1f s; check request with X-API-Key: HTTP %d, %s" % (
            time.monotonic() - t0, r.status,
            "no SPOE error header, no RateLimit header (null agent)" if setup == "B" else
            "RateLimit: %s" % r.h("RateLimit") if setup == "C" else "no SPOE in the path"))
        if args.warmup:
            run_wrk(h, "wrk-%s-warmup" % setup, gport, 2, 32, args.warmup, lua, latency=False)
        meter = CpuMeter({"haproxy": gw, "agent": agent, "redis": red})
        rows = []
        for label, threads, conns in (("light", 1, 1), ("throughput", 2, 32)):
            before = rh.agent_stats(h, agent) if agent else None
            meter.start()
            res = run_wrk(h, "wrk-%s-%s" % (setup, label), gport, threads, conns,
                          args.duration, lua)
            cpu = meter.stop()
            row = wrk_row(setup, label, res, cpu)
            c = res["count"]
            extra = ""
            if agent:
                after = rh.agent_stats(h, agent)
                row["agent_degraded"] = after["degraded"] - before["degraded"]
                extra = "; agent: %d NOTIFY, %d degraded" % (
                    after["notify"] - before["notify"], row["agent_degraded"])
                if setup == "C" and after["denied"] != before["denied"]:
                    raise rh.SetupError("setup C denied %d requests: the limit is not high "
                                        "enough" % (after["denied"] - before["denied"]))
            if setup == "C" and c["ratelimit"] < c["n"]:
                row["errors"] += c["n"] - c["ratelimit"]
                extra += "; %d responses without RateLimit headers" % (c["n"] - c["ratelimit"])
            if setup != "C" and c["ratelimit"]:
                raise rh.SetupError("setup %s answered with RateLimit headers" % setup)
            print("    %-10s %8.0f req/s  p50 %s  p99 %s ms  %d responses: %d non-200, %d "
                  "agent errors, %d degraded%s" % (
                      label, res["rps"], fmt_ms(res["p50"]), fmt_ms(res["p99"]), c["n"],
                      c["non200"], c["agent_error"], c["degraded"], extra))
            rows.append(row)
        return rows
    finally:
        for p in reversed(started):
            h.stop(p)


HTTP_SETUPS = {
    "A": "HAProxy only (filter spoe and send-spoe-group removed)",
    "B": 'HAProxy + agent, store = "allow" (null agent, no Redis)',
    "C": "HAProxy + agent + Redis: one EVALSHA per request, nothing denied",
}


# ---------------------------------------------------------------------------------------
# SPOP load, Redis

def spop_load(h, args, name, port, rate, duration, conns=4, pipeline=32, extra=()):
    argv = [str(args.load), "-a", "%s:%d" % (rh.LOCALHOST, port), "-c", str(conns),
            "-p", str(pipeline), "-d", str(duration), "-k", str(BENCH_KEYS), "-K", "key-",
            "-t", "bench"]
    if rate:
        argv += ["-r", "%d" % rate]
    rc, out = h.run(name, argv + list(extra), timeout=duration + 20)
    vals = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    if "decisions" not in vals:
        raise rh.SetupError("%s printed no result (exit %s):\n%s" % (name, rc, rh.indent(out)))
    res = {k: float(v) for k, v in vals.items() if re.match(r"^[0-9.]+$", v)}
    res["out"] = out.strip()
    return res


def spop_row(setup, label, res, cpu, duration):
    n = int(res["decisions"])
    return {"setup": setup, "label": label, "rate": n / duration, "n": n,
            "p50": res.get("p50_ms"), "p99": res.get("p99_ms"),
            "degraded": int(res.get("degraded", 0)),
            "errors": int(res.get("errors", 0)) + int(res.get("unanswered", 0)),
            "cpu": us_per(cpu, n), "res": res}


def print_spop(label, r):
    print("    %-10s %8.0f decisions/s  p50 %s  p99 %s ms  degraded %d, errors/unanswered %d"
          % (label, r["rate"], fmt_ms(r["p50"]), fmt_ms(r["p99"]), r["degraded"], r["errors"]))
    print("               CPU per decision: %s" % fmt_cpu(r["cpu"]))


def find_spoa_example():
    for c in (os.environ.get("SPOA_EXAMPLE_BIN"), shutil.which("spoa-example"),
              shutil.which("spoa_example")):
        if c and os.access(c, os.X_OK):
            return c
    return None


def run_null_reference(h, args):
    """Row N: spoa-example (HAProxy's example agent) as a null agent, if installed."""
    exe = find_spoa_example()
    if not exe:
        print("[N] spoa-example (reference null agent): not available on this machine (not "
              "packaged in Debian; set SPOA_EXAMPLE_BIN to measure one)")
        return None
    print("[N] spoa-example (%s), reference null agent: spop-load -r %d" % (exe, args.rate))
    proc, port = h.start_listening("spoa-example", lambda port: (
        [exe, "-p", port, "-n", "1", "-c", "pipelining"], None))
    try:
        meter = CpuMeter({"agent": proc})
        meter.start()
        res = spop_load(h, args, "spop-load-N", port, args.rate, args.duration)
        row = spop_row("N", "spoa-example", res, meter.stop(), args.duration)
        print_spop("paced", row)
        return row
    finally:
        h.stop(proc)


def run_null_agent(h, args, agent_bin):
    """Row D: our agent with store = "allow", spop-load paced at --rate."""
    print('[D] agent, store = "allow" (null path): spop-load -c4 -p32 -r %d -d %d'
          % (args.rate, args.duration))
    ag, aport, _ = rh.start_agent(h, agent_bin, agent_config("allow", None), "agent-D")
    try:
        meter = CpuMeter({"agent": ag})
        meter.start()
        res = spop_load(h, args, "spop-load-D", aport, args.rate, args.duration)
        row = spop_row("D", 'agent "allow"', res, meter.stop(), args.duration)
        print_spop("paced", row)
        return row
    finally:
        h.stop(ag)


MONITOR_ARG_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def captured_argv(h, args, aport, rport, timeout=5.0):
    """The argv of the first script call the agent sends to Redis for one decision, read
    with MONITOR: [command, sha or body, numkeys, key..., arg...]."""
    with socket.create_connection((rh.LOCALHOST, rport), timeout=timeout) as s:
        s.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        f = s.makefile("rb")
        if f.readline().strip() != b"+OK":
            raise rh.SetupError("MONITOR refused")
        spop_load(h, args, "spop-load-monitor", aport, 0, 2, conns=1, pipeline=1,
                  extra=("-n", "1", "-k", "1"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = f.readline().decode(errors="replace")
            except OSError:
                break
            if not line:
                break
            toks = MONITOR_ARG_RE.findall(line)
            if toks and toks[0].upper() in ("EVALSHA", "EVAL") and len(toks) > 3 and \
                    "{k:" in toks[3]:
                return [re.sub(r"\\(.)", r"\1", t) for t in toks]
    raise rh.SetupError("MONITOR saw no script call from the agent")


def principal_key(api_key, layout=1):
    """The agent's Redis key of <api_key> for the bench limit (src/decide/principal.c), in
    key layout <layout>."""
    digest = hashlib.sha256(api_key.encode()).hexdigest()[:32]
    if layout == 2:
        return "%s:v2:{k:%s}" % (KEY_PREFIX, digest)
    return "%s:{k:%s}:%s" % (KEY_PREFIX, digest, LIMIT)


def gcra_params(model):
    """a and b of the bench limit, as limit_params_init() computes them (limit_model)."""
    out = subprocess.run([str(model), "--params", str(ALG_GCRA), str(BIG), "1000", str(BIG)],
                         capture_output=True, text=True, timeout=10).stdout.split()
    if len(out) != 3 or out[2] != "0":
        raise rh.SetupError("limit_model --params gave %r" % out)
    return int(out[0]), int(out[1])


def degraded_by(stats):
    """The agent's degraded answers by cause, from its stats line ("" if none)."""
    return ", ".join("%s %d" % (k, stats[k]) for k in ("timeout", "overload", "breaker",
                                                       "down", "busy", "error")
                     if stats.get(k))


def print_degraded_by(h, ag):
    """Prints why the agent <ag> answered degraded, if it did."""
    why = degraded_by(rh.agent_stats(h, ag))
    if why:
        print("               degraded by %s" % why)


def run_exact_agent(h, args, agent_bin, rport, red, sha, params, layout=1, third=False):
    """Row E: the agent deciding against Redis, spop-load paced at --rate; its argv checked.
    Row G: the same in key layout 2. Row U (<third>): row E at a third of its rate, the rate
    each master of row R's cluster sees: Redis wakes about as often for a third of the
    decisions, so what a wake-up costs weighs three times more on each (R / U says what the
    cluster adds beyond that, R / E what outgrowing one Redis costs at the same rate)."""
    setup = "U" if third else "E" if layout == 1 else "G"
    if third:
        args = argparse.Namespace(**vars(args))
        args.rate = max(1, args.rate // 3)
    print("[%s] agent + Redis, exact (one GCRA limit, key layout %d%s): spop-load -c4 -p32 "
          "-r %d -d %d" % (setup, layout, ", a third of row E's rate" if third else "",
                           args.rate, args.duration))
    cfg = agent_config("redis", rport)
    cfg["redis"]["key_layout"] = layout
    ag, aport, _ = rh.start_agent(h, agent_bin, cfg, "agent-" + setup)
    if layout == 2:
        params = params[:3] + [FLAGS] + params[4:]
    try:
        time.sleep(0.3)
        if not third:           # the same agent and setup as row E's: checked there
            got = captured_argv(h, args, aport, rport)
            want = ["EVALSHA", sha, "1", principal_key("key-0", layout)] + \
                [str(x) for x in params]
            if got != want:
                raise rh.SetupError("the agent's script call is not what redis-benchmark "
                                    "would send:\n    agent: %s\n    bench: %s" % (got, want))
            print("    agent's call (MONITOR): %s" % " ".join(
                t if len(t) < 48 else t[:12] + "..." for t in got))
        calls0 = script_calls(rport)
        row = paced_row(h, args, setup, "agent exact", ag, aport, red)
        row["calls"] = (script_calls(rport) - calls0) / max(1, row["n"])
        print("               script calls per decision %.3f" % row["calls"])
        return row
    finally:
        h.stop(ag)


def script_calls(port):
    """EVALSHA calls Redis has served (INFO commandstats)."""
    info = rh.redis_cmd(port, "INFO", "commandstats")
    info = info.decode() if isinstance(info, bytes) else info
    m = re.search(r"cmdstat_evalsha:calls=(\d+)", info)
    return int(m.group(1)) if m else 0


def run_cluster_agent(h, args, agent_bin):
    """Row R: row E against a 3-master Redis Cluster (its own, started here): the Redis CPU
    of the three masters summed per decision, against row E's on one Redis."""
    print("[R] agent + 3-master Redis Cluster, exact: spop-load -c4 -p32 -r %d -d %d"
          % (args.rate, args.duration))
    nodes = rh.start_cluster(h, 3, "cluster-R")
    try:
        ag, aport, _ = rh.start_agent(h, agent_bin, agent_config("redis", nodes[0][1]),
                                      "agent-R")
        try:
            time.sleep(0.5)
            # connected to every master before the run: a few decisions, not counted
            spop_load(h, args, "spop-load-R-warm", aport, 0, 2, conns=1, pipeline=1,
                      extra=("-n", "50"))
            calls0 = sum(script_calls(port) for _, port in nodes)
            procs = {"agent": ag}
            procs.update(("redis%d" % i, p) for i, (p, _) in enumerate(nodes))
            meter = CpuMeter(procs)
            meter.start()
            res = spop_load(h, args, "spop-load-R", aport, args.rate, args.duration)
            cpu = meter.stop()
            cpu["redis"] = sum(v for k, v in cpu.items() if k.startswith("redis"))
            row = spop_row("R", "agent exact cluster", res, cpu, args.duration)
            row["calls"] = (sum(script_calls(port) for _, port in nodes) - calls0) / \
                max(1, row["n"])
            print_spop("paced", row)
            print("               script calls per decision %.3f (over the 3 masters)"
                  % row["calls"])
            print_degraded_by(h, ag)
            return row
        finally:
            h.stop(ag)
    finally:
        for p, _ in nodes:
            h.stop(p)


def run_concurrency_agent(h, args, agent_bin, rport, red):
    """Row K: row E with a concurrency limit beside the rate limit (one slot a request,
    taken in the decision's call, given back by the response message: spop-load -L sends
    it as HAProxy does). Its Redis script calls per decision against row E's."""
    print("[K] agent + Redis, exact, rate + concurrency limits, slots given back: "
          "spop-load -c4 -p32 -r %d -d %d -L" % (args.rate, args.duration))
    cfg = agent_config("redis", rport)
    cfg["limits"]["inflight"] = {"concurrency": 1000000, "max_duration": "10s"}
    cfg["tiers"]["bench"]["limits"] = [LIMIT, "inflight"]
    ag, aport, _ = rh.start_agent(h, agent_bin, cfg, "agent-K")
    try:
        time.sleep(0.3)
        calls0 = script_calls(rport)
        meter = CpuMeter({"agent": ag, "redis": red})
        meter.start()
        res = spop_load(h, args, "spop-load-K", aport, args.rate, args.duration, extra=["-L"])
        row = spop_row("K", "agent exact + concurrency", res, meter.stop(), args.duration)
        row["calls"] = (script_calls(rport) - calls0) / max(1, row["n"])
        print_spop("paced", row)
        print("               slots given back %d of %d allowed; script calls per decision "
              "%.3f" % (res.get("release_acks", 0), res.get("allowed", 0), row["calls"]))
        print_degraded_by(h, ag)
        return row
    finally:
        h.stop(ag)


def paced_row(h, args, setup, label, ag, aport, red):
    """spop-load -c4 -p32 paced at --rate on the agent <ag> deciding against <red>: the row,
    CPU of both, and why any answer was degraded."""
    meter = CpuMeter({"agent": ag, "redis": red})
    meter.start()
    res = spop_load(h, args, "spop-load-%s" % setup, aport, args.rate, args.duration)
    row = spop_row(setup, label, res, meter.stop(), args.duration)
    print_spop("paced", row)
    print_degraded_by(h, ag)
    return row


STATUS_FLOOD_RATE = 1000       # /status.json requests a second in row W
STATUS_ALONE_S = 3             # seconds of each flood on an otherwise idle agent


class StatusFlood:
    """Two threads asking /status.json STATUS_FLOOD_RATE times a second in all, on fresh
    connections (curl, a script) or on kept-alive ones (<keep>: browsers, Prometheus; the
    agent closes one after metrics' request bound, the thread opens another)."""

    def __init__(self, port, keep):
        self.port, self.keep = port, keep
        self.stop = threading.Event()
        self.count, self.fails = [0, 0], [0, 0]
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(2)]

    def run(self, i):
        import http.client
        period = 2.0 / STATUS_FLOOD_RATE
        nxt = time.monotonic()
        c = None
        while not self.stop.is_set():
            if c is None:
                c = http.client.HTTPConnection(rh.LOCALHOST, self.port, timeout=2)
            try:
                c.request("GET", "/status.json")
                r = c.getresponse()
                r.read()
                self.count[i] += 1
                self.fails[i] += r.status != 200
            except (OSError, http.client.HTTPException):
                self.fails[i] += 1
                c.close()
                c = None
            if not self.keep and c is not None:
                c.close()
                c = None
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))
        if c is not None:
            c.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def answered(self):
        return sum(self.count)


def status_alone(ag, port, keep, idle_per_s):
    """Agent CPU per /status.json of a flood on the agent <ag> with no decision to make:
    its CPU over STATUS_ALONE_S less what it spends idle (<idle_per_s>), per request."""
    with StatusFlood(port, keep) as fl:
        time.sleep(0.3)
        n0, c0, t0 = fl.answered(), cpu_s(ag.pid), time.monotonic()
        time.sleep(STATUS_ALONE_S)
        n, c, t = fl.answered() - n0, cpu_s(ag.pid) - c0, time.monotonic() - t0
    fails = sum(fl.fails)
    us = (c - idle_per_s * t) * 1e6 / n if n else float("nan")
    print("    %-11s %5.0f /status.json a second answered, %d failed: %.0f us agent CPU"
          " each" % ("kept alive" if keep else "fresh conns", n / t, fails, us))
    return {"us": us, "rate": n / t, "fails": fails}


def run_status_flood(h, args, agent_bin, rport, red):
    """Row W: /status.json asked STATUS_FLOOD_RATE times a second (two threads): what a
    scraper (or an attacker who reaches the metrics listener) costs the agent and its
    decisions. First on the idle agent, alone: its CPU per request (its idle CPU, measured
    just before, subtracted), on fresh connections and on kept-alive ones; then with row E's
    paced load, on fresh connections (the dearer): SPOP p99 against row E's."""
    mport = rh.free_ports(1)[0]
    cfg = agent_config("redis", rport)
    cfg["metrics"] = {"listen": "%s:%d" % (rh.LOCALHOST, mport)}
    print("[W] /status.json asked %d times a second, alone then with E's load" %
          STATUS_FLOOD_RATE)
    ag, aport, _ = rh.start_agent(h, agent_bin, cfg, "agent-W")
    try:
        time.sleep(0.3)
        # as long as each flood: a 10 ms tick over it is 3 us a request either way
        c0, t0 = cpu_s(ag.pid), time.monotonic()
        time.sleep(STATUS_ALONE_S)
        idle = (cpu_s(ag.pid) - c0) / (time.monotonic() - t0)
        print("    idle agent: %.1f ms CPU a second" % (idle * 1e3))
        alone = {keep: status_alone(ag, mport, keep, idle) for keep in (False, True)}
        with StatusFlood(mport, False) as fl:
            time.sleep(0.3)
            n0, t0 = fl.answered(), time.monotonic()
            row = paced_row(h, args, "W", "agent exact, /status flood", ag, aport, red)
            n = fl.answered() - n0
            rate = n / (time.monotonic() - t0)
        row["status_rate"] = rate
        row["status_fails"] = sum(fl.fails)
        row["status_us"] = alone[False]["us"]
        row["status_us_keep"] = alone[True]["us"]
        print("               /status.json: %.0f a second answered meanwhile, %d failed" % (
            rate, row["status_fails"]))
        return row
    finally:
        h.stop(ag)


def make_tls_files(h):
    """A CA and a certificate for 127.0.0.1 it signs (openssl): (ca, crt, key) paths."""
    d = h.tmp / "tls"
    d.mkdir(exist_ok=True)
    ossl = rh.which("openssl", "OPENSSL_BIN")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1\n")
    for argv in (["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                                          "-subj", "/CN=bench CA"],
                 ["req"] + ec + ["-keyout", "redis.key", "-out", "redis.csr",
                                 "-subj", "/CN=redis"],
                 ["x509", "-req", "-in", "redis.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-CAcreateserial", "-out", "redis.crt", "-days", "2", "-extfile", "ext.cnf"]):
        r = subprocess.run([ossl] + argv, cwd=d, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise rh.SetupError("openssl %s: %s" % (argv[0], r.stderr))
    os.chmod(d / "redis.key", 0o600)
    return d / "ca.crt", d / "redis.crt", d / "redis.key"


def run_tls_agent(h, args, agent_bin):
    """Row T: row E with TLS between the agent and Redis (a Redis of its own, --tls-port)."""
    print("[T] agent + Redis over TLS, exact (one GCRA limit): spop-load -c4 -p32 -r %d -d %d"
          % (args.rate, args.duration))
    ca, crt, key = make_tls_files(h)
    tport = rh.free_ports(1)[0]
    red, _ = rh.start_redis(h, "redis-T", extra=(
        "--tls-port", str(tport), "--tls-cert-file", str(crt), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"))
    cfg = agent_config("redis", tport)
    cfg["redis"]["tls"] = {"ca_file": str(ca)}
    ag, aport, _ = rh.start_agent(h, agent_bin, cfg, "agent-T")
    try:
        spop_load(h, args, "spop-load-T-warm", aport, 0, 2, conns=1, pipeline=1,
                  extra=("-n", "20"))
        return paced_row(h, args, "T", "agent exact TLS", ag, aport, red)
    finally:
        h.stop(ag)
        h.stop(red)


MEM_CLIENTS = 100000                # clients of row L


def limit_params(model, alg, rate, period_ms, burst):
    """a and b of a limit, as limit_params_init() computes them (limit_model)."""
    out = subprocess.run([str(model), "--params", str(alg), str(rate), str(period_ms),
                          str(burst)], capture_output=True, text=True, timeout=10).stdout.split()
    if len(out) != 3:
        raise rh.SetupError("limit_model --params gave %r" % out)
    return int(out[0]), int(out[1])


def layout_memory(h, args, script, server=None):
    """Row L: Redis memory per client in each key layout. MEM_CLIENTS clients of a tier
    of 100/s and 1,000,000/day (GCRA "sec", fixed window "day"; API keys' principals),
    each decided once by the script in one layout on an empty Redis of its own:
    used_memory before, just after, and once the per-second states have expired (their
    keys deleted in layout 1; in layout 2 the entry stays in its client's key, which the
    day's entry keeps), divided by the clients. <server>: a Valkey binary instead of
    redis-server (row L on Valkey)."""
    print("[L] %s memory per client, %d clients of 100/s + 1,000,000/day, each decided "
          "once" % ("Valkey" if server else "Redis", MEM_CLIENTS))
    sec = limit_params(args.model, ALG_GCRA, 100, 1000, 100)
    day = (86400 * 10 ** 6, 10 ** 6)
    out = {}
    for layout in (1, 2):
        red, port = rh.start_redis(h, "%s-L%d" % ("valkey" if server else "redis", layout),
                                   server=server)
        try:
            sha = rh.redis_cmd(port, "SCRIPT", "LOAD", script.read_text())
            if layout == 1:
                out["version"] = server_version(port)
                print("    %s" % out["version"])

            def used():
                info = rh.redis_cmd(port, "INFO", "memory")
                info = info.decode() if isinstance(info, bytes) else info
                return int(re.search(r"used_memory:(\d+)", info).group(1))

            def nkeys():
                return int(rh.redis_cmd(port, "DBSIZE"))
            u0 = used()
            with socket.create_connection((rh.LOCALHOST, port), timeout=30) as sock:
                f = sock.makefile("rb")
                for base in range(0, MEM_CLIENTS, 1000):
                    buf = []
                    for i in range(base, min(base + 1000, MEM_CLIENTS)):
                        p = "k:" + hashlib.sha256(b"client-%d" % i).hexdigest()[:32]
                        if layout == 1:
                            keys = ["%s:{%s}:sec" % (KEY_PREFIX, p),
                                    "%s:{%s}:day" % (KEY_PREFIX, p)]
                            flags = ["0", "0"]
                        else:
                            keys = ["%s:v2:{%s}" % (KEY_PREFIX, p)] * 2
                            flags = ["2#sec", "2#day"]
                        argv = ["EVALSHA", sha, "2"] + keys + \
                            [str(ALG_GCRA), str(sec[0]), str(sec[1]), flags[0], "1",
                             "2", str(day[0]), str(day[1]), flags[1], "1"]
                        buf.append(b"*%d\r\n" % len(argv) + b"".join(
                            b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in argv))
                    sock.sendall(b"".join(buf))
                    for _ in buf:
                        r = rh.resp_read(f)
                        if not isinstance(r, list) or r[0] != 1:
                            raise rh.SetupError("row L: the script answered %r" % (r,))
            u1, k1 = used(), nkeys()
            time.sleep(1.5)
            # the per-second states are over: a SCAN of the key space deletes the keys it
            # meets that expired (what Redis's own expiry cycle does, in time)
            cursor = "0"
            while True:
                cursor, _ = rh.redis_cmd(port, "SCAN", cursor, "COUNT", "10000")
                if cursor == "0":
                    break
            u2, k2 = used(), nkeys()
            out[layout] = {"after": (u1 - u0) / MEM_CLIENTS, "expired": (u2 - u0) / MEM_CLIENTS,
                           "keys": (k1, k2)}
            print("    layout %d: %.1f B a client just after (%d keys), %.1f B once the "
                  "per-second states expired (%d keys)" % (layout, out[layout]["after"], k1,
                                                           out[layout]["expired"], k2))
        finally:
            h.stop(red)
    return {"setup": "L", "mem": out}


def server_version(port):
    """"Redis 7.0.15" or "Valkey 9.1.2": what answers on <port> (INFO server)."""
    info = rh.redis_cmd(port, "INFO", "server")
    info = info.decode() if isinstance(info, bytes) else info
    m = re.search(r"valkey_version:(\S+)", info)
    if m:
        return "Valkey " + m.group(1)
    m = re.search(r"redis_version:(\S+)", info)
    return "Redis " + (m.group(1) if m else "?")


def valkey_server():
    """A valkey-server binary (VALKEY_BIN, the PATH, the usual directories), or None."""
    try:
        return rh.which("valkey-server", "VALKEY_BIN")
    except rh.SetupError:
        return None


def redis_bench(h, args, setup, label, rport, red, cmd, decisions=1):
    """redis-benchmark -P 32 -c 8 of <cmd> (with __rand_int__ over BENCH_KEYS keys); CPU
    per decision, <decisions> a call."""
    bench = rh.which("redis-benchmark", "REDIS_BENCHMARK_BIN")
    meter = CpuMeter({"redis": red})
    meter.start()
    t0 = time.monotonic()
    # as many decisions as the single form's rows, within a factor of two
    calls = args.ceiling_calls if decisions == 1 else \
        max(1000, 2 * args.ceiling_calls // decisions)
    rc, out = h.run("redis-benchmark-%s" % setup,
                    [bench, "-p", str(rport), "-P", "32", "-c", "8", "-n",
                     str(calls), "-r", str(BENCH_KEYS), "-q"] + cmd, timeout=120)
    secs = time.monotonic() - t0
    cpu = meter.stop()
    m = re.search(r"([0-9.]+) requests per second", out.replace("\r", "\n"))
    if rc != 0 or not m:
        raise rh.SetupError("redis-benchmark failed (exit %s):\n%s" % (rc, rh.indent(out)))
    # errors: redis-benchmark prints the error reply and goes on
    errors = len(re.findall(r"ERR|NOSCRIPT|WRONGTYPE", out))
    if errors:
        raise rh.SetupError("redis-benchmark got error replies:\n%s" % rh.indent(out[-2000:]))
    n = calls * decisions
    row = {"setup": setup, "label": label, "rate": float(m.group(1)) * decisions, "n": n,
           "p50": None, "p99": None, "degraded": 0, "errors": 0,
           "cpu": us_per(cpu, n), "secs": secs}
    print("    %-12s %8.0f %s/s  Redis CPU %.2f us/%s (%.1f s)" % (
        label, row["rate"], "decisions" if decisions > 1 else "calls", row["cpu"]["redis"],
        "decision" if decisions > 1 else "call", secs))
    return row


def sustained(h, args, agent_bin, rport, red, ceiling):
    """Row S: the highest spop-load -r rate a fresh exact agent (default settings) answers
    with 0 degraded answers and nothing unanswered, searched in args.steps steps of
    args.step seconds, starting at 0.8 x <ceiling> and bisecting."""
    print("[S] sustained exact decisions with 0 degraded (command timeout %d ms, the default):"
          " spop-load -c4 -p128 -r R -d %d, fresh agent per step" % (
              DEFAULT_COMMAND_TIMEOUT_MS, args.step))
    lo, hi, best = 0.0, None, None
    top = min(2 * ceiling, args.max_rate or 2 * ceiling)
    rate = min(0.8 * ceiling, top)
    for i in range(args.steps):
        rate = int(rate)
        ag, aport, _ = rh.start_agent(h, agent_bin, agent_config("redis", rport),
                                      "agent-S%d" % i)
        try:
            # connected to Redis before the step: a few decisions, not counted
            spop_load(h, args, "spop-load-S%d-warm" % i, aport, 0, 2, conns=1, pipeline=1,
                      extra=("-n", "20"))
            meter = CpuMeter({"agent": ag, "redis": red})
            meter.start()
            res = spop_load(h, args, "spop-load-S%d" % i, aport, rate, args.step,
                            pipeline=128)
            cpu = meter.stop()
            why = degraded_by(rh.agent_stats(h, ag))
        finally:
            h.stop(ag)
        row = spop_row("S", "sustained", res, cpu, args.step)
        # clean: nothing degraded or lost, and 99% answered within the deadline
        clean = row["degraded"] == 0 and row["errors"] == 0 and \
            row["n"] >= 0.97 * rate * args.step and \
            row["p99"] is not None and row["p99"] <= DEFAULT_COMMAND_TIMEOUT_MS
        print("    step %d: -r %6d  %6d decisions  p50 %s  p99 %s ms  degraded %d, "
              "unanswered/errors %d  %s" % (
                  i + 1, rate, row["n"], fmt_ms(row["p50"]), fmt_ms(row["p99"]),
                  row["degraded"], row["errors"], "clean" if clean else "NOT clean"))
        if why:
            print("            degraded by %s" % why)
        if clean:
            lo = rate
            if best is None or rate > best["rate"]:
                row["rate"] = rate
                best = row
        else:
            hi = rate
        if hi is None and lo >= top:
            break
        rate = (lo + hi) / 2 if hi is not None else min(lo * 1.25, top)
        if hi is not None and hi - lo < 0.03 * ceiling:
            break
    if best is None:
        print("    no step was clean (lowest tried: %d/s)" % (hi or 0))
        best = {"setup": "S", "label": "sustained", "rate": 0.0, "n": 0, "p50": None,
                "p99": None, "degraded": 0, "errors": 0, "cpu": {}}
    return best


# ---------------------------------------------------------------------------------------

def fmt_ms(v):
    if v is None:
        return "-"
    return "%.3f" % v if v < 10 else "%.1f" % v


def fmt_cpu(cpu):
    return ", ".join("%s %.1f us" % (k, v) for k, v in sorted(cpu.items())) or "-"


def machine():
    try:
        ncpu = len(os.sched_getaffinity(0))        # what nproc prints
    except (AttributeError, OSError):
        ncpu = os.cpu_count() or 0
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = " ".join(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = -1.0
    return ncpu, model, load


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"),
                    help="agent binary (default: build/spoa-ratelimit)")
    ap.add_argument("--load", default=None, help="spop-load binary (default: next to --agent)")
    ap.add_argument("--model", default=None,
                    help="limit_model binary (default: next to --agent)")
    ap.add_argument("--duration", type=int, default=6, help="seconds per measured run (6)")
    ap.add_argument("--warmup", type=int, default=1, help="wrk warm-up seconds (1; 0: none)")
    ap.add_argument("--rate", type=int, default=20000,
                    help="decisions/s of the paced SPOP rows N, D, E (20000)")
    ap.add_argument("--step", type=int, default=3, help="seconds per sustained step (3)")
    ap.add_argument("--steps", type=int, default=5, help="sustained steps at most (5)")
    ap.add_argument("--max-rate", type=int, default=0,
                    help="highest rate the sustained search tries (default: 2 x the -P 32"
                         " ceiling)")
    ap.add_argument("--ceiling-calls", type=int, default=300000,
                    help="calls per redis-benchmark run (300000)")
    ap.add_argument("--spoe-timeout", default="1s",
                    help="SPOE `timeout processing` (default 1s: measure decisions, not"
                         " fail-open; production uses 10ms)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of rows E, R and T, interleaved: their ratios are the "
                         "medians of the rounds (3)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    rh.setup_stdout()
    args.duration = max(1, min(args.duration, 60))
    args.warmup = max(0, min(args.warmup, 30))
    args.step = max(1, min(args.step, 30))
    args.steps = max(1, min(args.steps, 10))
    args.rate = max(100, min(args.rate, 10 ** 6))
    args.ceiling_calls = max(1000, min(args.ceiling_calls, 10 ** 7))
    agent_bin = os.path.abspath(args.agent)
    build = pathlib.Path(agent_bin).parent
    args.load = pathlib.Path(args.load or build / "spop-load").resolve()
    args.model = pathlib.Path(args.model or build / "limit_model").resolve()
    script = build / "gen" / "ratelimit.lua"
    for what, p in (("agent binary", agent_bin), ("spop-load", args.load),
                    ("limit_model", args.model)):
        if not os.access(str(p), os.X_OK):
            print("%s %s not found: run `make all %s` first" % (
                what, p, "build/limit_model" if what == "limit_model" else ""),
                file=sys.stderr)
            return 2
    if not script.exists():
        print("%s not found: run `make` first" % script, file=sys.stderr)
        return 2

    per_wrk = 15 + args.warmup + 2 * (args.duration + 3)
    per_spop = 10 + args.duration
    bound = 115 + 3 * per_wrk + 5 * per_spop + 30 + 2 * 60 + args.steps * (args.step + 8) + \
        max(0, args.rounds - 1) * (4 * per_spop + 40) + per_spop + 10 + 60
    h = rh.Harness("rl-bench-", bound)
    h.keep = args.keep
    return rh.run_guarded(h, lambda: run(h, args, agent_bin, script))


def run(h, args, agent_bin, script):
    t_start = time.monotonic()
    ncpu, model, load = machine()
    print("spoa-ratelimit benchmark: the cost of a decision, against the Redis ceiling")
    print("=" * 92)
    print("machine: nproc %d (%s), load average %.1f at start; HAProxy %s" % (
        ncpu, model, load, rh.haproxy_version()))
    print("the load generators, HAProxy, agents and Redis all share these %d cores (and whatever"
          " else runs):" % ncpu)
    print("compare rows within one run. Agents: default settings (command timeout %d ms), one"
          " GCRA limit" % DEFAULT_COMMAND_TIMEOUT_MS)
    print("of %d/s (burst %d): nothing denied. SPOE timeout %s through HAProxy." % (
        BIG, BIG, args.spoe_timeout))
    print()

    a, b = gcra_params(args.model)
    params = [ALG_GCRA, a, b, 0, 1]        # alg, a, b, shadow, cost: src/store/store_cmd.c

    # ---- A, B, C through HAProxy
    text = rh.HAPROXY_CFG.read_text()
    cfgs = {}
    for s in "ABC":
        p = h.tmp / ("haproxy-%s.cfg" % s)
        p.write_text(derive_cfg(text, spoe=(s != "A")))
        cfgs[s] = p
    tier_map = h.tmp / "tiers.map"
    tier_map.write_text("%s bench\n" % API_KEY)
    lua = h.tmp / "count.lua"
    lua.write_text(COUNT_LUA)
    os.environ["RL_STATS_SOCKET"] = str(h.tmp / "haproxy.sock")    # not the shared default
    up, up_port = rh.start_upstream(h)
    http = {}
    for s in "ABC":
        http[s] = run_http_setup(h, s, args, agent_bin, up_port, tier_map, cfgs, str(lua))
        print()
    h.stop(up)

    # ---- SPOP rows and the Redis ceilings
    rows = {}
    rows["N"] = run_null_reference(h, args)
    print()
    rows["D"] = run_null_agent(h, args, agent_bin)
    print()
    red, rport = rh.start_redis(h, "redis-E")
    sha = rh.redis_cmd(rport, "SCRIPT", "LOAD", script.read_text())
    seed_sha = rh.redis_cmd(rport, "SCRIPT", "LOAD", SEED_LUA)
    rows["E"] = run_exact_agent(h, args, agent_bin, rport, red, sha, params)
    print()
    rows["G"] = run_exact_agent(h, args, agent_bin, rport, red, sha, params, layout=2)
    print()
    rows["K"] = run_concurrency_agent(h, args, agent_bin, rport, red)
    print()
    rows["R"] = run_cluster_agent(h, args, agent_bin)
    print()
    rows["U"] = run_exact_agent(h, args, agent_bin, rport, red, sha, params, third=True)
    print()
    rows["T"] = run_tls_agent(h, args, agent_bin)
    print()
    rows["W"] = run_status_flood(h, args, agent_bin, rport, red)
    print()
    # more rounds of E, R and T, interleaved: one run of each moves with whatever else the
    # machine does; the ratios R / E and T / E are taken within a round, then the median
    rounds = [{"E": rows["E"], "R": rows["R"], "U": rows["U"], "T": rows["T"]}]
    for i in range(2, args.rounds + 1):
        print("[E R U T] round %d of %d" % (i, args.rounds))
        rounds.append({"E": run_exact_agent(h, args, agent_bin, rport, red, sha, params),
                       "R": run_cluster_agent(h, args, agent_bin),
                       "U": run_exact_agent(h, args, agent_bin, rport, red, sha, params,
                                            third=True),
                       "T": run_tls_agent(h, args, agent_bin)})
        print()
    rows["rounds"] = rounds
    # same key length as the agent's (32 hex digits), BENCH_KEYS of them
    pad = "0" * 20 + "__rand_int__"
    print("[P] [Q] redis-benchmark -P 32 -c 8 -r %d -n %d on the same Redis:" % (
        BENCH_KEYS, args.ceiling_calls))
    cmd_p = ["EVALSHA", sha, "1", "%s:{k:%s}:%s" % (KEY_PREFIX, pad, LIMIT)] + \
        [str(x) for x in params]
    cmd_q = ["EVALSHA", seed_sha, "1", "seed:{k:%s}:%s" % (pad, LIMIT), str(BIG), str(BIG), "1"]
    print("    P: %s" % " ".join(cmd_p))
    print("    Q: %s  (seed token bucket: HMGET, HSET, EXPIRE)" % " ".join(cmd_q))
    floor_sha = rh.redis_cmd(rport, "SCRIPT", "LOAD", FLOOR_LUA)
    cmd_f = ["EVALSHA", floor_sha, "1", "floor:{k:%s}:%s" % (pad, LIMIT)]
    # the multi form as the agent sends it under load: MULTI_D decisions a call, each of
    # one limit with its own key, the call's one limit sent once (the compact form C,
    # lua/decide.lua)
    cmd_m = ["EVALSHA", sha, str(MULTI_D)] + \
        ["%s:{k:%s}:%s" % (KEY_PREFIX, pad, LIMIT)] * MULTI_D + \
        ["C", str(MULTI_D), "1"] + [str(x) for x in params[:4]] + \
        ["1", "0", "1", str(params[4])] * MULTI_D
    print("    F: %s  (the floor: TIME, GET, SET PX)" % " ".join(cmd_f))
    print("    M: EVALSHA %s %d <%d keys> C %d 1 %s {1 0 1 %s} x %d  (the multi form, compact)"
          % (sha, MULTI_D, MULTI_D, MULTI_D, " ".join(str(x) for x in params[:4]), params[4],
             MULTI_D))
    rows["P"] = redis_bench(h, args, "P", "our script", rport, red, cmd_p)
    rows["Q"] = redis_bench(h, args, "Q", "seed script", rport, red, cmd_q)
    rows["F"] = redis_bench(h, args, "F", "floor", rport, red, cmd_f)
    rows["M"] = redis_bench(h, args, "M", "multi form", rport, red, cmd_m,
                            decisions=MULTI_D)
    print()
    rows["S"] = sustained(h, args, agent_bin, rport, red, rows["P"]["rate"])
    h.stop(red)
    print()
    rows["L"] = layout_memory(h, args, script)
    print()
    valkey = valkey_server()
    if valkey:
        rows["LV"] = layout_memory(h, args, script, server=valkey)
    else:
        print("[L] on Valkey: not available (no valkey-server: Debian 13 packages it; or set "
              "VALKEY_BIN)")
    print()

    report(args, http, rows)
    print()
    print("done in %.0f s; load average %.1f at the end (this run and whatever else ran)" % (
        time.monotonic() - t_start, machine()[2]))
    return 0


def report(args, http, rows):
    order = [(s, r) for s in "ABC" for r in http[s]] + \
        [(k, rows[k]) for k in "NDEGKRUTWPQFMS" if rows.get(k)]
    names = {"A": "no SPOE", "B": "null agent", "C": "exact", "N": "spoa-example",
             "D": 'agent "allow"', "E": "agent exact", "T": "agent exact TLS",
             "G": "agent exact, key layout 2",
             "K": "exact + concurrency", "R": "exact, 3-master cluster",
             "U": "exact, a third of the rate",
             "W": "exact + /status flood",
             "P": "our script -P32",
             "Q": "seed script -P32", "F": "floor script -P32",
             "M": "multi form D=%d -P32" % MULTI_D, "S": "sustained exact"}
    how = {"A": "wrk", "B": "wrk", "C": "wrk", "N": "spop-load -r %d" % args.rate,
           "D": "spop-load -r %d" % args.rate, "E": "spop-load -r %d" % args.rate,
           "G": "spop-load -r %d" % args.rate,
           "K": "spop-load -r %d -L" % args.rate, "R": "spop-load -r %d" % args.rate,
           "U": "spop-load -r %d" % max(1, args.rate // 3),
           "T": "spop-load -r %d" % args.rate, "W": "spop-load -r %d" % args.rate,
           "P": "redis-benchmark", "Q": "redis-benchmark", "F": "redis-benchmark",
           "M": "redis-benchmark", "S": "spop-load -r, 0 degraded"}
    print("results (CPU from /proc: us per decision / request / call of the row's run;"
          " * = not a throughput figure)")
    print("  %-42s %9s %7s %7s %8s %6s %8s %8s %8s" % (
        "row", "rate/s", "p50 ms", "p99 ms", "degraded", "errors", "agent us", "Redis us",
        "HAProxy"))
    marked = False
    for s, r in order:
        label = "%s %s, %s%s" % (s, names[s], how[s],
                                 " " + ("-c1" if r["label"] == "light" else "-c32")
                                 if s in "ABC" else "")
        bad = r["degraded"] or r["errors"]
        marked = marked or bool(bad)
        cpu = r.get("cpu", {})
        print("  %-42s %9.0f%1s %6s %7s %8d %6d %8s %8s %8s" % (
            label, r["rate"], "*" if bad else "", fmt_ms(r["p50"]), fmt_ms(r["p99"]),
            r["degraded"], r["errors"],
            "%.1f" % cpu["agent"] if "agent" in cpu else "-",
            "%.1f" % cpu["redis"] if "redis" in cpu else "-",
            "%.1f" % cpu["haproxy"] if "haproxy" in cpu else "-"))
    if marked:
        print("  * degraded answers, SPOE errors, non-200 or unanswered requests in the run")
    print()

    # ---- the targets
    print("targets (issue: a third of the cost per decision)")
    A = dict((r["label"], r) for r in http["A"])
    B = dict((r["label"], r) for r in http["B"])
    C = dict((r["label"], r) for r in http["C"])
    E, P, Q, S, N = rows["E"], rows["P"], rows["Q"], rows["S"], rows.get("N")

    def line(what, value, ok, target, note=""):
        print("  %-68s %9s  %-7s %s%s" % (what, value, target, "PASS" if ok else "FAIL",
                                           "  (" + note + ")" if note else ""))

    def clean(*rs):
        bad = [r for r in rs if r["degraded"] or r["errors"]]
        return "" if not bad else "row %s has %d degraded, %d errors" % (
            "/".join(r["setup"] for r in bad), sum(r["degraded"] for r in bad),
            sum(r["errors"] for r in bad))

    rounds = rows.get("rounds") or [{"E": E}]

    def per_round(f, *setups):
        """f(row, ...) of each round that has rows <setups>, clean ones: the values."""
        return [f(*(r[s] for s in setups)) for r in rounds
                if all(s in r for s in setups) and not clean(*(r[s] for s in setups))]

    def med(vals):
        return statistics.median(vals) if vals else None

    def listed(vals, fmt):
        return "rounds: " + ", ".join(fmt % v for v in vals)

    def ratios(a, b, who="redis"):
        """<who>'s CPU per decision of row <a> / row <b>, in each clean round."""
        return per_round(lambda x, y: x["cpu"].get(who, 0) / y["cpu"][who], a, b)

    ags = per_round(lambda e: e["cpu"].get("agent", 0), "E")
    ag = med(ags) if ags else E["cpu"].get("agent", 0)
    note = "" if ags else clean(E)
    line("agent CPU per exact decision (E, median of %d rounds)" % len(ags), "%.1f us" % ag,
         ag <= 8 and not note, "<= 8", note or listed(ags, "%.1f"))
    if N and N["cpu"].get("agent"):
        x = ag / N["cpu"]["agent"]
        line("  ... / spoa-example's (E / N)", "%.2f" % x, x <= 0.35 and not note, "<= 0.35")
    else:
        print("  %-68s %9s" % ("  ... / spoa-example's (E / N)", "n/a: no spoa-example"))
    seed = Q["cpu"]["redis"]
    x = E["cpu"].get("redis", 0) / seed
    line("Redis CPU per exact decision in situ / seed's at -P32 (E / Q)", "%.2f" % x,
         x <= 0.5 and not note, "<= 0.5", note)
    R = rows.get("R")
    if R and E["cpu"].get("redis"):
        res = ratios("R", "E")
        x = med(res) if res else R["cpu"].get("redis", 0) / E["cpu"]["redis"]
        note = "" if res else clean(R, E)
        line("Redis CPU per exact decision, 3-master cluster / one Redis (R / E)", "%.2f" % x,
             x <= 1.2 and not note, "<= 1.2", note or "median; %s; %.3f / %.3f script calls "
             "a decision" % (listed(res, "%.2f"), R.get("calls", 0), E.get("calls", 0)))
        # why: each master runs at a third of the rate, where a Redis wake-up is shared by
        # fewer decisions (no target: information)
        for what, a_, b_ in (("one Redis at a third of the rate / at the rate (U / E)", "U", "E"),
                             ("3-master cluster / one Redis at a third of the rate (R / U)",
                              "R", "U")):
            vs = ratios(a_, b_)
            print("  %-68s %9s  %s" % ("  ... " + what,
                                      "%.2f" % med(vs) if vs else "n/a",
                                      "(" + listed(vs, "%.2f") + ")" if vs else
                                      "(no clean round)"))
    x = P["cpu"]["redis"] / seed
    line("Redis CPU per call at -P32, our script / seed's (P / Q)", "%.2f" % x, x <= 0.5,
         "<= 0.5")
    x = S["rate"] / P["rate"]
    p99 = S["p99"]
    line("sustained exact, 0 degraded, default timeout / -P32 ceiling (S / P)", "%.2f" % x,
         x >= 0.8 and p99 is not None and p99 <= DEFAULT_COMMAND_TIMEOUT_MS, ">= 0.8",
         "%.0f/s, p99 %s ms (<= %d ms)" % (S["rate"], fmt_ms(p99), DEFAULT_COMMAND_TIMEOUT_MS))
    x = C["throughput"]["rate"] / B["throughput"]["rate"]
    note = clean(C["throughput"], B["throughput"])
    line("through HAProxy wrk -c32: exact / allow throughput (C / B)", "%.2f" % x,
         x >= 0.9 and not note, ">= 0.9", note)
    note = clean(C["light"])
    d50 = C["light"]["p50"] - A["light"]["p50"]
    d99 = C["light"]["p99"] - A["light"]["p99"]
    line("light load wrk -c1: exact p50 - no SPOE p50 (C - A)", "%+.3f ms" % d50,
         d50 <= 0.15 and not note, "<= 0.15", note)
    line("light load wrk -c1: exact p99 - no SPOE p99 (C - A)", "%+.3f ms" % d99,
         d99 <= 0.5 and not note, "<= 0.5", note)
    for key in ("L", "LV"):
        L = rows.get(key)
        if not L:
            continue
        # per layout, the higher of its two moments (just after; once the per-second
        # states expired): the better layout by that
        m1, m2 = L["mem"][1], L["mem"][2]
        w1, w2 = max(m1["after"], m1["expired"]), max(m2["after"], m2["expired"])
        best = min(w1, w2)
        line("memory per client, 100/s + 1M/day, the better layout, %s" % L["mem"]["version"],
             "%.0f B" % best, best <= 160, "<= 160",
             "layout %d; the higher of just after / once expired" % (1 if w1 <= w2 else 2))
        print("  %-68s %9s" % ("  ... layout 1: just after / once the per-second states expired",
                               "%.0f / %.0f B" % (m1["after"], m1["expired"])))
        print("  %-68s %9s" % ("  ... layout 2: just after / once the per-second states expired",
                               "%.0f / %.0f B" % (m2["after"], m2["expired"])))
    G = rows.get("G")
    if G and E["cpu"].get("redis") and G["cpu"].get("redis"):
        note = clean(G, E)
        x = G["cpu"]["redis"] / E["cpu"]["redis"]
        print("  %-68s %9s%s" % ("Redis CPU per exact decision, key layout 2 / layout 1 (G / E)",
                                 "%.2f" % x, "  (" + note + ")" if note else ""))
    F, M = rows["F"], rows["M"]
    print()
    print("what bounds the Redis ratios (no targets: the same Redis, the same run)")

    def info(what, value):
        print("  %-68s %9s" % (what, value))

    info("our script per call / the floor's: TIME, GET, SET PX (P / F)",
         "%.2f" % (P["cpu"]["redis"] / F["cpu"]["redis"]))
    info("the floor / seed's: the lowest P / Q a one-decision script has (F / Q)",
         "%.2f" % (F["cpu"]["redis"] / seed))
    info("multi form per decision, %d a call / seed's per call (M / Q)" % MULTI_D,
         "%.2f" % (M["cpu"]["redis"] / seed))
    T = rows.get("T")
    if T and E["cpu"].get("agent") and E["cpu"].get("redis"):
        print()
        print("what TLS costs a decision (T against E within each round, the median)")
        for who in ("agent", "redis"):
            tes = ratios("T", "E", who)
            x = med(tes) if tes else T["cpu"].get(who, 0) / E["cpu"][who]
            line("%s CPU per exact decision, TLS / clear (T / E)" % (
                "agent" if who == "agent" else "Redis"), "%.2f" % x, x <= 1.1 and bool(tes),
                "<= 1.1", listed(tes, "%.2f") if tes else "no clean round")
        info("p50 / p99 latency, TLS (T)", "%s / %s ms" % (fmt_ms(T["p50"]), fmt_ms(T["p99"])))
        if T["degraded"] or T["errors"]:
            info("  (row T not clean)", clean(T))
    W = rows.get("W")
    if W and E["cpu"].get("agent") and W.get("status_rate"):
        print()
        print("what a /status flood costs (target of the status page; W against E, the same run)")
        for what, us in (("kept alive (browsers, Prometheus)", W["status_us_keep"]),
                         ("fresh connections (curl, scripts)", W["status_us"])):
            line("agent CPU per /status.json, %s" % what, "%.0f us" % us, us <= 50,
                 "<= 50")
            info("  ... / agent CPU per exact decision (W / E)",
                 "%.1f" % (us / E["cpu"]["agent"]))
        if E["p99"] and W["p99"]:
            x = W["p99"] / E["p99"]
            line("SPOP p99 with / without a fresh-connection flood (W / E)", "%.2f" % x,
                 x <= 1.5 and not clean(W), "<= 1.5",
                 "%s / %s ms" % (fmt_ms(W["p99"]), fmt_ms(E["p99"])))
        info("/status.json answered a second meanwhile (%d asked), failed" % STATUS_FLOOD_RATE,
             "%.0f, %d" % (W["status_rate"], W["status_fails"]))
        if W["degraded"] or W["errors"]:
            info("  (row W not clean)", clean(W))


if __name__ == "__main__":
    sys.exit(main())
