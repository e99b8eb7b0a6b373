"""The C model of each algorithm (src/limiter.c) and its Redis script (lua/) agree.

The same request sequence goes to the script in a real Redis and, at the Redis
times the script reports, to the C model (build/gcra_model); every verdict,
remaining count, retry and reset must be identical.
"""
import os
import pathlib
import random
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = os.environ.get("GCRA_MODEL", str(ROOT / "build" / "gcra_model"))
SCRIPT = (ROOT / "lua" / "gcra.lua").read_text()


def run_model(params, calls):
    """params: [(T, tau)], calls: [(now_us, cost)] -> list of int lists."""
    lines = ["%d %s" % (len(params), " ".join("%d %d" % p for p in params))]
    lines += ["%d %d" % c for c in calls]
    out = subprocess.run([MODEL], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return [[int(x) for x in line.split()] for line in out.splitlines()]


def script_sequence(redis, keys, params, costs, pause_s=0.0):
    """Runs the script once per cost; returns (replies, [(now_us, cost)])."""
    sha = redis.cmd("SCRIPT", "LOAD", SCRIPT)
    replies, calls = [], []
    for cost in costs:
        argv = [str(cost)] + [str(x) for p in params for x in p]
        rep = redis.cmd("EVALSHA", sha, str(len(keys)), *keys, *argv)
        replies.append([int(x) for x in rep])
        calls.append((int(rep[2]), cost))
        if pause_s:
            time.sleep(pause_s)
    return replies, calls


def compare(replies, model):
    assert len(replies) == len(model)
    for i, (rep, mod) in enumerate(zip(replies, model)):
        # reply: allowed, n, now, then 4 per limit; model: allowed, then 4 per limit
        assert [rep[0]] + rep[3:] == mod, "request %d: script %r model %r" % (i, rep, mod)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gcra_script_matches_model(redis, seed):
    """Random costs against two limits (a fast one and a slow one) with pauses that let
    tokens refill, so allow, deny and partial refill all occur."""
    rnd = random.Random(seed)
    # 20 per 200 ms (burst 5) and 50 per day: T=10ms tau=50ms; T=1728 s
    params = [(10000, 50000), (1728000000, 1728000000 * 50)]
    keys = ["rl:{t%d}:fast" % seed, "rl:{t%d}:day" % seed]
    costs = [rnd.choice([0, 1, 1, 1, 2, 3]) for _ in range(60)]
    sha_replies, calls = [], []
    for chunk in range(6):
        r, c = script_sequence(redis, keys, params, costs[chunk * 10:(chunk + 1) * 10])
        sha_replies += r
        calls += c
        time.sleep(rnd.choice([0.0, 0.005, 0.02, 0.06]))
    compare(sha_replies, run_model(params, calls))
    verdicts = {r[0] for r in sha_replies}
    assert verdicts == {0, 1}, "the sequence must exercise both verdicts"


def test_gcra_denial_charges_no_limit(redis):
    """When one limit denies, the other limit's bucket is untouched (script and model)."""
    params = [(1000000, 2000000), (1000, 1000000)]  # 2 per 2 s burst 2; 1000/s
    keys = ["rl:{d}:a", "rl:{d}:b"]
    replies, calls = script_sequence(redis, keys, params, [1, 1, 1, 1, 1])
    compare(replies, run_model(params, calls))
    assert [r[0] for r in replies] == [1, 1, 0, 0, 0]
    # limit b was charged exactly twice: 1000 - 2 tokens left (minus refill since)
    assert replies[-1][3 + 4 + 1] >= 998


def test_gcra_keys_expire_when_full(redis):
    params = [(100000, 300000)]  # 10/s burst 3
    replies, _ = script_sequence(redis, ["rl:{e}:x"], params, [1])
    ttl = int(redis.cmd("PTTL", "rl:{e}:x"))
    assert 0 < ttl <= 100, ttl
    time.sleep(0.25)
    assert redis.cmd("EXISTS", "rl:{e}:x") == 0
