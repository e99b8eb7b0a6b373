#!/usr/bin/python3
"""spoa-ratelimit accuracy: many gateways, one budget — how much gets through.

`make accuracy` runs, on loopback, N gateways (default 20 agents, one process each) against
one Redis, each agent driven by its own SPOP load generator (build/spop-load -r, paced), with
skewed balancing (half the traffic on 2 gateways, the rest spread over the others) and
gateways joining (4 agents start at 30% of the run) and leaving (4 stop at 70%). One client
key per scenario, sent through every gateway:

  (a) a 100/s key: GCRA rate 100 per 1s, burst 100; 400/s offered for 10 s.
      Expected admitted = rate x D + burst, D = the measured span of the load.
  (b) a daily quota, scaled down to fit the run: fixed window 2000 per "1d" (the calendar
      day, UTC, so one window holds the whole run); 5000 requests offered in 5 s.
      Expected admitted = 2000.
  (c) a hot key: GCRA rate 10000 per 1s, burst 1000; 12000/s offered for 4 s (20% over
      the limit). Expected admitted = 10000 x D + burst.

for each mode (MODES below: one entry = one agent configuration overlay):

  exact         store = "redis" (one script call per decision; the blocked-key cache on,
                as by default: repeat denials answered locally)
  exact-nocache store = "redis", blocked_cache = false (every decision goes to Redis)
  leases        store = "redis" with local quotas: accuracy_budget = 0.05 on the limit
                (leases for hot keys, pre-checks far from the limit, coalescing; the
                blocked-key cache on); gateways counted by the agents' heartbeats
  local         store = "memory": every gateway its own counter with the full limit
                (no coordination at all: the naive baseline)
  local/N       store = "memory", every gateway the limit / N (the static split that
                `fallback.gateways` derives)

Per mode x scenario: offered (NOTIFYs sent), admitted (allowed + degraded: a degraded
answer lets the request through), the expected admitted count, admitted / expected,
Redis script calls (EVAL + EVALSHA from INFO commandstats, delta over the run) per decision
(NOTIFYs answered), and degraded answers.

With --by-kind a MONITOR connection on Redis sorts the script calls of each run by kind:
heartbeats (EVAL of the heartbeat script), single decisions, grants (a lease, or requests
of one key coalesced into one call), reports of pre-checked usage, leases given back, and
calls of several decisions (the store's batching). MONITOR costs Redis some time: the numbers of a
run with it are close to, not the same as, a run without.

Exit status: 0 whatever the numbers; 2 when something could not be set up (a process did
not start, a load generator failed, the run exceeded its time bound).
"""

import argparse
import collections
import os
import re
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlharness as rh  # noqa: E402

# ---------------------------------------------------------------------------------------
# Modes: one entry each. `cfg` is overlaid on the agent configuration (dicts merged);
# `cfg: None` = not implemented, printed as `na`. `limit_scale` scales the limit on every
# gateway (1/N for the static split; "N" is replaced by the number of gateways);
# `budget` sets the limit's accuracy_budget (local quotas).

MODES = [
    {"key": "exact", "label": "exact (redis)",
     "cfg": {"store": "redis", "blocked_cache": True}},
    {"key": "exact-nocache", "label": "exact, no blocked cache",
     "cfg": {"store": "redis", "blocked_cache": False}},
    {"key": "leases", "label": "leases (budget 5%)",
     "cfg": {"store": "redis", "blocked_cache": True}, "budget": 0.05},
    {"key": "local", "label": "local-only, full limit",
     "cfg": {"store": "memory"}},
    {"key": "local-split", "label": "local-only, limit/{N}",
     "cfg": {"store": "memory"}, "limit_scale": "1/N"},
]

# Scenarios: the limit (an agent `limits.<name>` entry), the offered load (total rate and
# nominal duration) and the expected admitted count as a function of the measured span D.
SCENARIOS = [
    {"key": "per_second", "short": "100/s key",
     "title": "100/s key: GCRA rate 100 per 1s, burst 100",
     "limit": {"algorithm": "gcra", "rate": 100, "period": "1s", "burst": 100},
     "total_rate": 400.0, "duration": 10.0,
     "expected": lambda span: 100 * span + 100,
     "expected_text": "100/s x D + burst 100"},
    {"key": "daily", "short": "daily quota",
     "title": "daily quota: fixed window 2000 per 1d (calendar day, UTC)",
     "limit": {"algorithm": "fixed_window", "rate": 2000, "period": "1d"},
     "total_rate": 1000.0, "duration": 5.0,
     "expected": lambda span: 2000,
     "expected_text": "2000"},
    {"key": "hot", "short": "hot key",
     "title": "hot key: GCRA rate 10000 per 1s, burst 1000",
     "limit": {"algorithm": "gcra", "rate": 10000, "period": "1s", "burst": 1000},
     "total_rate": 12000.0, "duration": 4.0,
     "expected": lambda span: 10000 * span + 1000,
     "expected_text": "10000/s x D + burst 1000"},
]


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(
            out.get(k), dict) else v
    return out


def scaled_limit(limit, scale):
    lim = dict(limit)
    for k in ("rate", "burst"):
        if k in lim:
            lim[k] = max(1, int(round(lim[k] * scale)))
    return lim


def agent_config(mode, scen, redis_port, ngw, args, prefix):
    scale = 1.0
    if mode.get("limit_scale") == "1/N":
        scale = 1.0 / ngw
    name = scen["key"]
    limit = scaled_limit(scen["limit"], scale)
    if mode.get("budget"):
        limit["accuracy_budget"] = mode["budget"]
    base = {
        "log_level": "notice",
        "store": "redis",
        "redis": {
            "address": "%s:%d" % (rh.LOCALHOST, redis_port),
            "connect_timeout_ms": 200,
            "command_timeout_ms": args.command_timeout_ms,
            "key_prefix": prefix,
        },
        "limits": {name: limit},
        "tiers": {"t": {"limits": [name]}},
        # spop-load sends keys without a tier: each is its own client
        "unknown_keys": "default_tier",
        "default_tier": "t",
        "anonymous": {"limits": [name]},
    }
    return deep_merge(base, mode["cfg"])


# ---------------------------------------------------------------------------------------
# The gateway plan: who carries how much traffic, who joins, who leaves.

class Gateway:
    def __init__(self, idx, role, rate, start_frac, stop_frac):
        self.idx = idx
        self.role = role              # heavy, steady, joiner, leaver
        self.rate = rate              # NOTIFYs per second offered while it is up
        self.start_frac = start_frac  # of the nominal duration
        self.stop_frac = stop_frac
        self.agent = None
        self.port = None
        self.load = None
        self.load_t0 = None
        self.result = None


def plan(ngw, total_rate, args):
    heavy, joiners, leavers = 2, args.joiners, args.leavers
    steady = ngw - heavy - joiners - leavers
    jf, lf = args.join_at, args.leave_at
    # Half the requests on the heavy gateways, half on the others; the light rate is set so
    # that the light half really is half of the requests despite the churn.
    light_lifetime = steady * 1.0 + joiners * (1.0 - jf) + leavers * lf
    light_rate = total_rate / 2.0 / light_lifetime
    gws = []
    for i in range(ngw):
        if i < heavy:
            gws.append(Gateway(i, "heavy", total_rate / 2.0 / heavy, 0.0, 1.0))
        elif i < heavy + steady:
            gws.append(Gateway(i, "steady", light_rate, 0.0, 1.0))
        elif i < heavy + steady + leavers:
            gws.append(Gateway(i, "leaver", light_rate, 0.0, lf))
        else:
            gws.append(Gateway(i, "joiner", light_rate, jf, 1.0))
    return gws


# ---------------------------------------------------------------------------------------
# Processes

def start_gateway_agent(h, agent_bin, cfg, name, needs_redis):
    proc, port, _ = rh.start_agent(h, agent_bin, cfg, name)
    if needs_redis:
        # ready once the agent has loaded its script and knows the topology (no request
        # spent on it: a probe would add a script call to the count)
        def ready():
            if not proc.alive():
                raise rh.SetupError("%s exited:\n%s" % (name, rh.indent(proc.log_tail())))
            return re.search(r"single Redis|cluster mode", proc.log_text())
        rh.poll(ready, timeout=5, interval=0.01, what="%s connected to Redis" % name)
    return proc, port


def start_load(h, load_bin, gw, port, seconds, client_key_prefix, name):
    argv = [load_bin, "-a", "%s:%d" % (rh.LOCALHOST, port), "-c", "1", "-p", "64",
            "-d", "%.3f" % max(0.05, seconds), "-k", "1", "-K", client_key_prefix,
            "-r", "%.3f" % gw.rate]
    gw.load_t0 = time.monotonic()
    gw.load = h.spawn(name, argv)


def load_result(h, gw):
    rc = h.stop(gw.load, 1.0)
    text = gw.load.log_text()
    line = next((l for l in text.splitlines() if l.startswith("decisions=")), None)
    if rc != 0 or line is None:
        raise rh.SetupError("%s (pid %d) failed (exit %s):\n%s" % (
            gw.load.name, gw.load.pid, rc, rh.indent(gw.load.log_tail())))
    vals = {}
    for kv in line.split():
        k, _, v = kv.partition("=")
        vals[k] = float(v)
    gw.result = vals
    return vals


def redis_script_calls(port):
    info = rh.redis_cmd(port, "INFO", "commandstats")
    return sum(int(n) for n in re.findall(
        r"^cmdstat_(?:evalsha|eval|evalsha_ro|eval_ro):calls=(\d+)", info, re.M))


# Script calls by kind (--by-kind): the decision script's arguments say what a call is
# (lua/decide.lua: 5 per limit, then want, mode, lease... for a batch; "M" for several
# decisions); the heartbeat script is the only EVAL.
CALL_KINDS = ("heartbeat", "decision", "grant", "report", "return", "multi")


def call_kind(args):
    """The kind of one EVAL/EVALSHA (its arguments after the command name), or None."""
    if len(args) < 2 or not args[1].isdigit():
        return None
    nkeys = int(args[1])
    argv = args[2 + nkeys:]
    if argv[:1] == ["M"]:
        return "multi"
    if argv and not re.fullmatch(r"[1-4]", argv[0]):
        return "heartbeat"
    batch = argv[5 * nkeys:]
    if len(batch) >= 2:
        return "report" if batch[1] == "1" else "grant"
    costs = argv[4:5 * nkeys:5]
    if costs and all(c.lstrip("-").isdigit() and int(c) < 0 for c in costs):
        return "return"
    return "decision"


class CallMonitor:
    """A MONITOR connection on Redis counting script calls by kind (CALL_KINDS)."""

    ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def __init__(self, port):
        self.counts = collections.Counter()
        self.lock = threading.Lock()
        self.sock = socket.create_connection((rh.LOCALHOST, port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.f = self.sock.makefile("rb")
        if self.f.readline().strip() != b"+OK":
            raise rh.SetupError("MONITOR refused")
        self.sock.settimeout(None)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for line in self.f:
                args = self.ARG.findall(line.decode("latin-1"))
                if not args or args[0].upper() not in ("EVAL", "EVALSHA"):
                    continue
                kind = call_kind(args[1:])
                if kind:
                    with self.lock:
                        self.counts[kind] += 1
        except (OSError, ValueError):
            pass                        # closed: the run is over

    def snapshot(self):
        with self.lock:
            return collections.Counter(self.counts)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# ---------------------------------------------------------------------------------------
# One run: one mode, one scenario

def run_one(h, args, mode, scen, redis_port, monitor=None):
    ngw = args.gateways
    duration = scen["duration"] * args.scale
    tag = "%s-%s" % (mode["key"], scen["key"])
    prefix = "acc%d%d-%d" % ([m["key"] for m in MODES].index(mode["key"]),
                             SCENARIOS.index(scen), os.getpid())
    cfg = agent_config(mode, scen, redis_port, ngw, args, prefix)
    needs_redis = cfg.get("store") == "redis"
    client = "client-%s-" % tag          # one API key: client-<tag>-0, through every gateway
    gws = plan(ngw, scen["total_rate"], args)

    # gateways up from the start
    for gw in gws:
        if gw.start_frac == 0:
            gw.agent, gw.port = start_gateway_agent(h, args.agent, cfg,
                                                    "%s-gw%02d" % (tag, gw.idx), needs_redis)
    day0 = time.gmtime().tm_yday
    calls0 = redis_script_calls(redis_port)
    kinds0 = monitor.snapshot() if monitor else None

    t0 = time.monotonic()
    for gw in gws:                      # all end together, however long spawning took
        if gw.start_frac == 0:
            left = t0 + duration * gw.stop_frac - time.monotonic()
            start_load(h, args.load, gw, gw.port, left, client, "%s-load%02d" % (tag, gw.idx))
    pending = [g for g in gws if g.start_frac > 0]
    running = [g for g in gws if g.load is not None]
    deadline = t0 + duration + 20
    while running or pending:
        now = time.monotonic()
        if now > deadline:
            raise rh.SetupError("%s: load generators still running %.0f s after the end" % (
                tag, now - t0 - duration))
        for gw in [g for g in pending if now - t0 >= g.start_frac * duration]:
            pending.remove(gw)          # joins: a new agent, then its share of the traffic
            gw.agent, gw.port = start_gateway_agent(
                h, args.agent, cfg, "%s-gw%02d" % (tag, gw.idx), needs_redis)
            left = t0 + duration * gw.stop_frac - time.monotonic()
            start_load(h, args.load, gw, gw.port, left, client, "%s-load%02d" % (tag, gw.idx))
            running.append(gw)
        for gw in [g for g in running if not g.load.alive()]:
            running.remove(gw)
            load_result(h, gw)
            if gw.stop_frac < 1.0:      # leaves: its traffic is done, the agent stops
                h.stop(gw.agent, 3.0)
        time.sleep(0.01)

    calls1 = redis_script_calls(redis_port)
    day1 = time.gmtime().tm_yday
    kinds = None
    if monitor:
        # MONITOR lags the commands a little: wait until it has seen as many as INFO counted
        deadline = time.monotonic() + 2
        while (sum((monitor.snapshot() - kinds0).values()) < calls1 - calls0 and
               time.monotonic() < deadline):
            time.sleep(0.01)
        kinds = monitor.snapshot() - kinds0
    for gw in gws:                      # SIGTERM every agent first, then reap each
        if gw.agent.alive():
            gw.agent.p.send_signal(signal.SIGTERM)
    for gw in gws:
        h.stop(gw.agent, 3.0)

    r = {"offered": 0, "decisions": 0, "allowed": 0, "degraded": 0, "unanswered": 0}
    for gw in gws:
        v = gw.result
        r["offered"] += int(v.get("sent", v["decisions"]))
        r["decisions"] += int(v["decisions"])
        r["allowed"] += int(v["allowed"])
        r["degraded"] += int(v["degraded"])
        r["unanswered"] += int(v.get("unanswered", 0))
    r["admitted"] = r["allowed"] + r["degraded"]
    first = min(g.load_t0 for g in gws)
    last = max(g.load_t0 + g.result["seconds"] for g in gws)
    r["span"] = last - first
    # what one exact limiter admits: the limit, or everything when less was offered
    r["expected"] = min(r["offered"], scen["expected"](r["span"]))
    r["calls"] = calls1 - calls0
    r["kinds"] = kinds
    r["crossed_day"] = scen["key"] == "daily" and day0 != day1
    roles = {}
    for gw in gws:
        s = roles.setdefault(gw.role, [0, 0, 0])
        s[0] += 1
        s[1] += int(gw.result.get("sent", gw.result["decisions"]))
        s[2] += int(gw.result["allowed"] + gw.result["degraded"])
    r["roles"] = roles
    return r


# ---------------------------------------------------------------------------------------
# Output

def ratio(a, b):
    return "%.2f" % (a / b) if b else "-"


def per_decision(calls, decisions):
    return "%.3f" % (calls / decisions) if decisions else "-"


def dump_failed(h, nlines=15):
    """The logs of the processes that failed; the ones still running by name only (there
    are dozens). --keep keeps every log."""
    running = []
    for p in h.all_procs:
        if p.alive():
            running.append("%s (pid %d)" % (p.name, p.pid))
        elif p.p.returncode != 0:
            sys.stderr.write("---- %s (pid %d, exit %s)\n%s\n" % (
                p.name, p.pid, p.p.returncode, rh.indent(p.log_tail(nlines))))
    if running:
        sys.stderr.write("---- still running when it failed (stopped now): %s\n" %
                         ", ".join(running))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", default=str(rh.REPO / "build" / "spoa-ratelimit"))
    ap.add_argument("--load", default=str(rh.REPO / "build" / "spop-load"))
    ap.add_argument("--gateways", type=int, default=20, help="agents per mode (20)")
    ap.add_argument("--joiners", type=int, default=4, help="gateways that join late (4)")
    ap.add_argument("--leavers", type=int, default=4, help="gateways that leave early (4)")
    ap.add_argument("--join-at", type=float, default=0.3, help="fraction of the run (0.3)")
    ap.add_argument("--leave-at", type=float, default=0.7, help="fraction of the run (0.7)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the scenario durations (1.0: 10 s, 5 s and 4 s)")
    ap.add_argument("--modes", default=",".join(m["key"] for m in MODES),
                    help="comma-separated modes (default: all)")
    ap.add_argument("--scenarios", default=",".join(s["key"] for s in SCENARIOS))
    ap.add_argument("--command-timeout-ms", type=int, default=1000,
                    help="agents' redis.command_timeout_ms (1000: measure decisions, not"
                         " fail-open; degraded answers are counted anyway)")
    ap.add_argument("--time-limit", type=int, default=420, help="watchdog, seconds (420)")
    ap.add_argument("--verbose", action="store_true", help="traffic per gateway role")
    ap.add_argument("--by-kind", action="store_true",
                    help="script calls by kind (a MONITOR connection on Redis)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    rh.setup_stdout()

    args.agent = os.path.abspath(args.agent)
    args.load = os.path.abspath(args.load)
    for b in (args.agent, args.load):
        if not os.access(b, os.X_OK):
            print("%s not found: run `make` first" % b, file=sys.stderr)
            return 2
    modes = [dict(m, label=m["label"].replace("{N}", str(args.gateways)))
             for m in MODES if m["key"] in args.modes.split(",")]
    scens = [s for s in SCENARIOS if s["key"] in args.scenarios.split(",")]
    if (not modes or not scens or args.gateways < 2 + args.joiners + args.leavers + 1 or
            not 0 < args.join_at < args.leave_at < 1 or not 0.1 <= args.scale <= 5):
        print("bad arguments", file=sys.stderr)
        return 2

    h = rh.Harness("rl-accuracy-", args.time_limit)
    h.keep = args.keep
    return rh.run_guarded(h, lambda: run(h, args, modes, scens), dump_failed)


def run(h, args, modes, scens):
    t_start = time.monotonic()
    ngw = args.gateways
    red, rport = rh.start_redis(h)
    monitor = CallMonitor(rport) if args.by_kind else None
    rver = re.search(r"redis_version:(\S+)", rh.redis_cmd(rport, "INFO", "server"))
    print("spoa-ratelimit accuracy: %d gateways (one agent each) on one Redis %s, %d cores" % (
        ngw, rver.group(1) if rver else "?", os.cpu_count() or 0))
    print("=" * 96)
    print("traffic: one API key through every gateway, each gateway driven by its own paced"
          " spop-load;")
    print("  skew: half the requests on 2 gateways, half over the %d others; churn: %d join"
          " at %d%% of the run," % (ngw - 2, args.joiners, args.join_at * 100))
    print("  %d leave at %d%% (agent stopped). Redis command timeout %d ms." % (
        args.leavers, args.leave_at * 100, args.command_timeout_ms))
    print("admitted = allowed + degraded (a degraded answer lets the request through);"
          " expected = what one")
    print("exact limiter admits; redis calls = EVAL+EVALSHA (INFO commandstats delta) per"
          " decision answered.")
    print("modes: exact = store redis (blocked-key cache on, the default); no blocked cache ="
          " every decision")
    print("  to Redis; local-only = store memory, each gateway its own counter with the full"
          " limit;")
    print("  limit/%d = each gateway the limit / %d; leases = local quotas with an accuracy"
          " budget of 5%%" % (ngw, ngw))
    print("  (leases for hot keys, pre-checks far from the limit, slow keys exact).")
    print()

    results = {}
    for scen in scens:
        d = scen["duration"] * args.scale
        print("(%s) %s; offered %.0f/s for %.0f s; expected %s" % (
            "abc"[SCENARIOS.index(scen)], scen["title"], scen["total_rate"], d,
            scen["expected_text"]))
        for mode in modes:
            if mode["cfg"] is None:
                continue
            t = time.monotonic()
            r = run_one(h, args, mode, scen, rport, monitor)
            results[(mode["key"], scen["key"])] = r
            print("    %-24s offered %5d  admitted %5d  expected %6.0f  (D %.2f s; took %.0f s)" % (
                mode["label"], r["offered"], r["admitted"], r["expected"], r["span"],
                time.monotonic() - t))
            if args.verbose:
                for role in ("heavy", "steady", "joiner", "leaver"):
                    if role in r["roles"]:
                        n, off, adm = r["roles"][role]
                        print("        %-7s x%-2d offered %5d admitted %5d" % (role, n, off, adm))
            if r["kinds"] is not None and r["decisions"]:
                print("        script calls per decision by kind: %s (total %s)" % (
                    ", ".join("%s %.4f" % (k, r["kinds"][k] / r["decisions"])
                              for k in CALL_KINDS if r["kinds"][k]) or "none",
                    per_decision(r["calls"], r["decisions"])))
    print()

    # ---- the table: mode x scenario
    head = "  %-26s %8s %9s %9s %9s %11s %9s" % (
        "mode", "offered", "admitted", "expected", "adm/limit", "redis/dec", "degraded")
    print("results")
    print(head)
    notes = []
    for scen in scens:
        print("  %s" % scen["title"])
        for mode in modes:
            r = results.get((mode["key"], scen["key"]))
            if r is None:
                print("    %-24s %s" % (mode["label"], mode.get("na", "n/a")))
                continue
            print("    %-24s %8d %9d %9.0f %9s %11s %9d" % (
                mode["label"], r["offered"], r["admitted"], r["expected"],
                ratio(r["admitted"], r["expected"]), per_decision(r["calls"], r["decisions"]),
                r["degraded"]))
            if r["unanswered"]:
                notes.append("%s / %s: %d requests sent but not answered (not counted)" % (
                    mode["label"], scen["short"], r["unanswered"]))
            if r["crossed_day"]:
                notes.append("%s / %s: the run crossed 00:00 UTC, the daily window reset" % (
                    mode["label"], scen["short"]))
    print()
    print("side by side: admitted / limit (redis calls per decision)")
    print(("  %-26s" % "" + "".join(" %-26s" % s["short"] for s in scens)).rstrip())
    for mode in modes:
        cells = []
        for scen in scens:
            r = results.get((mode["key"], scen["key"]))
            cells.append(mode.get("na", "n/a") if r is None else "%s (%s)" % (
                ratio(r["admitted"], r["expected"]), per_decision(r["calls"], r["decisions"])))
        print(("  %-26s" % mode["label"] + "".join(" %-26s" % c for c in cells)).rstrip())
    for n in notes:
        print("note: " + n)
    if monitor:
        monitor.close()
    h.stop(red)
    print()
    print("done in %.0f s" % (time.monotonic() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
