"""The key layouts of the decision script (lua/state.lua): layout 2 keeps every state of a
principal in one key and decides exactly as layout 1, a key per limit, does.

The exact comparisons run the assembled script behind test_script_multi's test-only prefix,
which reads Redis TIME from a key and records, for each SET ... PX and PEXPIRE, when the key
would expire (ms of the test's clock) instead of setting it; the script's text is the one the
agent embeds.
"""
import random

import pytest

from conftest import HAProxy, key_principal, limit_state, wait_until
from test_model_agreement import FIXED, GCRA, LOG, MONTH, SLIDING, script
from test_script_multi import FAKE_CLOCK, Conn, Err, compact_argv, limit_pool, multi_argv, \
    random_decision, set_clock

CONC = 6

STRING_ALGS = (GCRA, FIXED, SLIDING, MONTH)


@pytest.fixture
def conn(redis):
    c = Conn(redis.port)
    yield c
    c.close()


def to_layout2(decision, pool, principal, fb=False):
    """A decision of layout 1 keys ("{s}<name>") as layout 2: the string limits' key is
    the principal's, "<flags>#<name>" their flags argument; the sorted sets unchanged."""
    keys, args = decision
    k2, a2 = [], list(args)
    for i, k in enumerate(keys):
        if pool[k][0] in STRING_ALGS:
            k2.append("rl:v2:{%s}" % principal)
            try:        # as the script reads a flags number, bad ones included
                shadow = 1 if float(args[5 * i + 3]) % 2 == 1 else 0
            except ValueError:
                shadow = 0
            a2[5 * i + 3] = "%d#%s" % (shadow + (2 if fb else 0), k)
        else:
            k2.append("rl:{%s}:%s" % (principal, k))
    return k2, a2


def entries(conn, key):
    """{field: state} of layout 2 key <key>."""
    v = conn.cmd("GET", key)
    out = {}
    for e in (v.split("|")[1:] if v else []):
        field, eq, st = e.partition("=")
        if field and eq and field not in out:      # the first, as the script reads
            out[field] = st
    return out


def check_states(conn, pool, now_ms, what, principals):
    """Every string limit's layout 1 key alive at <now_ms> has an entry of the same state
    in each layout 2 key of <principals>, and an entry whose layout 1 key expired holds
    what it last held; the key expires when the last of them does (or later: an entry's
    expiry is never shortened by a decision that did not write it); the sorted sets are
    the same."""
    for p in principals:
        key = "rl:v2:{%s}" % p
        ent = entries(conn, key)
        if ent:
            exps = [int(conn.cmd("HGET", "test:exp", "{s}" + f) or 0) for f in ent]
            assert int(conn.cmd("HGET", "test:exp", key)) >= max(exps), (what, key, ent)
        for name, lim in pool.items():
            k1 = "{s}" + name
            if lim[0] not in STRING_ALGS:
                z1 = conn.cmd("ZRANGE", k1, 0, -1, "WITHSCORES")
                z2 = conn.cmd("ZRANGE", "rl:{%s}:%s" % (p, name), 0, -1, "WITHSCORES")
                assert z1 == z2, (what, name)
                continue
            exp1 = conn.cmd("HGET", "test:exp", k1)
            alive = exp1 is not None and int(exp1) > now_ms
            if alive:
                assert name in ent, (what, p, name, ent)
                assert int(conn.cmd("HGET", "test:exp", key)) >= int(exp1), (what, p, name)
            if name in ent:
                assert ent[name] == conn.cmd("GET", k1), (what, p, name)


@pytest.mark.parametrize("form", ["M", "C", "Q"])
@pytest.mark.parametrize("seed", [1, 2])
def test_layout2_decides_as_layout1(conn, seed, form):
    """Random decisions over every algorithm (costs, refunds, grants, reports, leases,
    shadow limits, limits shared between decisions, bad arguments now and then) at a test
    clock: layout 2 single calls, and layout 2 multi calls of each form, answer exactly
    what layout 1 single calls answer, and hold the same states (one key per principal,
    an entry per limit, expiring with its state)."""
    rnd = random.Random(seed)
    sha = conn.cmd("SCRIPT", "LOAD", FAKE_CLOCK + script())
    assert not isinstance(sha, Err), sha
    pool = limit_pool()
    pool["m1"] = (MONTH, 1, 7, 0)
    now = 1700000000 * 10**6 + rnd.randrange(10**12)
    seen = {"allowed": 0, "denied": 0, "error": 0, "subset": 0}
    for rnd_no in range(40):
        now += rnd.choice([0, 1, 1000, 10**5, 10**6, 61 * 10**6])
        set_clock(conn, now)
        d = rnd.choice([1, 2, 3, 8, 16])
        decisions = [random_decision(rnd, pool, 0.03 if form == "M" else 0.08,
                                     limits_bad=form == "M") for _ in range(d)]
        ones = [conn.cmd("EVALSHA", sha, len(k), *["{s}" + x for x in k], *a)
                for k, a in decisions]
        twos = []
        for dec in decisions:
            k2, a2 = to_layout2(dec, pool, "t")
            twos.append(conn.cmd("EVALSHA", sha, len(k2), *k2, *a2))
        for j, (r1, r2) in enumerate(zip(ones, twos)):
            if isinstance(r1, Err):
                assert isinstance(r2, Err), (rnd_no, j, r1, r2)
            else:
                assert r1 == r2, "round %d, decision %d: layout 1 %r, layout 2 %r" % (
                    rnd_no, j, r1, r2)
        l2 = [to_layout2(dec, pool, "m") for dec in decisions]
        argv = multi_argv(l2, "") if form == "M" else compact_argv(l2, "", cross=form == "Q")
        multi = conn.cmd("EVALSHA", sha, *argv)
        assert isinstance(multi, list) and len(multi) == d, multi
        for j, (r1, m) in enumerate(zip(ones, multi)):
            if isinstance(r1, Err):
                assert isinstance(m, Err), (rnd_no, j, r1, m)
                seen["error"] += 1
            else:
                assert r1 == m, "round %d, decision %d: layout 1 %r, multi %r" % (
                    rnd_no, j, r1, m)
                seen["allowed" if r1[0] == 1 else "denied"] += 1
        check_states(conn, pool, now // 1000, "round %d" % rnd_no, ["t", "m"])
        # decisions that charged some of the key's entries only (its expiry kept)
        seen["subset"] += sum(1 for k, _ in decisions
                              if 0 < len(set(k) & set(entries(conn, "rl:v2:{t}"))) <
                              len(entries(conn, "rl:v2:{t}")))
    assert seen["allowed"] >= 50 and seen["denied"] >= 20 and seen["error"] >= 2, seen
    assert seen["subset"] >= 20, seen


def decide1(conn, sha, key, lim, cost=1, flags=None):
    a = list(lim)
    if flags is not None:
        a[3] = flags
    return conn.cmd("EVALSHA", sha, 1, key, *a, cost)


def test_layout2_reads_layout1_where_it_holds_nothing(conn):
    """Flag 2: a limit without an entry in the principal's key reads its layout 1 key (a
    fleet moving from layout 1 keeps its counts); once it has an entry, layout 1 is not
    read again; without the flag, layout 1 is never read; a layout 1 key of another type
    reads as nothing and fails nothing."""
    sha = conn.cmd("SCRIPT", "LOAD", script())
    win = (FIXED, 3600 * 10**6, 5, 0)
    gcra = (GCRA, 10**6, 3 * 10**6, 0)          # 1/s, burst 3 (tau = 3 T, k = 0)
    # layout 1: 3 of the window's 5, and the bucket emptied
    for _ in range(3):
        assert decide1(conn, sha, "rl:{p}:day", win)[0] == 1
    for _ in range(3):
        assert decide1(conn, sha, "rl:{p}:sec", gcra)[0] == 1
    assert decide1(conn, sha, "rl:{p}:sec", gcra)[0] == 0
    # layout 2 with flag 2: 2 more, then denied; the bucket still empty
    got = [decide1(conn, sha, "rl:v2:{p}", win, flags="2#day")[0] for _ in range(3)]
    assert got == [1, 1, 0], got
    assert decide1(conn, sha, "rl:v2:{p}", gcra, flags="2#sec")[0] == 0
    ent = entries(conn, "rl:v2:{p}")
    assert ent["day"].endswith(":5"), ent
    assert "sec" not in ent, ent        # denied: nothing written
    # with an entry, layout 1 no longer counts
    conn.cmd("SET", "rl:{p}:day", "0:0")
    assert decide1(conn, sha, "rl:v2:{p}", win, flags="2#day")[0] == 0
    # without the flag: a fresh count, whatever layout 1 holds
    idx = int(conn.cmd("TIME")[0]) // 3600
    conn.cmd("SET", "rl:{q}:day", "%d:4" % idx)
    assert decide1(conn, sha, "rl:{q}:day", win)[0] == 1      # layout 1: 5 of 5
    got = [decide1(conn, sha, "rl:v2:{q}", win, flags="0#day")[0] for _ in range(6)]
    assert got == [1, 1, 1, 1, 1, 0], got
    # a layout 1 key of another type: nothing there, no error
    conn.cmd("HSET", "rl:{r}:day", "x", "1")
    r = decide1(conn, sha, "rl:v2:{r}", win, flags="2#day")
    assert r[0] == 1 and r[4] == 4, r


def test_layout1_read_is_the_decisions_own(conn):
    """What a layout 2 decision read of layout 1 is its own: a layout 1 decision after it
    in the same call (a refund of a request decided before a reload, say) may change it,
    and a layout 2 decision after that reads it again, as separate calls would."""
    sha = conn.cmd("SCRIPT", "LOAD", script())
    win = (FIXED, 3600 * 10**6, 5, 0)
    for _ in range(5):
        assert decide1(conn, sha, "rl:{f}:day", win)[0] == 1
    l2 = [str(x) for x in win[:3]] + ["2#day", "1"]
    l1 = [str(x) for x in win[:3]] + ["0", "-3"]
    r = conn.cmd("EVALSHA", sha, 3, "rl:v2:{f}", "rl:{f}:day", "rl:v2:{f}",
                 "M", 3, 1, 0, *l2, 1, 0, *l1, 1, 0, *l2)
    assert [x[0] for x in r] == [0, 1, 1], r
    assert r[2][4] == 2, r                      # 5 - 3 given back + 1
    assert entries(conn, "rl:v2:{f}")["day"].endswith(":3"), entries(conn, "rl:v2:{f}")


def test_layout2_key_of_another_kind(conn):
    """The principal's key holding something else: another type is the decision's error
    (as in layout 1); text that is not an entry of the limit says nothing of it: the limit
    reads as having no state, its entry is written, and the rest is left as it is."""
    sha = conn.cmd("SCRIPT", "LOAD", script())
    win = (FIXED, 3600 * 10**6, 5, 0)
    conn.cmd("RPUSH", "rl:v2:{x}", "a")
    r = decide1(conn, sha, "rl:v2:{x}", win, flags="0#day")
    assert isinstance(r, Err) and "WRONGTYPE" in r, r
    for junk in ["garbage", "day=", "|day=", "|day=x:1|", "|=1:2", "|||", "|day=3:",
                 "|day=99999999999999999999:3:4:5:6", "|other=99999999999999999999:1",
                 "|other=1:2|more=3:4", "|day=7:9|day=1:2"]:
        conn.cmd("SET", "rl:v2:{y}", junk)
        r = decide1(conn, sha, "rl:v2:{y}", win, flags="0#day")
        assert r[0] == 1 and r[4] == 4, (junk, r)
        ent = entries(conn, "rl:v2:{y}")
        assert ent["day"].endswith(":1"), (junk, ent)
        assert 0 < conn.cmd("PTTL", "rl:v2:{y}") <= 3600 * 1000 + 1000, junk
        conn.cmd("DEL", "rl:v2:{y}")


def test_layout2_one_key_for_a_principals_limits(conn):
    """Two limits of one principal (100/s and 1,000,000/day) in layout 2: one key, both
    entries, its expiry the day's; a decision of the first alone keeps the day's expiry;
    one of the second alone keeps the first's entry."""
    sha = conn.cmd("SCRIPT", "LOAD", script())
    sec = (GCRA, 10**4, 5 * 10**4, 0)           # 100/s, burst 5
    day = (FIXED, 86400 * 10**6, 10**6, 0)
    r = conn.cmd("EVALSHA", sha, 2, "rl:v2:{k}", "rl:v2:{k}", sec[0], sec[1], sec[2], "0#sec",
                 1, day[0], day[1], day[2], "0#day", 1)
    assert r[0] == 1, r
    ent = entries(conn, "rl:v2:{k}")
    assert sorted(ent) == ["day", "sec"], ent
    assert conn.cmd("DBSIZE") == 1
    t = conn.cmd("TIME")
    now_us = int(t[0]) * 10**6 + int(t[1])
    day_end_ms = (now_us // (86400 * 10**6) + 1) * 86400 * 1000
    ttl = conn.cmd("PTTL", "rl:v2:{k}")
    assert abs(now_us // 1000 + ttl - day_end_ms) < 5000, (ttl, ent)
    # the first alone: the day's expiry stays
    assert decide1(conn, sha, "rl:v2:{k}", sec, flags="0#sec")[0] == 1
    ttl = conn.cmd("PTTL", "rl:v2:{k}")
    assert abs(now_us // 1000 + ttl - day_end_ms) < 5000, (ttl, ent)
    # the second alone: the first's entry stays
    assert decide1(conn, sha, "rl:v2:{k}", day, flags="0#day")[0] == 1
    ent = entries(conn, "rl:v2:{k}")
    assert sorted(ent) == ["day", "sec"] and ent["day"].endswith(":2"), ent


# ---------------------------------------------------------------------------------------
# A fleet moving from layout 1 to layout 2, through real HAProxy gateways and agents.

FLEET_LIMITS = {"day": {"rate": 100, "period": "1d", "algorithm": "fixed_window"},
                "sec": {"rate": 1000, "period": "1s"}}
FLEET = dict(limits=FLEET_LIMITS, tiers={"free": {"limits": ["sec", "day"]}},
             default_tier="free", anonymous={"limits": ["sec"]})


def day_index(redis):
    return int(redis.cmd("TIME")[0]) // 86400


def send(g, key, n):
    """<n> requests of API key <key> through gateway <g>: how many passed (200); every
    other answer must be a 429."""
    ok = 0
    for _ in range(n):
        r = g.request("/", api_key=key)
        assert r.status in (200, 429), r
        ok += r.status == 200
    return ok


def generation(a):
    from test_ops import Prom
    status, body = a.http("/metrics")
    assert status == 200, body
    return Prom(body).get("spoa_ratelimit_config_generation")


@pytest.mark.haproxy
def test_mixed_fleet_through_the_switch(redis, agent, procs, tmp, upstream):
    """A fleet half in layout 1 (as every earlier version writes, and the default: a key per
    limit), half in layout 2: an agent of each behind its own gateway, one API key with 100
    a day. The layout 2 agent carries the day's count over from layout 1
    (its first read of the limit); while both run, the layout 1 agent's admissions after
    that first write are not seen by layout 2: the over-admission is exactly those, and
    nothing else is lost or counted twice."""
    day0 = day_index(redis)
    old = agent(redis=redis, name="old", redis_cfg={"key_layout": 1}, **FLEET)
    new = agent(redis=redis, name="new", redis_cfg={"key_layout": 2}, **FLEET)
    g_old = HAProxy(procs, tmp, old.address, upstream, name="haproxy-old")
    g_new = HAProxy(procs, tmp, new.address, upstream, name="haproxy-new")
    key = "fleet-moving"
    p = key_principal(key)
    # the fleet of layout 1
    assert send(g_old, key, 30) == 30
    assert redis.cmd("GET", "rl:{%s}:day" % p).endswith(":30")
    assert redis.cmd("EXISTS", "rl:v2:{%s}" % p) == 0
    # the rolling restart: both layouts, 10 requests each, alternating
    for _ in range(10):
        assert send(g_new, key, 1) == 1
        assert send(g_old, key, 1) == 1
    assert redis.cmd("GET", "rl:{%s}:day" % p).endswith(":40")     # 30 + the old's 10
    assert limit_state(redis.cmd, p, "day").endswith(":40")          # 30 + the new's 10
    v2 = redis.cmd("GET", "rl:v2:{%s}" % p)
    assert sorted(e.split("=")[0] for e in v2.split("|")[1:]) == ["day", "sec"], v2
    # the fleet of layout 2: what layout 2 counts is left, then 429
    passed = send(g_new, key, 70)
    if day_index(redis) != day0:
        pytest.skip("the day's window turned during the test")
    assert passed == 60, passed
    total = 30 + 20 + passed
    print("mixed fleet: %d admitted of 100 a day, 10 by the layout 1 agent after the "
          "layout 2 agent's first write" % total)
    assert total == 100 + 10


@pytest.mark.haproxy
def test_switch_by_reload_carries_counts_over(redis, agent, procs, tmp, upstream):
    """The switch by reload: two agents of layout 1 (one count for the fleet) reloaded to
    layout 2 one after the other: the counts carry over (a layout 2 agent reads layout 1
    where it holds nothing), the day's 100 are 100 across the switch; once switched, a
    reload with key_layout_fallback = false stops reading layout 1."""
    day0 = day_index(redis)
    l1 = {"key_layout": 1}
    agents = [agent(redis=redis, name="a%d" % i, metrics=True, redis_cfg=l1, **FLEET)
              for i in range(2)]
    gws = [HAProxy(procs, tmp, a.address, upstream, name="haproxy%d" % i)
           for i, a in enumerate(agents)]
    key = "fleet-reloaded"
    p = key_principal(key)
    assert sum(send(gws[i % 2], key, 1) for i in range(30)) == 30
    for a in agents:
        gen = generation(a)
        a.reload(redis=dict(a.cfg["redis"], key_layout=2))
        wait_until(lambda: generation(a) == gen + 1, 5, 0.1, "the reload")
    assert redis.cmd("EXISTS", "rl:v2:{%s}" % p) == 0
    passed = sum(send(gws[i % 2], key, 1) for i in range(80))
    if day_index(redis) != day0:
        pytest.skip("the day's window turned during the test")
    assert passed == 70, passed
    assert redis.cmd("EXISTS", "rl:v2:{%s}" % p) == 1
    assert limit_state(redis.cmd, p, "day").endswith(":100")
    assert "Redis key layout now 2, reading layout 1" in agents[0].proc.log_text()
    # after a day (here: at once), the fallback off: layout 1 is no longer read
    for a in agents:
        gen = generation(a)
        a.reload(redis=dict(a.cfg["redis"], key_layout_fallback=False))
        wait_until(lambda: generation(a) == gen + 1, 5, 0.1, "the reload")
    other = "fleet-fresh"
    q = key_principal(other)
    redis.cmd("SET", "rl:{%s}:day" % q, "%d:100" % day0)     # layout 1 says: all spent
    assert send(gws[0], other, 5) == 5
    assert limit_state(redis.cmd, q, "day").endswith(":5")
