"""Each algorithm's C model (src/core/limiter.c) and its Redis script (lua/) agree.

The same request sequence goes to the assembled script in a real Redis and, at
the Redis times the script reports, to the C models (build/limit_model); every
verdict, remaining count, retry and reset must be identical.
"""
import os
import pathlib
import random
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = os.environ.get("LIMIT_MODEL", str(ROOT / "build" / "limit_model"))
SCRIPT_PATH = os.environ.get("RATELIMIT_LUA", str(ROOT / "build" / "gen" / "ratelimit.lua"))

GCRA, FIXED, LOG, SLIDING, MONTH = 1, 2, 3, 4, 5


def script():
    return pathlib.Path(SCRIPT_PATH).read_text()


def run_model(limits, calls):
    """limits: [(alg, a, b, shadow)], calls: [(now_us, cost or [costs][, "R"])] -> int
    lists ("R": a report)."""
    lines = ["%d %s" % (len(limits), " ".join("%d %d %d %d" % l for l in limits))]
    for now, cost, *report in calls:
        costs = cost if isinstance(cost, (list, tuple)) else [cost]
        lines.append("%d %s%s" % (now, " ".join(str(c) for c in costs),
                                  " R" if report else ""))
    out = subprocess.run([MODEL], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return [[int(x) for x in line.split()] for line in out.splitlines()]


def run_script(redis, sha, keys, limits, cost):
    costs = cost if isinstance(cost, (list, tuple)) else [cost] * len(limits)
    argv = [str(x) for l, c in zip(limits, costs) for x in tuple(l) + (c,)]
    return [int(x) for x in redis.cmd("EVALSHA", sha, str(len(keys)), *keys, *argv)]


def compare(replies, model):
    assert len(replies) == len(model)
    for i, (rep, mod) in enumerate(zip(replies, model)):
        # reply: allowed, n, now, then 4 per limit; model: allowed, then 4 per limit
        assert [rep[0]] + rep[3:] == mod, "request %d: script %r model %r" % (i, rep, mod)


def drive(redis, keys, limits, rnd, count=60, costs=(0, 1, 1, 1, 2, 3),
          pauses=(0.0, 0.0, 0.004, 0.02, 0.06)):
    sha = redis.cmd("SCRIPT", "LOAD", script())
    replies, calls = [], []
    for _ in range(count):
        cost = rnd.choice(costs)
        rep = run_script(redis, sha, keys, limits, cost)
        replies.append(rep)
        calls.append((rep[2], cost))
        time.sleep(rnd.choice(pauses))
    compare(replies, run_model(limits, calls))
    return replies


ALGOS = {
    # 10 per 100 ms, burst 5 (GCRA) / 5 per 100 ms windows
    "gcra": (GCRA, 20000, 100000, 0),
    "fixed_window": (FIXED, 100000, 5, 0),
    "sliding_log": (LOG, 100000, 5, 0),
    "sliding_window": (SLIDING, 100000, 5, 0),
}


@pytest.mark.parametrize("alg", sorted(ALGOS))
@pytest.mark.parametrize("seed", [1, 2])
def test_script_matches_model(redis, alg, seed):
    """Random costs with pauses that let tokens return, so allow, deny, partial refill
    and window changes all occur; together with a slow daily GCRA limit."""
    rnd = random.Random("%s-%d" % (alg, seed))
    limits = [ALGOS[alg], (GCRA, 1728000000, 1728000000 * 200, 0)]
    keys = ["rl:{m%s%d}:a" % (alg, seed), "rl:{m%s%d}:day" % (alg, seed)]
    replies = drive(redis, keys, limits, rnd)
    assert {r[0] for r in replies} == {0, 1}, "the sequence must exercise both verdicts"


def test_all_algorithms_in_one_call(redis):
    rnd = random.Random(7)
    limits = [ALGOS[a] for a in sorted(ALGOS)]
    keys = ["rl:{all}:%d" % i for i in range(len(limits))]
    replies = drive(redis, keys, limits, rnd, count=80)
    assert {r[0] for r in replies} == {0, 1}


def test_denial_charges_no_limit(redis):
    """When one limit denies, no other limit is charged (script and model)."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [(GCRA, 1000000, 2000000, 0), (FIXED, 86400 * 10**6, 1000, 0)]
    keys = ["rl:{d}:a", "rl:{d}:b"]
    replies, calls = [], []
    for _ in range(5):
        rep = run_script(redis, sha, keys, limits, 1)
        replies.append(rep)
        calls.append((rep[2], 1))
    compare(replies, run_model(limits, calls))
    assert [r[0] for r in replies] == [1, 1, 0, 0, 0]
    assert replies[-1][3 + 4 + 1] == 998  # the daily window was charged exactly twice


def test_shadow_limit_never_denies(redis):
    """A shadow limit reports its would-be denial but the request passes; it is not
    charged past its limit."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [(FIXED, 3600 * 10**6, 2, 1), (GCRA, 1000, 1000000, 0)]
    keys = ["rl:{s}:shadow", "rl:{s}:real"]
    replies, calls = [], []
    for _ in range(5):
        rep = run_script(redis, sha, keys, limits, 1)
        replies.append(rep)
        calls.append((rep[2], 1))
    compare(replies, run_model(limits, calls))
    assert [r[0] for r in replies] == [1] * 5
    assert [r[3] for r in replies] == [1, 1, 0, 0, 0]  # the shadow limit's own verdicts


def test_fixed_window_is_calendar_aligned(redis):
    """A 1-second fixed window resets on the second boundary of Redis time (a day window
    resets at 00:00 UTC by the same arithmetic: windows are aligned on the epoch)."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [(FIXED, 1000000, 2, 0)]
    # start right after a boundary so the three calls share one window
    for _ in range(50):
        now = int(redis.cmd("TIME")[1])
        if now < 500000:
            break
        time.sleep((1000000 - now) / 1e6 + 0.001)
    reps = [run_script(redis, sha, ["rl:{cal}:w"], limits, 1) for _ in range(3)]
    assert [r[0] for r in reps] == [1, 1, 0]
    now = reps[2][2]
    assert reps[2][5] == -(-(1000000 - now % 1000000) // 1000)  # retry = until the boundary
    time.sleep((1000000 - now % 1000000) / 1e6 + 0.01)
    assert run_script(redis, sha, ["rl:{cal}:w"], limits, 1)[0] == 1


# The month's functions of lua/fixed_window.lua called at an instant the test chooses
# (the decision script takes its time from Redis TIME), as the driver calls one limit.
MONTH_AT = """
local now, cost, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ok, rc, ru, retry, sc, su, s1 = fixed_month_check(redis.call('GET', KEYS[1]), now, cost,
                                                         1, limit)
if ok == 1 then
    local v, ttl = fixed_month_commit(now, cost, 1, limit, s1)
    redis.call('SET', KEYS[1], v, 'PX', ttl)
    ru, su = rc, sc
end
return { ok, ok, ru, math.ceil(retry / 1000), math.ceil(su / 1000) }
"""


def utc_us(*ymdhms, us=0):
    import calendar
    return calendar.timegm(ymdhms + (0,) * (6 - len(ymdhms))) * 10**6 + us


@pytest.mark.parametrize("name,start", [
    ("last second of a 30-day month", utc_us(2027, 4, 30, 23, 59, 59)),
    ("February of a leap year", utc_us(2028, 2, 29, 23, 59, 58, us=500000)),
    ("February of a common year", utc_us(2027, 2, 28, 23, 59, 58, us=999999)),
    ("December to January", utc_us(2026, 12, 31, 23, 59, 59)),
    ("a century that is no leap year", utc_us(2100, 2, 28, 23, 59, 58)),
])
def test_calendar_month_boundaries(redis, name, start):
    """fixed_window on calendar months ("1mo", algorithm 5): the script's month functions
    and the C model give the same verdicts, remaining counts, retries and resets at the
    same instants, across the end of a month; after the 1st the count starts again."""
    src = (pathlib.Path(__file__).resolve().parents[2] / "lua" / "fixed_window.lua").read_text()
    sha = redis.cmd("SCRIPT", "LOAD", src + MONTH_AT)
    key = "{m}:" + name.replace(" ", "-")
    calls, replies = [], []
    # 3 per month: requests in the last seconds of the month, then across the 1st; the
    # instants stay more than 1 s apart from the key's expiry (its TTL is in real time)
    for dt, cost in ((0, 1), (1000, 2), (200000, 1), (600000, 1), (1100000, 1),
                     (1100000, 3), (1500000, 1), (1500001, 0)):
        now = start + dt if dt < 1000000 else start + 2000000 + dt
        calls.append((now, cost))
        replies.append([int(x) for x in redis.cmd("EVALSHA", sha, "1", key, str(now),
                                                  str(cost), "3")])
    model = run_model([(MONTH, 1, 3, 0)], calls)
    assert replies == model, "%s: script %r model %r" % (name, replies, model)
    # the month ended between the 4th and 5th calls: a full quota again
    assert replies[3][0] == 0 and replies[4][0] == 1 and replies[4][2] == 2, replies


def test_keys_expire(redis):
    sha = redis.cmd("SCRIPT", "LOAD", script())
    for i, (alg, lim) in enumerate([(GCRA, (GCRA, 100000, 300000, 0)),
                                    (FIXED, (FIXED, 200000, 3, 0)),
                                    (LOG, (LOG, 200000, 3, 0)),
                                    (SLIDING, (SLIDING, 200000, 3, 0))]):
        key = "rl:{e}:%d" % i
        run_script(redis, sha, [key], [lim], 1)
        ttl = int(redis.cmd("PTTL", key))
        assert 0 < ttl <= 401, (alg, ttl)
    time.sleep(0.5)
    assert redis.cmd("EXISTS", *["rl:{e}:%d" % i for i in range(4)]) == 0


@pytest.mark.parametrize("alg", sorted(ALGOS))
def test_refund_restores_tokens(redis, alg):
    """A negative cost refunds an earlier charge (used when a decision spanning two
    script calls is denied by the other one): script and model agree, and the tokens
    come back."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [ALGOS[alg]]
    key = ["rl:{r%s}:x" % alg]
    seq = [1, 1, 1, -2, 1, 1, 3, -3, 0]
    replies, calls = [], []
    for c in seq:
        rep = run_script(redis, sha, key, limits, c)
        replies.append(rep)
        calls.append((rep[2], c))
    compare(replies, run_model(limits, calls))
    assert all(r[0] == 1 for r, c in zip(replies, seq) if c < 0), "a refund never denies"
    assert replies[3][4] >= replies[2][4] + 2 or replies[3][4] == 5, replies


def test_per_limit_costs(redis):
    """Each limit can be charged its own cost in one call."""
    rnd = random.Random(11)
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [ALGOS["gcra"], ALGOS["fixed_window"]]
    keys = ["rl:{pc}:a", "rl:{pc}:b"]
    replies, calls = [], []
    for _ in range(40):
        costs = [rnd.choice([0, 1, 2]), rnd.choice([0, 1, 3])]
        rep = run_script(redis, sha, keys, limits, costs)
        replies.append(rep)
        calls.append((rep[2], costs))
        time.sleep(rnd.choice([0, 0.01, 0.03]))
    compare(replies, run_model(limits, calls))


# The debt test's limits are slow (5 per 10 s windows, GCRA 1 per 2 s, burst 5): between
# the call that goes into debt and the one that must be denied, a slow or paused machine
# must not repay the debt by time alone (with 100 ms windows it did, once in CI).
SLOW = {
    "gcra": (GCRA, 2000000, 10000000, 0),
    "fixed_window": (FIXED, 10000000, 5, 0),
    "sliding_log": (LOG, 10000000, 5, 0),
    "sliding_window": (SLIDING, 10000000, 5, 0),
}


@pytest.mark.parametrize("alg", sorted(SLOW))
def test_report_takes_debt(redis, alg):
    """A report of one unit (what a post-charge sends) charges every limit whatever is
    left: a bucket goes into debt, a window past its limit, a sliding log by at most 100
    entries and to at most its limit + 100. Script and model agree on every field, and
    later requests are denied until the debt is repaid."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [SLOW[alg], (GCRA, 1728000000, 1728000000 * 200, 0)]
    keys = ["rl:{rep%s}:a" % alg, "rl:{rep%s}:day" % alg]
    seq = [(1, False), (12, True), (1, False), (-3, True), (1, False), (150, True),
           (1, False), (0, True), (-200, True), (1, False)]
    replies, calls = [], []
    for c, report in seq:
        argv = [str(x) for l in limits for x in tuple(l) + (c,)]
        if report:
            argv += ["1", "1", "0"]
        rep = [int(x) for x in redis.cmd("EVALSHA", sha, str(len(keys)), *keys, *argv)]
        replies.append(rep[:3 + 4 * len(limits)])
        calls.append((rep[2], c, "R") if report else (rep[2], c))
    compare(replies, run_model(limits, calls))
    assert all(r[0] == 1 for r, (c, rep) in zip(replies, seq) if rep), "a report never denies"
    # a window (fixed or sliding) that turned between the debt and the check may have let
    # it go (the model said so above, at Redis time rep[2]); 10 s windows rarely turn
    period = SLOW[alg][1]

    def turned(i, j):
        return alg != "gcra" and replies[i][2] // period != replies[j][2] // period

    for debt, check in ((1, 2), (5, 6)):
        if not turned(debt, check):
            assert replies[check][0] == 0, "in debt: denied (call %d)" % check
    # a refund that large repays everything, but a sliding log gives back at most 100
    # entries a call. A sliding window whose window turned between the first debt (call 1)
    # and the refund (call 8) keeps debt in the previous window, which a refund in the
    # current one cannot reach: then denied, as the model said above.
    if not (alg == "sliding_window" and turned(1, 8)):
        assert replies[9][0] == (0 if alg == "sliding_log" else 1), replies[9]


CONC = 6


def test_concurrency_matches_model(redis):
    """Concurrency (algorithm 6): slots taken (cost = the slot), given back (minus the
    slot), taken twice (a new slot, the lease renewed), reported (0), and leases ending by
    themselves, in random order with a rate limit beside it: script and model agree on
    every field."""
    rnd = random.Random(11)
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [(CONC, 150000, 3, 0), (GCRA, 20000, 100000 * 10, 0)]
    keys = ["rl:{cc}:conc", "rl:{cc}:rate"]
    held, replies, calls = [], [], []
    next_slot = 1 << 40
    for _ in range(150):
        r = rnd.random()
        if r < 0.5:
            next_slot += rnd.choice((1, 7, 1 << 20))
            slot = next_slot
        elif r < 0.75 and held:
            slot = -held.pop(rnd.randrange(len(held)))
        elif r < 0.85 and held:
            slot = rnd.choice(held)  # taken again: counted as a new one, lease renewed
        else:
            slot = 0
        cost = [slot, 1 if slot > 0 else 0]
        rep = run_script(redis, sha, keys, limits, cost)
        if slot > 0 and rep[0] == 1 and slot not in held:
            held.append(slot)
        replies.append(rep)
        calls.append((rep[2], cost))
        time.sleep(rnd.choice((0.0, 0.0, 0.003, 0.02, 0.08)))
    compare(replies, run_model(limits, calls))
    verdicts = [r[3] for r, c in zip(replies, calls) if c[1][0] > 0]
    assert 0 in verdicts and 1 in verdicts, "slots both granted and refused"
    retries = [r[5] for r in replies if r[0] == 0]
    assert retries and all(1 <= x <= 1000 for x in retries), retries


def test_concurrency_lease_ends_and_slot_returns(redis):
    """A slot never given back frees itself when its lease ends (Redis time); one
    given back frees at once, with one ZREM; the key expires after the last lease."""
    sha = redis.cmd("SCRIPT", "LOAD", script())
    limits = [(CONC, 300000, 2, 0)]
    key = ["rl:{cl}:conc"]
    assert run_script(redis, sha, key, limits, 101)[0] == 1
    assert run_script(redis, sha, key, limits, 102)[0] == 1
    denied = run_script(redis, sha, key, limits, 103)
    assert denied[0] == 0 and denied[4] == 0 and 1 <= denied[5] <= 300, denied
    assert run_script(redis, sha, key, limits, -102)[3:] == [1, 0, 0, 0]  # reports nothing
    assert run_script(redis, sha, key, limits, 103)[0] == 1, "a slot given back is free"
    assert run_script(redis, sha, key, limits, 104)[0] == 0
    t0 = time.monotonic()
    while run_script(redis, sha, key, limits, 105)[0] == 0:
        assert time.monotonic() - t0 < 2.0, "a lease of 300 ms never ended"
        time.sleep(0.02)
    assert 0.2 < time.monotonic() - t0 < 1.0
    assert 0 < int(redis.cmd("PTTL", key[0])) <= 301
