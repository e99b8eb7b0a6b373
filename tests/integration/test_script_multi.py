"""The script's multi form (lua/decide.lua): D decisions in one EVALSHA, one Redis TIME.

D decisions in one call must answer and write exactly what D single calls in order write
at the same Redis time. To compare at the same time, the exact tests run the assembled
script behind a test-only prefix that reads Redis TIME from a key, and records the TTL of
each SET ... PX and PEXPIRE in a hash instead of setting it (nothing may expire in real
time while the test's clock stands still); the script's text is the one the agent embeds.
The last test runs it as is, against the C models at the Redis time of its reply.
"""
import random
import socket

import pytest

from test_limit_math import params
from test_model_agreement import FIXED, GCRA, LOG, SLIDING, run_model, script

# Redis TIME from the key "test:clock" ("<s> <us>"); TTLs into the hash "test:ttl", and when
# each key would expire (ms of the test's clock) into "test:exp".
FAKE_CLOCK = r"""
local real_redis = redis
local function clock()
	local s, us = string.match(real_redis.call('GET', 'test:clock'), '^(%d+) (%d+)$')
	return s, us
end
local redis = setmetatable({ call = function(cmd, ...)
	local a = { ... }
	if cmd == 'TIME' then
		local s, us = clock()
		return { s, us }
	elseif (cmd == 'SET' and a[3] == 'PX') or cmd == 'PEXPIRE' then
		local ttl = a[4] or a[2]
		local s, us = clock()
		real_redis.call('HSET', 'test:ttl', a[1], ttl)
		real_redis.call('HSET', 'test:exp', a[1], s * 1000 + math.floor(us / 1000) + ttl)
		if cmd == 'PEXPIRE' then return 1 end
		return real_redis.call('SET', a[1], a[2])
	end
	return real_redis.call(cmd, ...)
end }, { __index = real_redis })
"""


class Err(str):
    """An error reply, at any depth of a reply."""


class Conn:
    """One connection, RESP2, error replies returned as Err wherever they are."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.sock.makefile("rb")

    def close(self):
        self.f.close()
        self.sock.close()

    def cmd(self, *args):
        req = b"*%d\r\n" % len(args)
        for a in args:
            a = str(a).encode()
            req += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(req)
        return self._read()

    def _read(self):
        line = self.f.readline()
        assert line.endswith(b"\r\n"), "redis closed the connection"
        kind, rest = line[:1], line[1:-2].decode()
        if kind == b"+":
            return rest
        if kind == b"-":
            return Err(rest)
        if kind == b":":
            return int(rest)
        if kind == b"$":
            return None if int(rest) < 0 else self.f.read(int(rest) + 2)[:-2].decode()
        assert kind == b"*", line
        return None if int(rest) < 0 else [self._read() for _ in range(int(rest))]


@pytest.fixture
def conn(redis):
    c = Conn(redis.port)
    yield c
    c.close()


def multi_argv(decisions, prefix):
    """KEYS and ARGV of one multi call; <decisions>: [(keys, args)] as single calls."""
    keys, argv = [], ["M", len(decisions)]
    for k, a in decisions:
        keys += [prefix + x for x in k]
        argv += [len(k), len(a) - 5 * len(k)] + list(a)
    return [len(keys)] + keys + argv


def compact_argv(decisions, prefix, cross=False):
    """The same call in a compact form: C (every key declared), or with <cross> Q (only
    the first decision's keys declared, the others as arguments); each distinct limit
    (alg, a, b, shadow) sent once, a decision's limit as its index and cost."""
    specs, body, keys = [], [], []
    for k, a in decisions:
        keys += [prefix + x for x in k]
        n = len(k)
        body += [n, len(a) - 5 * n]
        for i in range(n):
            spec = tuple(a[5 * i:5 * i + 4])
            if spec not in specs:
                specs.append(spec)
            body += [specs.index(spec) + 1, a[5 * i + 4]]
        body += list(a[5 * n:])
    table = [len(specs)] + [x for sp in specs for x in sp]
    if not cross:
        return [len(keys)] + keys + ["C", len(decisions)] + table + body
    n0 = len(decisions[0][0]) if decisions else 0
    return [n0] + keys[:n0] + ["Q", len(decisions), len(keys) - n0] + keys[n0:] + table + body


def single(conn, sha, keys, args, prefix):
    return conn.cmd("EVALSHA", sha, len(keys), *[prefix + k for k in keys], *args)


def same_error(single_reply, multi_reply):
    """A failed Redis command: the single call's error reply names the script and line
    after its message; the multi element is the message."""
    return isinstance(single_reply, Err) and isinstance(multi_reply, Err) and \
        (single_reply == multi_reply or single_reply.startswith(multi_reply + " script:"))


def assert_same_replies(singles, multi, what):
    assert isinstance(multi, list) and len(multi) == len(singles), (what, multi)
    for j, (s, m) in enumerate(zip(singles, multi)):
        assert s == m or same_error(s, m), "%s, decision %d: single %r, multi %r" % (
            what, j + 1, s, m)


def state(conn, names, prefix):
    """Value (or sorted set) and recorded TTL of each key of <names> under <prefix>."""
    out = {}
    for k in names:
        key = prefix + k
        kind = conn.cmd("TYPE", key)
        if kind == "string":
            val = conn.cmd("GET", key)
        elif kind == "zset":
            val = conn.cmd("ZRANGE", key, 0, -1, "WITHSCORES")
        else:
            val = None
        ttl = conn.cmd("HGET", "test:ttl", key) if kind != "none" else None
        out[k] = (kind, val, ttl)
    return out


def set_clock(conn, now):
    conn.cmd("SET", "test:clock", "%d %d" % (now // 10**6, now % 10**6))


def random_decision(rnd, pool, bad_rate=0.03, limits_bad=True):
    """(keys, args) of one decision over the keys of <pool> (key -> limit); a bad value,
    now and then, anywhere or (not <limits_bad>) in a cost or a batch argument only."""
    n = rnd.choice([0, 1, 1, 1, 1, 2, 2, 3])
    keys = [rnd.choice(sorted(pool)) for _ in range(n)]
    args = []
    for k in keys:
        cost = rnd.choice([1, 1, 1, 1, 0, 2, 3, 5, -1, -2, 101, 2**60, -2**60])
        args += [str(x) for x in pool[k]] + [str(cost)]
    r = rnd.random()
    if r < 0.3:
        # a batch: want, grant or report, lease lifetime, and maybe the fewest units
        args += [str(rnd.choice([1, 2, 5, 30, 500])), str(rnd.choice([0, 0, 1])),
                 str(rnd.choice([0, 10**5, 10**6, 10**7]))]
        if rnd.random() < 0.5:
            args.append(str(rnd.choice([1, 2, 5, 10, 100])))
    elif r < 0.33:
        args += ["7"] * rnd.choice([1, 2, 5])  # ignored, as in a single call
    if args and rnd.random() < bad_rate:
        where = [i for i in range(len(args))
                 if limits_bad or i >= 5 * len(keys) or i % 5 == 4]
        args[rnd.choice(where)] = rnd.choice(["x", "1.5", "", "-1", "9", "0"])
    return keys, args


def limit_pool():
    """Keys and their limits: every algorithm, fixed-point GCRA intervals, shadows."""
    def gcra(rate, period_ms, burst=0, shadow=0):
        return (GCRA,) + params(GCRA, rate, period_ms, burst) + (shadow,)
    return {
        "g1": gcra(10, 1000, 5), "g2": gcra(700000, 1000, 50), "g3": gcra(1, 366 * 86400000, 17),
        "g4": gcra(3, 1000, 0, 1),
        "f1": (FIXED, 10**6, 5, 0), "f2": (FIXED, 86400 * 10**6, 1000, 0), "f3": (FIXED, 10**6, 2, 1),
        "l1": (LOG, 10**6, 5, 0), "l2": (LOG, 60 * 10**6, 150, 0),
        "s1": (SLIDING, 10**6, 5, 0), "s2": (SLIDING, 60 * 10**6, 20, 1),
    }


@pytest.mark.parametrize("form", ["M", "C", "Q"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_multi_equals_singles_in_order(conn, seed, form):
    """Random decisions (every algorithm, costs, refunds, grants, reports, leases, shadow
    limits, keys shared between decisions so that their order matters, a few bad
    arguments) at a test clock: one multi call per round of D decisions answers what D
    single calls in order answer, and leaves the same values and TTLs; in the long form
    (M) and the compact ones (C, and Q with the keys after the first decision's as
    arguments), where a bad limit fails the whole call (tested below): there, bad values
    only in costs and batch arguments."""
    rnd = random.Random(seed)
    sha = conn.cmd("SCRIPT", "LOAD", FAKE_CLOCK + script())
    assert not isinstance(sha, Err), sha
    pool = limit_pool()
    now = 1700000000 * 10**6 + rnd.randrange(10**12)
    seen = {"allowed": 0, "denied": 0, "batch": 0, "error": 0, "shared": 0}
    for rnd_no in range(40):
        now += rnd.choice([0, 1, 1000, 10**5, 10**6, 61 * 10**6])
        set_clock(conn, now)
        d = rnd.choice([1, 2, 3, 8, 16, 64])
        decisions = [random_decision(rnd, pool, 0.03 if form == "M" else 0.08,
                                     limits_bad=form == "M") for _ in range(d)]
        singles = [single(conn, sha, k, a, "{s}") for k, a in decisions]
        argv = multi_argv(decisions, "{m}") if form == "M" else \
            compact_argv(decisions, "{m}", cross=form == "Q")
        multi = conn.cmd("EVALSHA", sha, *argv)
        assert_same_replies(singles, multi, "round %d" % rnd_no)
        assert state(conn, pool, "{s}") == state(conn, pool, "{m}"), "round %d" % rnd_no
        keys_used = [k for ks, _ in decisions for k in set(ks)]
        seen["shared"] += len(keys_used) - len(set(keys_used))
        for r in multi:
            if isinstance(r, Err):
                seen["error"] += 1
                continue
            seen["allowed" if r[0] == 1 else "denied"] += 1
            seen["batch"] += len(r) > 3 + 4 * r[1]
            assert r[2] == now
    # the rounds covered both verdicts, batches, errors and keys shared in a call
    assert min(seen.values()) >= 5 and seen["denied"] >= 50 and seen["batch"] >= 50, seen


def test_multi_isolates_errors(conn):
    """A decision with bad arguments, or whose Redis command fails, is an error element;
    the decisions before and after it are made, as single calls would be."""
    sha = conn.cmd("SCRIPT", "LOAD", FAKE_CLOCK + script())
    set_clock(conn, 1700000000123456)
    pool = limit_pool()
    g, f, l = [str(x) for x in pool["g1"]], [str(x) for x in pool["f1"]], \
        [str(x) for x in pool["l1"]]
    for p in ("{s}", "{m}"):
        conn.cmd("SET", p + "str", "not a sorted set")
    decisions = [
        (["g1"], g + ["1"]),
        (["g1"], ["9"] + g[1:] + ["1"]),                         # unknown algorithm
        (["f1"], [f[0], "0"] + f[2:] + ["1"]),                   # bad parameters
        (["f1"], f + ["1.5"]),                                   # bad cost
        (["f1"], f + ["1", "0", "0", "1000"]),                   # bad batch size
        (["g1", "str"], g + ["1"] + l + ["1"]),                  # WRONGTYPE after a GET
        (["f1", "g1"], f + ["2"] + g + ["1"]),
        (["str"], l + ["1"]),                                    # WRONGTYPE
        (["g1"], g + ["1", "5", "0", "1000000"]),
    ]
    singles = [single(conn, sha, k, a, "{s}") for k, a in decisions]
    multi = conn.cmd("EVALSHA", sha, *multi_argv(decisions, "{m}"))
    assert_same_replies(singles, multi, "errors")
    errors = [j for j, r in enumerate(multi) if isinstance(r, Err)]
    assert errors == [1, 2, 3, 4, 5, 7], multi
    assert multi[1] == "unknown algorithm 9" and multi[2] == "bad parameters for limit 1"
    assert multi[3] == "bad cost 1.5" and multi[4] == "bad batch size 0"
    assert multi[5].startswith("WRONGTYPE") and multi[7].startswith("WRONGTYPE")
    assert multi[0][0] == 1 and multi[6][0] == 1 and multi[8][-2] > 0, multi
    names = ["g1", "f1", "str"]
    assert state(conn, names, "{s}") == state(conn, names, "{m}")


GOOD = ["1", "0", "1", "1000", "5000", "0", "1"]   # one GCRA limit, no batch


@pytest.mark.parametrize("d,tail,keys,msg", [
    ("x", [], [], "bad decision count x"),
    ("-1", [], [], "bad decision count -1"),
    ("1.5", [], [], "bad decision count 1.5"),
    ("2", ["1", "x"] + GOOD[2:], ["k"], "bad counts for decision 2"),
    ("2", ["1", "-3"] + GOOD[2:], ["k"], "bad counts for decision 2"),
    ("2", ["1.5", "0"] + GOOD[2:], ["k"], "bad counts for decision 2"),
    ("3", GOOD, ["k"], "decision 3 goes past the keys or arguments"),
    ("2", ["2", "0"] + GOOD[2:], ["k"], "decision 2 goes past the keys or arguments"),
    ("2", ["1", "3"] + GOOD[2:], ["k"], "decision 2 goes past the keys or arguments"),
    ("2", GOOD + ["7"], ["k"], "keys or arguments left after 2 decisions"),
    ("2", GOOD, ["k", "k2"], "keys or arguments left after 2 decisions"),
    ("1", [], ["k"], "keys or arguments left after 1 decisions"),
])
def test_multi_refuses_counts_that_do_not_add_up(conn, d, tail, keys, msg):
    """Counts that do not match the call's KEYS and ARGV: one error reply, and no
    decision is made, not even the valid first one."""
    k = ["{f}g"] + ["{f}" + x for x in keys]
    argv = ["M", d] + (GOOD + tail if d not in ("x", "-1", "1.5") else tail)
    r = conn.cmd("EVAL", script(), len(k), *k, *argv)
    assert isinstance(r, Err) and r == msg, (argv, r)
    assert conn.cmd("DBSIZE") == 0


@pytest.mark.parametrize("argv,msg", [
    (["C", 1, 1, 9, 1000, 5000, 0, 1, 0, 1, 1], "unknown algorithm 9"),
    (["C", 1, 1, 1, 0, 5000, 0, 1, 0, 1, 1], "bad parameters for limit 1"),
    (["C", 1, 2, 1, 1000, 5000, 0], "bad limit count 2"),
    (["C", 1, "x"], "bad limit count x"),
    (["Q", 1, 5, "k"], "bad key count 5"),
])
def test_compact_forms_refuse_a_bad_limit_table(conn, argv, msg):
    """A compact call whose table of limits is bad is one error reply, and nothing is
    written; a bad index is that decision's error."""
    r = conn.cmd("EVAL", script(), 1, "{c}k", *argv)
    assert isinstance(r, Err) and msg in r, r
    assert conn.cmd("EXISTS", "{c}k") == 0
    r = conn.cmd("EVAL", script(), 2, "{c}k", "{c}j", "C", 2, 1, 1, 1000, 5000, 0,
                 1, 0, 2, 1, 1, 0, 1, 1)
    assert isinstance(r[0], Err) and "bad limit index 2" in r[0], r
    assert r[1][0] == 1 and conn.cmd("EXISTS", "{c}k") == 0, r


def test_multi_of_nothing(conn):
    assert conn.cmd("EVAL", script(), 0, "M", "0") == []


def test_multi_in_real_time_matches_the_models(conn):
    """Without the test clock: 64 decisions on the same two limits (GCRA at a fixed-point
    rate, a fixed window) in one call share one Redis time, and answer what the C models
    answer for 64 requests at that time; the keys expire as single calls set them."""
    rnd = random.Random(5)
    limits = [(GCRA,) + params(GCRA, 10, 1000, 20) + (0,), (FIXED, 10**6, 30, 0)]
    keys = ["{rt}:g", "{rt}:f"]
    replies, calls = [], []
    for _ in range(3):
        costs = [[rnd.choice([0, 1, 1, 2, -1]), rnd.choice([1, 1, 3, 0])] for _ in range(64)]
        decisions = [(keys, [str(x) for lim, c in zip(limits, cs) for x in lim + (c,)])
                     for cs in costs]
        multi = conn.cmd("EVAL", script(), *multi_argv(decisions, ""))
        assert len(multi) == 64 and len({r[2] for r in multi}) == 1, multi
        replies += multi
        calls += [(multi[0][2], cs) for cs in costs]
    model = run_model(limits, calls)
    for j, (r, m) in enumerate(zip(replies, model)):
        assert [r[0]] + r[3:] == m, "decision %d: script %r model %r" % (j, r, m)
    assert {r[0] for r in replies} == {0, 1}
    # The fixed window's key expires at its window's end (epoch-aligned): when the last call
    # ran just before a second's boundary, the key may be gone by the time PTTL reads it.
    ttl = conn.cmd("PTTL", keys[1])
    if ttl == -2:
        sec, usec = conn.cmd("TIME")
        assert int(sec) > replies[-1][2] // 10**6, (sec, usec, replies[-1][2])
    else:
        assert 0 < ttl <= 1001, ttl
