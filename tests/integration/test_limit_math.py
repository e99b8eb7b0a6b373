"""Limit arithmetic: GCRA's fixed-point interval in the real script (rate error <= 0.01%
up to 10,000,000/s, script and C model identical), costs and states at their extremes,
and what `-c` refuses because it cannot be represented or would stall Redis.

Time is Redis TIME as the script reports it: the counts are checked against the times in
the replies, never against the test's clock.
"""
import subprocess

import pytest

from conftest import LcList, agent_config, agent_env, to_libconfig
from test_model_agreement import FIXED, GCRA, LOG, MODEL, SLIDING, compare, run_model, \
    run_script, script

DAY_MS = 86400 * 1000


def params(alg, rate, period_ms, burst=0):
    """(a, b) as the agent sends them (limit_params_init through build/limit_model)."""
    out = subprocess.run([MODEL, "--params", str(alg), str(rate), str(period_ms), str(burst)],
                         capture_output=True, text=True, check=True, timeout=10).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.parametrize("rate", [700000, 9999999, 10000000])
def test_gcra_admits_the_rate_in_redis(redis, rate):
    """A client taking every token as soon as it is there gets burst + rate x elapsed
    (Redis time), within 0.01%. With the interval in whole microseconds, 700,000/s gave
    1,000,000/s and anything above 1,000,000/s gave 1,000,000/s."""
    a, b = params(GCRA, rate, 1000)
    lim = (GCRA, a, b, 0)
    sha = redis.cmd("SCRIPT", "LOAD", script())
    key = ["rl:{prec%d}:g" % rate]
    replies, calls = [], []
    got, t1, left = 0, None, 0
    for _ in range(300):
        probe = run_script(redis, sha, key, [lim], 0)
        replies.append(probe)
        calls.append((probe[2], 0))
        if t1 is None:
            assert probe[4] == rate  # a full bucket: burst = rate
        take = run_script(redis, sha, key, [lim], probe[4])  # at least that much by now
        assert take[0] == 1, take
        replies.append(take)
        calls.append((take[2], probe[4]))
        if t1 is None:
            t1 = take[2]  # the bucket stops being full: time counts from here
        got += probe[4]
        left = take[4]
    # every token there was by the last call was taken or is left
    span = calls[-1][0] - t1
    want = rate * span / 1e6
    assert span > 10000, "too few microseconds elapsed to measure"
    print("%d/s: %d admitted after the burst in %d us of Redis time, rate x time = %.1f"
          % (rate, got + left - rate, span, want))
    assert abs(got + left - rate - want) <= 2 + want * 1e-4, (got + left - rate, want, span)
    compare(replies, run_model([lim], calls))


@pytest.mark.parametrize("rate,period_ms,burst", [(7, 1000, 3), (700000, 1000, 50),
                                                  (3, 60000, 0), (10000, 1, 0),
                                                  (1, 366 * DAY_MS, 17)])
def test_fixed_point_script_matches_model(redis, rate, period_ms, burst):
    """Random costs, refunds and pauses on fixed-point intervals: every field of every
    reply equals the C model's at the same Redis times (the fraction carried in the key
    included)."""
    import random
    import time
    rnd = random.Random("%d/%d" % (rate, period_ms))
    a, b = params(GCRA, rate, period_ms, burst)
    assert b % a > 0  # a fixed-point interval, not whole microseconds
    lims = [(GCRA, a, b, 0)]
    sha = redis.cmd("SCRIPT", "LOAD", script())
    key = ["rl:{fp%d-%d}:g" % (rate, period_ms)]
    replies, calls = [], []
    top = max(2, (burst or rate) // 4)
    for _ in range(80):
        cost = rnd.choice([0, 1, 1, 2, top, -1, -top, (burst or rate) + 1])
        rep = run_script(redis, sha, key, lims, cost)
        replies.append(rep)
        calls.append((rep[2], cost))
        time.sleep(rnd.choice([0, 0, 0.001, 0.005]))
    compare(replies, run_model(lims, calls))
    assert {r[0] for r in replies} == {0, 1}


def test_extreme_costs_neither_overflow_nor_disagree(redis):
    """Costs far beyond anything real, for GCRA at 1/366d with the largest burst `-c`
    takes, for the windows at the largest rate and for a sliding log (at most 100 entries
    a call): script and model agree field for field and every number stays an integer
    Redis can return."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    a, b = params(GCRA, 1, 366 * DAY_MS, 17)
    lims = [(GCRA, a, b, 0), (FIXED, 366 * DAY_MS * 1000, 10 ** 9, 0),
            (SLIDING, 366 * DAY_MS * 1000, 10 ** 9, 0), (GCRA, *params(GCRA, 10 ** 9, 1), 0),
            (LOG, 3600 * 10 ** 6, 1000, 0)]
    keys = ["rl:{x}:%d" % i for i in range(len(lims))]
    replies, calls = [], []
    for cost in [1, 2 ** 62, -2 ** 62, 2 ** 53 + 1, 10 ** 15, -(2 ** 53), 10 ** 9, 17, -1, 0,
                 9223372036854775807, -9223372036854775808, 101, 100, [1, 1, 1, 1, 101],
                 [5, 5, 5, 5, 100], -150]:
        rep = run_script(redis, sha, keys, lims, cost)
        replies.append(rep)
        calls.append((rep[2], cost))
        assert all(x >= 0 for x in rep[3:]), rep
    compare(replies, run_model(lims, calls))


def test_state_of_earlier_versions_and_junk(redis):
    """A key holding the TAT alone (as earlier versions wrote it) is read as that TAT;
    a fraction from another tick size is clamped into one microsecond; junk is an empty
    bucket. Script and model agree on each."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    a, b = params(GCRA, 10, 1000)  # 10/s, burst 10: one token per 100 ms
    lim = [(GCRA, a, b, 0)]
    now = int(redis.cmd("EVAL", "local t = redis.call('TIME') return t[1] * 1000000 + t[2]",
                        "0"))
    # five tokens owed, written as earlier versions did (whole microseconds)
    redis.cmd("SET", "rl:{old}:g", str(now + 5 * 100000), "PX", "10000")
    rep = run_script(redis, sha, ["rl:{old}:g"], lim, 0)
    assert rep[4] in (5, 6), rep  # five owed, give or take the time the calls took
    redis.cmd("SET", "rl:{old}:h", "%d:%d" % (now + 300000, 10 ** 30), "PX", "10000")
    rep = run_script(redis, sha, ["rl:{old}:h"], lim, 0)
    assert rep[4] in (6, 7), rep
    for junk in ["abc", "-5", "1.5e300", ":", "12:x"]:
        redis.cmd("SET", "rl:{old}:j", junk)
        rep = run_script(redis, sha, ["rl:{old}:j"], lim, 1)
        assert rep[0] == 1 and rep[4] == 9, (junk, rep)


def test_script_refuses_parameters_out_of_range(redis):
    """Parameters no agent computes are an error reply, not arithmetic beyond 2^53."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    for lim, cost in [((GCRA, 0, 0, 0), 1), ((GCRA, 2 ** 51, 2 ** 51, 0), 1),
                      ((GCRA, 1000, 1041, 0), 1), ((FIXED, 0, 5, 0), 1),
                      ((GCRA, 1000, 5000, 0), "1.5"), ((GCRA, 1000, 5000, 0), "x")]:
        with pytest.raises(Exception):
            run_script(redis, sha, ["rl:{bad}:g"], [lim], cost)


def test_sliding_log_adds_a_bounded_number_of_entries(redis):
    """One call never adds more than 100 entries to a sliding log: a single cost above is
    denied (retry: one window), a batch is granted no more, a report records no more, and
    reports stop at the limit + 100 entries."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    lim = (LOG, 60 * 10 ** 6, 1000, 0)
    rep = run_script(redis, sha, ["rl:{lg}:a"], [lim], 101)
    assert rep[0] == 0 and rep[5] == 60000, rep
    assert int(redis.cmd("EXISTS", "rl:{lg}:a")) == 0
    # a batch of 500 one-token units: 100 granted
    argv = [str(x) for x in lim + (1,)] + ["500", "0", "0"]
    rep = [int(x) for x in redis.cmd("EVALSHA", sha, "1", "rl:{lg}:b", *argv)]
    assert rep[-2] == 100 and int(redis.cmd("ZCARD", "rl:{lg}:b")) == 100, rep
    # a report of 5,000 units (over the limit): 100 entries recorded
    argv = [str(x) for x in lim + (1,)] + ["5000", "1", "0"]
    redis.cmd("EVALSHA", sha, "1", "rl:{lg}:b", *argv)
    assert int(redis.cmd("ZCARD", "rl:{lg}:b")) == 200
    # reports never fill a log past its limit + 100 (what a call may have to trim)
    small = (LOG, 60 * 10 ** 6, 150, 0)
    argv = [str(x) for x in small + (1,)] + ["5000", "1", "0"]
    for _ in range(4):
        redis.cmd("EVALSHA", sha, "1", "rl:{lg}:c", *argv)
    assert int(redis.cmd("ZCARD", "rl:{lg}:c")) == 250


# ---------------------------------------------------------------------------------------
# -c

def _check(agent_bin, tmp, over):
    base = dict(limits={"a": {"rate": 1, "period": "1m"}}, tiers={"t": {"limits": ["a"]}},
                default_tier=None, anonymous={"limits": ["a"]}, store="memory")
    text = to_libconfig(agent_config("127.0.0.1:1", None, **dict(base, **over)))
    p = tmp / "math.conf"
    p.write_text(text)
    out = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                         timeout=10, env=agent_env())
    return out, text, p


def _line_of(text, needle):
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


_REFUSED = {
    "gcra_burst_366d": ({"a": {"rate": 1, "period": "366d", "burst": 1000000000}},
                        None, "burst = 1000000000;", "takes longer than 2^49 us"),
    "gcra_burst_18": ({"a": {"rate": 1, "period": "366d", "burst": 18}}, None, "burst = 18;",
                      "not representable"),
    "log_rate": ({"a": {"rate": 1001, "period": "1h", "algorithm": "sliding_log"}}, None,
                 "a = {", "at most 1000 per period"),
    "log_budget": ({"a": {"rate": 100, "period": "1h", "algorithm": "sliding_log",
                          "accuracy_budget": 0.05}}, None, "accuracy_budget",
                   "'accuracy_budget' (batches of tokens) must be 0"),
    "log_cost": ({"a": {"rate": 1000, "period": "1h", "algorithm": "sliding_log"}},
                 [{"name": "big", "route": "r", "cost": 101}], "endpoints = (",
                 "cost 101 for sliding_log limit 'a'"),
    "log_limit_cost": ({"a": {"rate": 1, "period": "1m"},
                        "l": {"rate": 1000, "period": "1h", "algorithm": "sliding_log"}},
                       [{"name": "e", "route": "r", "limits": ["l"],
                         "limit_costs": {"l": 500}}], "endpoints = (",
                       "cost 500 for sliding_log limit 'l'"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_check_refuses_what_cannot_be_represented_or_bounded(agent_bin, tmp, case):
    limits, endpoints, needle, msg = _REFUSED[case]
    over = dict(limits=limits)
    if endpoints:
        over["endpoints"] = LcList(endpoints)
    out, text, p = _check(agent_bin, tmp, over)
    assert out.returncode == 1, out
    assert "%s:%d: " % (p, _line_of(text, needle)) in out.stderr and msg in out.stderr, (
        out.stderr, text)


def test_check_takes_the_bounds_themselves(agent_bin, tmp):
    over = dict(limits={"a": {"rate": 1, "period": "366d", "burst": 17},
                        "f": {"rate": 10 ** 9, "period": "1ms"},
                        "w": {"rate": 10 ** 9, "period": "366d", "algorithm": "sliding_window"},
                        "l": {"rate": 1000, "period": "1h", "algorithm": "sliding_log"}},
                tiers={"t": {"limits": ["a", "f", "w", "l"]}},
                endpoints=LcList([{"name": "e", "route": "r", "cost": 100}]))
    out, _, _ = _check(agent_bin, tmp, over)
    assert out.returncode == 0, out
