#!/usr/bin/python3
"""spoa-ratelimit benchmark: what the SPOE agent adds to a request through HAProxy.

    /usr/bin/python3 tests/tools/bench.py --agent build/spoa-ratelimit     (or: make bench)

Three setups, measured in the same run with wrk through HAProxy to the stand-in upstream
(haproxy/upstream.cfg), one after the other (only the setup under test is running):

  A  HAProxy without SPOE: a temporary copy of haproxy.cfg without the `filter spoe` and
     `send-spoe-group` lines and without the agents' backend (the deny rule stays: with
     no agent txn.rl.allow never exists, so it never matches);
  B  HAProxy + agent with store = "allow" (null agent: answers allow=1, no Redis);
  C  HAProxy + agent deciding against Redis, limits so high that nothing is denied: every
     request costs one EVALSHA.

For all three, per-request logging is removed from the copy of haproxy.cfg (the `log` and
`log-format` lines), so logging does not dominate. Each setup: a check request (C must carry
RateLimit headers, B no SPOE error header), a warm-up, then latency at light load
(wrk -t1 -c1 --latency) and throughput (wrk -t2 -c32 --latency), all with an API key header.

Exit status: 0 when every setup ran (whatever the numbers), 2 on a setup failure,
130 when interrupted. Bounded to about 2 minutes; every process started is stopped on exit.
"""

import argparse
import os
import re
import sys
import pathlib
import shutil
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rlharness as rh  # noqa: E402

API_KEY = "bench"
BIG = 10 ** 9

SETUPS = (
    ("A", "no SPOE", "HAProxy only (filter spoe and send-spoe-group removed)"),
    ("B", "null agent", 'HAProxy + agent, store = "allow" (no Redis)'),
    ("C", "agent+Redis", "HAProxy + agent + Redis: one EVALSHA per request, nothing denied"),
)

# Counts, in the warm-up run, the responses that carry the headers that matter (a response()
# callback slows wrk down, so the measured runs do without it).
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
        if not spoe and st.startswith("http-request send-spoe-group"):
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
    return {
        "log_level": "notice",
        "store": store,
        "redis": {
            "address": "%s:%d" % (rh.LOCALHOST, redis_port or 1),
            "connect_timeout_ms": 200,
            # generous: the benchmark measures decisions, not fail-open (counted anyway)
            "command_timeout_ms": 1000,
            "key_prefix": "bench",
        },
        "limits": {"bench_second": {"rate": BIG, "period": "1s", "burst": BIG}},
        "tiers": {"bench": {"limits": ["bench_second"]}},
        # spop-load sends keys without a tier: each is its own client
        "unknown_keys": "default_tier",
        "default_tier": "bench",
        "anonymous": {"limits": ["bench_second"]},
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


def run_wrk(h, name, port, threads, conns, duration, latency=True, script=None):
    wrk = rh.which("wrk", "WRK_BIN")
    argv = [wrk, "-t%d" % threads, "-c%d" % conns, "-d%ds" % duration, "--timeout", "2s",
            "-H", "X-API-Key: %s" % API_KEY]
    if latency:
        argv.append("--latency")
    if script:
        argv += ["-s", script]
    argv.append("http://%s:%d/" % (rh.LOCALHOST, port))
    rc, out = h.run(name, argv, timeout=duration + 20)
    res = parse_wrk(out)
    if rc != 0 or res["rps"] is None or res["requests"] is None or \
            (latency and not all(("p%d" % p) in res for p in (50, 90, 99))):
        raise rh.SetupError("wrk failed (exit %s):\n%s" % (rc, rh.indent(out)))
    if res["requests"] == 0:
        raise rh.SetupError("wrk completed no request:\n%s" % rh.indent(out))
    return res


# ---------------------------------------------------------------------------------------

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
    good, last, reason = 0, None, None
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


def run_setup(h, setup, args, agent_bin, up_port, tier_map, cfgs):
    t0 = time.monotonic()
    started = []
    agent = None
    redis_port = None
    try:
        if setup == "C":
            rproc, redis_port = rh.start_redis(h, "redis-C")
            started.append(rproc)
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
        print("[%s] %s" % (setup, dict((s[0], s[2]) for s in SETUPS)[setup]))
        print("    ready in %.1f s; check request: HTTP %d, %s" % (
            time.monotonic() - t0, r.status,
            "no SPOE error header, no RateLimit header (null agent)" if setup == "B" else
            "RateLimit headers present, agent consulted" if setup == "C" else
            "no SPOE in the path"))
        if setup == "C":
            print("      RateLimit: %s\n      RateLimit-Policy: %s" % (
                r.h("RateLimit"), r.h("RateLimit-Policy")))

        lua = h.tmp / "count.lua"
        if not lua.exists():
            lua.write_text(COUNT_LUA)
        warm = run_wrk(h, "wrk-%s-warmup" % setup, gport, 2, 32, args.warmup, latency=False,
                       script=str(lua))
        c = warm.get("count", {})
        note = "warm-up %ds: %d responses, %d non-200, %d SPOE errors, %d degraded, %d with " \
               "RateLimit headers" % (args.warmup, c.get("n", -1), c.get("non200", -1),
                                      c.get("agent_error", -1), c.get("degraded", -1),
                                      c.get("ratelimit", -1))
        print("    " + note)
        warnings = []
        if not c:
            raise rh.SetupError("the warm-up script printed no counts")
        if setup == "C" and c["ratelimit"] < c["n"]:
            warnings.append("%d responses without RateLimit headers" % (c["n"] - c["ratelimit"]))
        if setup != "C" and c["ratelimit"]:
            raise rh.SetupError("setup %s answered with RateLimit headers" % setup)

        before = rh.agent_stats(h, agent) if agent else None
        light = run_wrk(h, "wrk-%s-light" % setup, gport, 1, 1, args.duration)
        heavy = run_wrk(h, "wrk-%s-throughput" % setup, gport, 2, 32, args.duration)
        for label, res in (("light", light), ("throughput", heavy)):
            print("    %-10s %9.0f req/s  p50 %s  p90 %s  p99 %s ms%s" % (
                label, res["rps"], fmt_ms(res["p50"]), fmt_ms(res["p90"]), fmt_ms(res["p99"]),
                "" if not (res["non2xx"] or res["sock_errors"]) else
                "  (%d non-2xx, %d socket errors)" % (res["non2xx"], res["sock_errors"])))
            if res["non2xx"] or res["sock_errors"]:
                warnings.append("%s run: %d non-2xx responses, %d socket errors" % (
                    label, res["non2xx"], res["sock_errors"]))
        if agent:
            after = rh.agent_stats(h, agent)
            notify = after["notify"] - before["notify"]
            sent = light["requests"] + heavy["requests"]
            degraded = after["degraded"] - before["degraded"]
            print("    agent: %d NOTIFY answered, wrk completed %d requests%s" % (
                notify, sent, "" if setup == "B" else
                "; %d allowed, %d denied, %d degraded" % (
                    after["allowed"] - before["allowed"], after["denied"] - before["denied"],
                    degraded)))
            if notify < sent:
                warnings.append("the agent saw fewer NOTIFY (%d) than requests (%d)"
                                % (notify, sent))
            if degraded:
                warnings.append("%d decisions degraded (Redis timeout or error)" % degraded)
            if setup == "C" and after["denied"] != before["denied"]:
                warnings.append("%d requests denied" % (after["denied"] - before["denied"]))
        for w in warnings:
            print("    WARNING: %s" % w)
        return {"light": light, "heavy": heavy, "warnings": warnings}
    finally:
        for p in reversed(started):
            h.stop(p)


def fmt_ms(v):
    if v is None:
        return "-"
    return "%.3f" % v if v < 10 else "%.1f" % v


def fmt_delta(v):
    if v is None:
        return "-"
    return "%+.3f" % v if abs(v) < 10 else "%+.1f" % v


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


def ceiling(h, args, agent_bin):
    """Decisions per second of the agent against one Redis (driven over SPOP by spop-load,
    no HAProxy), against redis-benchmark running the same script with the same arguments
    on the same Redis: the Redis ceiling. Same run, same machine, as a ratio."""
    load = pathlib.Path(agent_bin).parent / "spop-load"
    bench = shutil.which("redis-benchmark")
    if not load.exists() or not bench:
        print("agent vs Redis ceiling: skipped (spop-load or redis-benchmark missing)")
        return
    print("[D] agent decisions/s against one Redis vs the Redis ceiling (redis-benchmark,"
          " same script)")
    red, rport = rh.start_redis(h, "redis-ceiling")
    ag, aport, _ = rh.start_agent(h, agent_bin, agent_config("redis", rport), "agent-ceiling")
    time.sleep(0.5)
    dur = str(max(3, args.duration))
    rc, out = h.run("spop-load", [str(load), "-a", "%s:%d" % (rh.LOCALHOST, aport), "-c", "4",
                                  "-p", "32", "-d", dur, "-k", "1000"],
                    timeout=int(dur) + 30)
    vals = dict(kv.split("=") for kv in out.split() if "=" in kv)
    agent_rate = float(vals.get("rate", 0))
    sha = rh.redis_cmd(rport, "SCRIPT", "LOAD", (rh.REPO / "build" / "gen" /
                                                 "ratelimit.lua").read_text())
    n = str(max(20000, int(agent_rate * int(dur))))
    # the same EVALSHA the agent sends: one key per API key, GCRA with the bench limit
    params = ["1", "1", str(10 ** 15), "0", "1"]  # gcra, T 1 us, tau, flags, cost
    rc2, out2 = h.run("redis-benchmark", [bench, "-p", str(rport), "-c", "128", "-n", n,
                                          "-r", "1000", "-q", "EVALSHA", sha, "1",
                                          "bench:{k:__rand_int__}:bench_second"] + params,
                      timeout=120)
    m = re.search(r"([0-9.]+) requests per second", out2.replace("\r", "\n"))
    ceiling_rate = float(m.group(1)) if m else 0.0
    print("    agent (spop-load -c4 -p32, %ss): %8.0f decisions/s  p50 %s ms  p99 %s ms"
          "  degraded %s" % (dur, agent_rate, vals.get("p50_ms", "?"), vals.get("p99_ms", "?"),
                             vals.get("degraded", "?")))
    print("    redis-benchmark -c128 EVALSHA:    %8.0f calls/s" % ceiling_rate)
    if ceiling_rate:
        print("    agent / Redis ceiling: %.2f" % (agent_rate / ceiling_rate))
    h.stop(ag)
    h.stop(red)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"),
                    help="agent binary (default: build/spoa-ratelimit)")
    ap.add_argument("--duration", type=int, default=8, help="seconds per measured run (8)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up seconds (2)")
    ap.add_argument("--spoe-timeout", default="1s",
                    help="SPOE `timeout processing` (default 1s: measure decisions, not"
                         " fail-open; production uses 10ms)")
    ap.add_argument("--setups", default="ABC", help="which setups to run (default ABC)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip the agent vs redis-benchmark comparison")
    args = ap.parse_args()
    rh.setup_stdout()
    args.duration = max(1, min(args.duration, 60))
    args.warmup = max(1, min(args.warmup, 30))
    setups = [s for s in "ABC" if s in args.setups.upper()]
    agent_bin = os.path.abspath(args.agent)
    if any(s in setups for s in "BC") and not os.access(agent_bin, os.X_OK):
        print("agent binary %s not found: run `make` first" % agent_bin, file=sys.stderr)
        return 2

    per_setup = 12 + args.warmup + 2 * (args.duration + 2)
    h = rh.Harness("rl-bench-", 30 + per_setup * len(setups))
    h.keep = args.keep
    try:
        return run(h, args, agent_bin, setups)
    except (rh.SetupError, rh.Watchdog) as e:
        print("\nSETUP FAILED: %s" % e, file=sys.stderr)
        h.dump_logs()
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr)
        return 130
    finally:
        h.close()


def run(h, args, agent_bin, setups):
    t_start = time.monotonic()
    ncpu, model, load = machine()
    print("spoa-ratelimit benchmark: wrk -> HAProxy -> upstream, with and without the agent")
    print("=" * 92)
    print("machine: nproc %d (%s), load average %.1f at start; HAProxy %s" % (
        ncpu, model, load, rh.haproxy_version()))
    print("wrk, HAProxy, agent, Redis and upstream all share these %d cores (and whatever else"
          " runs):" % ncpu)
    print("the numbers are relative, compare setups within one run. Requests carry X-API-Key:"
          " %s;" % API_KEY)
    print("SPOE timeout %s (decisions are measured, not fail-open), Redis command timeout"
          " 1000 ms." % args.spoe_timeout)
    print()

    text = rh.HAPROXY_CFG.read_text()
    cfgs = {}
    for s in setups:
        p = h.tmp / ("haproxy-%s.cfg" % s)
        p.write_text(derive_cfg(text, spoe=(s != "A")))
        cfgs[s] = p
    tier_map = h.tmp / "tiers.map"
    tier_map.write_text("%s bench\n" % API_KEY)
    up, up_port = rh.start_upstream(h)

    results = {}
    for s in setups:
        results[s] = run_setup(h, s, args, agent_bin, up_port, tier_map, cfgs)
        print()
    h.stop(up)

    # ---- the table
    names = dict((s[0], s[1]) for s in SETUPS)
    head = "  %-15s %10s %9s %9s %9s %9s %9s %9s" % (
        "", "req/s", "p50 ms", "p90 ms", "p99 ms", "rps / A", "+p50 ms", "+p99 ms")
    print("results (latency percentiles from wrk --latency; + = added vs A)")
    print(head)
    for run_key, title in (("light", "light load: wrk -t1 -c1 -d%ds" % args.duration),
                           ("heavy", "throughput: wrk -t2 -c32 -d%ds" % args.duration)):
        print("  " + title)
        base = results.get("A", {}).get(run_key)
        for s in setups:
            r = results[s][run_key]
            ratio = "%.2f" % (r["rps"] / base["rps"]) if base else "-"
            d50 = fmt_delta(r["p50"] - base["p50"]) if base and s != "A" else "-"
            d99 = fmt_delta(r["p99"] - base["p99"]) if base and s != "A" else "-"
            print("    %s %-11s %10.0f %9s %9s %9s %9s %9s %9s" % (
                s, names[s], r["rps"], fmt_ms(r["p50"]), fmt_ms(r["p90"]), fmt_ms(r["p99"]),
                ratio, d50, d99))
    if "B" in results and "C" in results:
        print("  C vs B (what the Redis round trip adds to the agent):")
        for run_key, label in (("light", "light load"), ("heavy", "throughput")):
            b, c = results["B"][run_key], results["C"][run_key]
            print("    %-11s req/s x%.2f, p50 %s ms, p99 %s ms" % (
                label, c["rps"] / b["rps"], fmt_delta(c["p50"] - b["p50"]),
                fmt_delta(c["p99"] - b["p99"])))
    if "C" in setups and not args.no_ceiling:
        print()
        ceiling(h, args, agent_bin)
    nwarn = sum(len(r["warnings"]) for r in results.values())
    print()
    print("done in %.0f s%s" % (time.monotonic() - t_start,
                                "; %d warning(s) above" % nwarn if nwarn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
