#!/usr/bin/env python3
"""make soak: steady load for minutes to an hour, with reloads, Redis restarts and a worker
restart; samples what must stay flat and says whether each has levelled off.

One Redis, one agent with two workers (SO_REUSEPORT), and spop-load sending exact
decisions at a steady rate over many keys (two limits: a per-second bucket and a daily
window), in segments of 30 s (a segment is where errors are counted; a killed worker's
connections end its segment's errors; each segment draws its keys with a seed of its own,
so the key space is covered as by one long run). The load runs on --conns connections
(64, 256 decisions in flight in all), new ones each segment: the kernel spreads them over the
workers at random, and a worker's memory follows the largest share of the keys it has ever
carried (its tables and the allocator's heap keep their high-water mark). With 8
connections a worker's share swings by ±18% from one segment to the next and a new record
share now and then raises its RSS by a few hundred KB, long after start; with 64, by ±6%,
and the records of the second half are within the tolerance. Meanwhile:

  * a reload (SIGHUP to the master, which forwards it) every --reload seconds, the
    configuration alternating between two versions (the daily limit 100000 and 100001);
  * the agent's first worker SIGKILLed once, at 15% of the run (the master starts another);
  * Redis stopped and started again on its port twice, at 25% and 40% of the run.

Every --sample seconds: the RSS of the master and of the workers (VmRSS) with its parts
(RssAnon: heap, tables, stacks; RssFile: pages of the binary and its libraries), their open
file descriptors, the workers' heap as the C library counts it (bytes in use, and freed but
held), Redis's used_memory and its number of keys, and the agent's gauges of its bounded
structures (/metrics). The disruptions all happen in the first half; the second half is
steady load with reloads. The verdict compares the growth over the first and the second
quarter of that half (medians of the samples at each end): a value has levelled off when the
later growth is at most half the earlier one, or within a small tolerance (RSS
512 KB, descriptors 2, Redis memory 2%). Redis memory grows until every key of the key
space has been seen (at 3,000/s over 200,000 keys, about 14 minutes): its keys are printed
beside it. Judged: the master's and the workers' anonymous RSS (their private memory),
descriptors, Redis memory. Shown, not judged: RSS whole (its file-backed part grows as
code runs for the first time in a process: a worker started mid-run pages in the
reconnection's code at the next Redis restart; bounded by the files' size, and shared),
the heap's use and free bytes (they follow the live state: the keys of the last seconds,
the last minute's failures) and Redis's keys.

Loopback only; every process is started here and stopped by PID at the end (see
rlharness.py); the whole run is bounded by its duration plus two minutes. The rate should
be one the machine carries with room to spare (the default, 3,000/s, is about a third of
one core of a 2-core machine for the agent and Redis together).

  soak.py --agent build/spoa-ratelimit --load build/spop-load [--minutes 10] [--rate 3000]
          [--keys 200000] [--reload 30] [--sample 10] [--workers 2]
          [--conns 64]
Exit status: 0 when every judged value levelled off and no decision failed outside the worker's
restart, 1 otherwise, 2 when the set-up failed.
"""

import argparse
import os
import re
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import rlharness as rh

SEGMENT = 30.0

LIMITS = {
    "per_second": {"rate": 10, "period": "1s", "burst": 20},
    "per_day": {"algorithm": "fixed_window", "rate": 100000, "period": "1d"},
}

# the agent's gauges of bounded structures, sampled with the rest (workers summed)
GAUGES = ["spoa_ratelimit_local_quota_keys", "spoa_ratelimit_local_keys",
          "spoa_ratelimit_override_entries", "spoa_ratelimit_redis_pending"]


def agent_cfg(metrics_port, redis_port, day_rate, workers=2):
    return {
        "log_level": "notice",
        "store": "redis",
        "workers": workers,
        # the default deadlines (5 ms a command): a loaded machine misses some, and
        # the failure ladder's local state is exercised as in production
        "redis": {"address": "%s:%d" % (rh.LOCALHOST, redis_port)},
        "limits": dict(LIMITS, per_day=dict(LIMITS["per_day"], rate=day_rate)),
        "tiers": {"free": {"limits": ["per_second", "per_day"]}},
        "default_tier": "free",
        "anonymous": {"limits": ["per_second"]},
        "metrics": {"listen": "%s:%d" % (rh.LOCALHOST, metrics_port)},
    }


def children(pid):
    try:
        return [int(x) for x in Path("/proc/%d/task/%d/children" % (pid, pid)).read_text().split()]
    except OSError:
        out = []
        for d in Path("/proc").iterdir():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if d.name.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
        return sorted(out)


def mem_kb(pid):
    """VmRSS and its parts (RssAnon: heap, tables, stacks; RssFile: the pages of the binary
    and its libraries mapped so far; RssShmem: the metrics region), in KB."""
    out = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0}
    try:
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            k = line.split(":", 1)[0]
            if k in out:
                out[k] = int(line.split()[1])
    except OSError:
        pass
    return out


def nfds(pid):
    try:
        return len(list(Path("/proc/%d/fd" % pid).iterdir()))
    except OSError:
        return 0


def redis_memory(port):
    try:
        info = rh.redis_cmd(port, "INFO", "memory")
        used = int(re.search(r"used_memory:(\d+)", info).group(1))
        keys = int(rh.redis_cmd(port, "DBSIZE"))
        return used, keys
    except (OSError, RuntimeError, AttributeError):
        return None, None


def gauges(metrics_port):
    try:
        with urllib.request.urlopen("http://%s:%d/metrics" % (rh.LOCALHOST, metrics_port),
                                    timeout=3) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for state in ("in_use", "free"):
        m = re.search(r'^spoa_ratelimit_heap_bytes\{state="%s"\} (\S+)$' % state, text, re.M)
        if m:
            out["heap_" + state] = float(m.group(1))
    for name in GAUGES:
        vals = [float(m) for m in re.findall(r"^%s(?:\{[^}]*\})? (\S+)$" % name, text, re.M)]
        if vals:
            out[name] = sum(vals)
    return out


def levelled(xs, tol):
    """(earlier growth, later growth, verdict) over samples <xs> of the steady half: the
    growth over its first and second quarter, medians of three samples at each end."""
    n = len(xs)
    if n < 8:
        return None, None, "too few samples"
    k = max(1, min(3, n // 8))
    a = statistics.median(xs[:k])
    m = statistics.median(xs[n // 2 - k // 2: n // 2 - k // 2 + k])
    b = statistics.median(xs[-k:])
    g1, g2 = m - a, b - m
    ok = g2 <= max(tol, g1 / 2)
    return g1, g2, "levelled off" if ok else "still growing"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--keys", type=int, default=200000)
    ap.add_argument("--reload", type=float, default=30)
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--conns", type=int, default=64)
    args = ap.parse_args()
    args.agent, args.load = str(Path(args.agent).resolve()), str(Path(args.load).resolve())
    dur = args.minutes * 60
    if dur < 120:
        print("soak: at least 2 minutes", file=sys.stderr)
        return 2
    if args.workers < 2:
        print("soak: at least 2 workers (one worker is killed and restarted by the master)",
              file=sys.stderr)
        return 2

    h = rh.Harness("spoa-soak-", dur + 120)
    try:
        redis, rport = rh.start_redis(h)
        mport = rh.free_ports(1)[0]
        conf_a = agent_cfg(mport, rport, 100000, args.workers)
        conf_b = agent_cfg(mport, rport, 100001, args.workers)
        agent, aport, conf_path = rh.start_agent(h, args.agent, conf_a)
        alt = [rh.to_libconfig(dict(conf_a, listen="%s:%d" % (rh.LOCALHOST, aport))),
               rh.to_libconfig(dict(conf_b, listen="%s:%d" % (rh.LOCALHOST, aport)))]
        deadline = time.monotonic() + 10
        while len(children(agent.pid)) < args.workers:
            if time.monotonic() >= deadline:
                raise rh.SetupError("the agent did not start its %d workers" % args.workers)
            time.sleep(0.1)
    except rh.SetupError as e:
        print("soak: set-up failed: %s" % e, file=sys.stderr)
        h.dump_logs()
        h.close()
        return 2

    print("soak: %.0f min, %d decisions/s over %d keys (two limits), %d workers; a reload "
          "every %.0f s; worker killed at %.0f s; Redis restarted at %.0f s and %.0f s; "
          "a sample every %.0f s" % (args.minutes, args.rate, args.keys, args.workers, args.reload,
                                     0.15 * dur, 0.25 * dur, 0.40 * dur, args.sample))
    print("%6s %9s %9s %9s %8s %8s %8s %8s %5s %10s %8s %9s %7s %8s  %s" % (
        "t(s)", "master_kb", "worker_kb", "total_kb", "w_anon", "w_file", "heap_kb",
        "hfree_kb", "fds", "redis_b",
        "keys", "decided",
        "errors", "degraded", "gauges"))
    t0 = time.monotonic()
    events = [(0.15 * dur, "kill"), (0.25 * dur, "redis"), (0.40 * dur, "redis")]
    next_reload, next_sample, nreload = args.reload, 0.0, 0
    load, seg_start, seg_killed, nseg = None, 0.0, False, 1
    totals = {"decisions": 0, "errors": 0, "degraded": 0, "errors_kill": 0}
    samples = []
    rc = 0
    try:
        while True:
            now = time.monotonic() - t0
            if load is not None and now >= dur:
                load.p.wait(10)     # the last segment ends with the run: counted too
            if load is not None and not load.alive():
                out = load.log_text()
                m = re.search(r"decisions=(\d+).*?degraded=(\d+) errors=(\d+)", out)
                if m:
                    totals["decisions"] += int(m.group(1))
                    totals["degraded"] += int(m.group(2))
                    totals["errors_kill" if seg_killed else "errors"] += int(m.group(3))
                else:
                    totals["errors"] += 1
                h.stop(load)
                load = None
            if now >= dur:
                break
            if load is None:
                seg = min(SEGMENT, dur - now)
                load = h.spawn("load", [args.load, "-a", "%s:%d" % (rh.LOCALHOST, aport),
                                        "-c", args.conns, "-p", max(1, 256 // args.conns), "-r", args.rate, "-d", "%.1f" % seg,
                                        "-k", args.keys, "-t", "free", "-K", "soak-",
                                        "-S", nseg])
                nseg += 1
                seg_start, seg_killed = now, False
            while events and now >= events[0][0]:
                what = events.pop(0)[1]
                if what == "kill":
                    w = children(agent.pid)
                    if w:
                        os.kill(w[0], signal.SIGKILL)
                        seg_killed = True
                        print("# %.0f s: worker %d killed" % (now, w[0]))
                else:
                    h.stop(redis)
                    time.sleep(1.0)
                    redis = h.spawn("redis", redis.argv)
                    print("# %.0f s: Redis restarted" % now)
            if now >= next_reload:
                nreload += 1
                conf_path.write_text(alt[nreload % 2])
                agent.p.send_signal(signal.SIGHUP)
                next_reload += args.reload
            if now >= next_sample:
                ws = children(agent.pid)
                mm = mem_kb(agent.pid)
                wm = [mem_kb(p) for p in ws]
                mr, wr = mm["VmRSS"], sum(m["VmRSS"] for m in wm)
                anon, fil = sum(m["RssAnon"] for m in wm), sum(m["RssFile"] for m in wm)
                fd = nfds(agent.pid) + sum(nfds(p) for p in ws)
                used, keys = redis_memory(rport)
                g = gauges(mport)
                hu, hf = g.pop("heap_in_use", None), g.pop("heap_free", None)
                samples.append({"t": now, "master": mr, "workers": wr, "total": mr + wr,
                                "manon": mm["RssAnon"], "anon": anon, "file": fil,
                                "heap": hu // 1024 if hu is not None else None,
                                "hfree": hf // 1024 if hf is not None else None,
                                "fds": fd, "redis": used, "keys": keys, "gauges": g})
                print("%6.0f %9d %9d %9d %8d %8d %8s %8s %5d %10s %8s %9d %7d %8d  %s" % (
                    now, mr, wr, mr + wr, anon, fil, "%d" % (hu // 1024) if hu is not None else "-",
                    "%d" % (hf // 1024) if hf is not None else "-", fd, used, keys,
                    totals["decisions"],
                    totals["errors"], totals["degraded"],
                    " ".join(["anon_each=" + "/".join(str(m["RssAnon"]) for m in wm)] +
                             ["%s=%g" % (k.replace("spoa_ratelimit_", ""), v)
                              for k, v in sorted(g.items())])), flush=True)
                next_sample += args.sample
            time.sleep(0.2)
        if not agent.alive():
            print("soak: the agent exited (%s)" % agent.p.returncode)
            rc = 1
    except rh.Watchdog as e:
        print("soak: %s" % e)
        rc = 1
    finally:
        steady = [s for s in samples if s["t"] >= dur / 2]
        print("\nsoak: %d decisions, %d errors (+%d in the killed worker's segment), "
              "%d degraded (%.2f%%); %d reloads" % (
                  totals["decisions"], totals["errors"], totals["errors_kill"],
                  totals["degraded"], 100.0 * totals["degraded"] / max(1, totals["decisions"]),
                  nreload))
        print("steady half (%d samples from %.0f s): growth over its first quarter, then "
              "its second" % (len(steady), dur / 2))
        for name, key, tol, unit in (("agent RSS, master", "master", 512, "KB"),
                                     ("agent RSS, workers", "workers", 512, "KB"),
                                     ("agent RSS, total", "total", 512, "KB"),
                                     ("master anonymous", "manon", 512, "KB"),
                                     ("workers anonymous", "anon", 512, "KB"),
                                     ("workers file-backed", "file", 512, "KB"),
                                     ("workers' heap used", "heap", 512, "KB"),
                                     ("workers' heap free", "hfree", 512, "KB"),
                                     ("open descriptors", "fds", 2, ""),
                                     ("Redis used_memory", "redis", None, "B"),
                                     ("Redis keys", "keys", None, "")):
            xs = [s[key] for s in steady if s[key] is not None]
            if tol is None:
                tol = 0.02 * (max(xs) if xs else 0)
            g1, g2, verdict = levelled(xs, tol)
            # judged: the private memory (anonymous RSS), descriptors and Redis. Shown to
            # explain them: RSS whole, whose file-backed part is the code of the binary and
            # its libraries paged in as paths run for the first time (a worker restarted
            # mid-run maps them anew: a Redis restart then pages in the reconnection's),
            # bounded by their size and shared; the heap's use and free bytes, which follow
            # the live state (keys of the last seconds, the last minute's failures)
            judged = key in ("manon", "anon", "fds", "redis")
            if g1 is None:
                print("  %-20s %s" % (name, verdict))
                if judged:
                    rc = 1              # nothing shown levelled off
                continue
            print("  %-20s %+12.0f %s then %+12.0f %s: %s%s" % (
                name, g1, unit, g2, unit, verdict, "" if judged else " (not judged)"))
            if verdict != "levelled off" and judged:
                rc = 1
        if totals["errors"]:
            rc = 1
        if rc and not samples:
            h.dump_logs()
        h.close()
    print("soak: %s" % ("PASS" if rc == 0 else "FAIL"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
