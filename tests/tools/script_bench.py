#!/usr/bin/python3
"""The Redis side of a decision: what the decision script costs Redis, per decision.

    /usr/bin/python3 tests/tools/script_bench.py            (or: make bench-script)

One redis-server on loopback, no persistence. Each row is `redis-benchmark -P 32 -c 8
-r 1000` of one EVALSHA, as row P of `make bench` (tests/tools/bench.py) runs it: the
agent's argv for one GCRA limit so high that nothing is denied (rate = burst = 10^9/s),
keys of the agent's length over 1000 principals.

  Q    the seed's naive token bucket (bench.py's SEED_LUA: HMGET, HSET, EXPIRE), the
       reference
  P    the agent's script, one decision a call (the single form)
  M<D> the agent's script, D decisions a call (the multi form, lua/decide.lua), each on
       its own random key

Per row: Redis CPU (utime + stime from /proc) and INFO commandstats usec_per_call, per
call and per decision, and the ratio per decision to Q. Every run makes the same number
of decisions; the rows are interleaved and repeated (--reps), medians shown. The machine
is shared: compare the rows of one run, not runs.

Exit status: 0, 2 on a setup failure, 130 when interrupted.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
import rlharness as rh  # noqa: E402

KEY = "bench:{k:%s__rand_int__}:bench_second" % ("0" * 20)     # the agent's key length


def commands(sha, seed_sha, params, multi):
    """Row name -> (argv after redis-benchmark's options, decisions per call)."""
    p = [str(x) for x in params]
    rows = {"Q": (["EVALSHA", seed_sha, "1", KEY.replace("bench:", "seed:"), str(bench.BIG),
                   str(bench.BIG), "1"], 1),
            "P": (["EVALSHA", sha, "1", KEY] + p, 1)}
    for d in multi:
        argv = ["EVALSHA", sha, str(d)] + [KEY] * d + ["M", str(d)]
        for _ in range(d):
            argv += ["1", "0"] + p
        rows["M%d" % d] = (argv, d)
    return rows


def one_run(h, port, red, argv, calls):
    """Redis CPU (us) and usec_per_call of <calls> calls of <argv>."""
    bench_bin = rh.which("redis-benchmark", "REDIS_BENCHMARK_BIN")
    rh.redis_cmd(port, "CONFIG", "RESETSTAT")
    meter = bench.CpuMeter({"redis": red})
    meter.start()
    rc, out = h.run("redis-benchmark", [bench_bin, "-p", str(port), "-P", "32", "-c", "8", "-n",
                                        str(calls), "-r", "1000", "-q"] + argv, timeout=60)
    cpu = meter.stop()["redis"]
    if rc != 0 or not re.search(r"requests per second", out.replace("\r", "\n")):
        raise rh.SetupError("redis-benchmark failed (exit %s):\n%s" % (rc, rh.indent(out)))
    if re.search(r"ERR|NOSCRIPT|WRONGTYPE", out):
        raise rh.SetupError("redis-benchmark got error replies:\n%s" % rh.indent(out[-2000:]))
    stats = rh.redis_cmd(port, "INFO", "commandstats")
    m = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+),usec_per_call=([0-9.]+)", stats)
    # redis-benchmark -P rounds the calls up to whole pipelines: the calls made count
    if not m or int(m.group(1)) < calls:
        raise rh.SetupError("INFO commandstats: %d EVALSHA calls expected:\n%s" % (
            calls, rh.indent(stats)))
    return cpu * 1e6 / int(m.group(1)), float(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", default=None,
                    help="assembled script (default: build/gen/ratelimit.lua)")
    ap.add_argument("--model", default=None, help="limit_model binary (default: build/)")
    ap.add_argument("--multi", default="1,8,32", help="decisions per multi call (1,8,32)")
    ap.add_argument("--decisions", type=int, default=200000,
                    help="decisions per run (200000)")
    ap.add_argument("--reps", type=int, default=3, help="runs per row (3)")
    args = ap.parse_args()
    rh.setup_stdout()
    build = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                          "..", "build"))
    script = args.script or os.path.join(build, "gen", "ratelimit.lua")
    model = args.model or os.path.join(build, "limit_model")
    multi = [max(1, min(int(x), 512)) for x in args.multi.split(",") if x]
    args.decisions = max(1000, min(args.decisions, 10 ** 6))
    args.reps = max(1, min(args.reps, 9))
    for what, p in (("script", script), ("limit_model", model)):
        if not os.path.exists(p):
            print("%s %s not found: run `make all build/limit_model` first" % (what, p),
                  file=sys.stderr)
            return 2
    h = rh.Harness("rl-script-bench-", 60 + args.reps * (2 + len(multi)) * 40)
    return rh.run_guarded(h, lambda: run(h, args, script, model, multi))


def run(h, args, script, model, multi):
    red, port = rh.start_redis(h, "redis")
    with open(script) as f:
        sha = rh.redis_cmd(port, "SCRIPT", "LOAD", f.read())
    seed_sha = rh.redis_cmd(port, "SCRIPT", "LOAD", bench.SEED_LUA)
    a, b = bench.gcra_params(model)
    rows = commands(sha, seed_sha, [bench.ALG_GCRA, a, b, 0, 1], multi)
    print("Redis CPU per decision: redis-benchmark -P 32 -c 8 -r 1000, %d decisions a run,"
          " %d runs a row (medians)" % (args.decisions, args.reps))
    print("load average %.1f at start" % os.getloadavg()[0])
    got = {k: [] for k in rows}
    for _ in range(args.reps):
        for k, (argv, d) in rows.items():
            got[k].append(one_run(h, port, red, argv, max(1, args.decisions // d)))
    seed_cpu = statistics.median(x[0] for x in got["Q"])
    seed_upc = statistics.median(x[1] for x in got["Q"])
    print()
    print("  %-5s %4s  %14s %14s  %14s %14s  %12s %12s" % (
        "row", "D", "CPU us/call", "usec_per_call", "CPU us/dec", "usec/dec", "CPU / Q", "usec / Q"))
    for k, (argv, d) in rows.items():
        cpu = statistics.median(x[0] for x in got[k])
        upc = statistics.median(x[1] for x in got[k])
        print("  %-5s %4d  %14.2f %14.2f  %14.2f %14.2f  %12.2f %12.2f" % (
            k, d, cpu, upc, cpu / d, upc / d, cpu / d / seed_cpu, upc / d / seed_upc))
    print()
    print("runs (CPU us/call, usec_per_call): " + "; ".join(
        "%s %s" % (k, " ".join("%.2f/%.2f" % x for x in v)) for k, v in got.items()))
    print("load average %.1f at the end" % os.getloadavg()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
