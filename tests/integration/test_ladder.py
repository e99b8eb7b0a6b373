"""The decision path under attack and outage: the defaults hold when Redis cannot decide,
denials Redis computed outlive an outage, random keys and odd costs buy nothing, a denial
costs one Redis call, and clients without an address do not share one bucket.

Every agent here runs the agent's own defaults for `on_failure` and `unknown_keys`
(the conftest pins `unknown_keys = "default_tier"` for the other files).
"""
import hashlib

import spop_client as sc
from conftest import LcList, agent_config, to_libconfig, wait_until
from test_ops import Prom
from fake_redis import FakeRedis, script_reply
from test_quota import script_calls

# 6/h for the fleet, 2 gateways: this gateway's local share is 3 (no on_failure given)
LIMITS = {
    "k6": {"rate": 6, "period": "1h"},
    "anon5": {"rate": 5, "period": "1h"},
}
CFG = dict(limits=LIMITS, tiers={"t": {"limits": ["k6"]}}, default_tier="t",
           anonymous={"limits": ["anon5"]}, fallback={"gateways": 2},
           unknown_keys=None)


def sc_digest(key):
    """The principal of an API key: the first 16 bytes of its SHA-256, in hex."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Asker:
    """A SPOP connection with a running stream id."""

    def __init__(self, c):
        self.c = c
        self.sid = -1

    def ask(self, **kw):
        self.sid += 2
        return self.c.request(self.sid, 1, [sc.rl_message(**kw)])

    def ask_args(self, args):
        self.sid += 2
        return self.c.request(self.sid, 1, [("rl-req", args)])


def metrics(a):
    status, body = a.http("/metrics")
    assert status == 200
    return Prom(body)


def delta(m, m0, name, **labels):
    """How much sample <name>{labels} grew from scrape <m0> to scrape <m>."""
    return (m.get(name, **labels) or 0) - (m0.get(name, **labels) or 0)


def test_default_ladder_is_local_when_redis_is_down(agent, redis):
    """No on_failure configured: with Redis down a key gets this gateway's share
    (rate / fallback.gateways) and is then denied locally, not allowed unlimited; the
    answers say Redis was not consulted and are counted apart from fail-open ones."""
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(key="warm", tier="t").get("degraded") is None
        # the harness's start-up probe may have met a Redis not yet connected: count
        # from here
        m0 = metrics(a)
        redis.stop()
        vs = [q.ask(key="lk", tier="t") for _ in range(6)]
        assert [v["allow"] for v in vs] == [1, 1, 1, 0, 0, 0], vs
        assert all(v["degraded"] == 1 for v in vs), vs
        assert vs[3]["rule"] == "k6" and vs[3]["retry_after"] >= 1, vs[3]
        status, body = a.http("/ready")
        assert status == 200, body        # a local fallback exists: still ready
    m = metrics(a)
    assert delta(m, m0, "spoa_ratelimit_fallback_decisions_total", outcome="local_allowed") == 3
    assert delta(m, m0, "spoa_ratelimit_fallback_decisions_total", outcome="local_denied") == 3
    assert delta(m, m0, "spoa_ratelimit_fallback_decisions_total", outcome="open") == 0
    assert delta(m, m0, "spoa_ratelimit_decisions_total", tier="t", rule="k6", result="local") == 3
    assert delta(m, m0, "spoa_ratelimit_decisions_total", result="degraded") == 0


def test_fail_open_is_counted_apart(agent, redis):
    """on_failure = "open" explicitly: allowed without a verdict, counted as open."""
    limits = dict(LIMITS, k6=dict(LIMITS["k6"], on_failure="open"))
    a = agent(redis=redis, metrics=True, **dict(CFG, limits=limits))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        # the harness's start-up probe may have met a Redis not yet connected: count
        # from here
        m0 = metrics(a)
        redis.stop()
        vs = [q.ask(key="ok", tier="t") for _ in range(5)]
        assert all(v["allow"] == 1 and v["degraded"] == 1 and "rule" not in v
                   for v in vs), vs
    m = metrics(a)
    assert delta(m, m0, "spoa_ratelimit_fallback_decisions_total", outcome="open") == 5
    assert delta(m, m0, "spoa_ratelimit_fallback_decisions_total", outcome="local_allowed") == 0
    assert delta(m, m0, "spoa_ratelimit_decisions_total", result="degraded") == 5
    assert delta(m, m0, "spoa_ratelimit_decisions_total", result="local") == 0


def test_redis_denial_outlives_an_outage_until_retry_after(agent, redis):
    """A key Redis denied stays denied while Redis is down, until its Retry-After (a fact
    Redis computed), even with on_failure = "open"; then the ladder decides (open here)."""
    limits = {"one": {"rate": 1, "period": "12s", "on_failure": "open"},
              "anon5": LIMITS["anon5"]}
    a = agent(redis=redis, **dict(CFG, limits=limits, tiers={"t": {"limits": ["one"]}}))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(key="dn", tier="t")["allow"] == 1
        v = q.ask(key="dn", tier="t")
        assert v["allow"] == 0 and v.get("degraded") is None, v
        redis.stop()
        # a fresh key fails open: Redis is really not deciding
        v = q.ask(key="fresh", tier="t")
        assert v["allow"] == 1 and v["degraded"] == 1, v
        v = q.ask(key="dn", tier="t")
        assert v["allow"] == 0 and v.get("degraded") is None and v["retry_after"] >= 1, v
        # after its Retry-After the cached denial ends and the ladder (open) decides
        v = wait_until(lambda: (lambda v: v if v["allow"] == 1 else None)(
            q.ask(key="dn", tier="t")), 30, 0.2, "the denial to expire")
        assert v["degraded"] == 1, v


def test_redis_denial_outlives_an_open_breaker(agent, redis):
    """The same with the breaker open (Redis frozen): the cached denial answers."""
    import signal
    limits = {"one": {"rate": 1, "period": "1h", "on_failure": "open"},
              "anon5": LIMITS["anon5"]}
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 50, "breaker_failures": 2,
                                      "breaker_cooldown_ms": 60000},
              **dict(CFG, limits=limits, tiers={"t": {"limits": ["one"]}}))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert [q.ask(key="bk", tier="t")["allow"] for _ in range(2)] == [1, 0]
        redis.proc.signal(signal.SIGSTOP)
        try:
            for i in range(3):
                v = q.ask(key="bk-fresh-%d" % i, tier="t")
                assert v["allow"] == 1 and v["degraded"] == 1, v
            wait_until(lambda: "breaker open" in a.proc.log_text(), 5, 0.05, "breaker open")
            v = q.ask(key="bk", tier="t")
            assert v["allow"] == 0 and v.get("degraded") is None, v
        finally:
            redis.proc.signal(signal.SIGCONT)


def test_random_keys_are_limited_like_one_anonymous_client(agent, redis):
    """Default unknown_keys: 2,000 random keys from one address are limited like one
    anonymous client of that address, and Redis holds a bounded number of keys."""
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr, timeout=20) as c:
        c.hello()
        sid, allowed, got = 1, 0, 0
        batch = 200
        for b in range(10):
            sids = []
            for i in range(batch):
                c.send(sc.notify(sid, 1, [sc.rl_message(key="rnd-%d-%d" % (b, i),
                                                        ip="10.9.9.9")]))
                sids.append(sid)
                sid += 2
            for _ in sids:
                f = c.recv_frame(timeout=20)
                assert f is not None and f.type == sc.T_ACK, f
                allowed += sc.ack_vars(f.payload)["allow"]
                got += 1
        assert got == 2000
        assert allowed == 5, allowed                    # anon5: 5 per hour per address
        # another address has its own anonymous budget
        q = Asker(c)
        q.sid = sid
        assert q.ask(key="rnd-other", ip="10.9.9.10")["allow"] == 1
        # a key with a known tier keeps its tier
        v = q.ask(key="rnd-known", tier="t", ip="10.9.9.9")
        assert v["allow"] == 1 and v["rule"] == "k6", v
    # one anonymous key per address and one per known key (key layout 2: a key per
    # principal), each holding its one limit's entry, whatever the flood (the fixture's
    # readiness probe comes from 127.0.0.1)
    keys = sorted(k for k in redis.cmd("KEYS", "rl:*") if "{gw}" not in k
                  and "7f000001" not in k)
    want = {"rl:v2:{ip4:0a090909/32}": "anon5", "rl:v2:{ip4:0a09090a/32}": "anon5",
            "rl:v2:{k:%s}" % sc_digest("rnd-known"): "k6"}
    assert keys == sorted(want), keys
    for k, field in want.items():
        v = redis.cmd("GET", k)
        assert [e.partition("=")[0] for e in v.split("|")[1:]] == [field], (k, v)


def test_default_tier_for_unknown_keys_is_still_possible(agent, redis):
    """unknown_keys = "default_tier" explicitly: every key its own bucket (the old
    default, for deployments without a tier map)."""
    a = agent(redis=redis, **dict(CFG, unknown_keys="default_tier"))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert sum(q.ask(key="dt-%d" % i, ip="10.9.9.9")["allow"] for i in range(20)) == 20


def test_invalid_cost_is_charged_the_maximum(agent, redis):
    """A negative, too large or non-integer cost is not free: charged 1,000,000, so it is
    denied by any smaller limit (charging nothing), and counted."""
    limits = {"k20": {"rate": 20, "period": "1h"}, "anon5": LIMITS["anon5"]}
    a = agent(redis=redis, metrics=True,
              **dict(CFG, limits=limits, tiers={"t": {"limits": ["k20"]}}))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        for cost in (-5, -(2 ** 62), 1000001, 2 ** 40,
                     sc.Typed(sc.D_UINT64, 2 ** 64 - 1), "3"):
            v = q.ask(key="ic", tier="t", cost=cost)
            assert v["allow"] == 0 and v["rule"] == "k20", (cost, v)
        # nothing was charged, and valid costs still work
        v = q.ask(key="ic", tier="t", cost=2)
        assert v["allow"] == 1 and v["remaining"] == 18, v
        v = q.ask(key="ic", tier="t", cost=sc.Typed(sc.D_UINT32, 3))
        assert v["allow"] == 1 and v["remaining"] == 15, v
        v = q.ask(key="ic", tier="t", cost=None)        # NULL: HAProxy had no value
        assert v["allow"] == 1 and v["remaining"] == 14, v
    assert metrics(a).get("spoa_ratelimit_invalid_costs_total") == 6


GLOBAL_CFG = dict(
    limits={"p1": {"rate": 1, "period": "1h"}, "g100": {"rate": 100, "period": "1h"},
            "anon5": LIMITS["anon5"]},
    tiers={"t": {"limits": ["p1"]}}, default_tier="t", anonymous={"limits": ["anon5"]},
    endpoints=None, unknown_keys=None, blocked_cache=False)


def test_denial_on_a_global_endpoint_costs_one_call(agent, redis):
    """Denied by the principal's limit on an endpoint with global limits: one script call,
    the global key uncharged, no refund."""
    a = agent(redis=redis, metrics=True,
              **dict(GLOBAL_CFG, endpoints=LcList([{"name": "ep", "path_prefix": "/ep",
                                                     "global_limits": ["g100"]}])))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        v = q.ask(key="gk", tier="t", path="/ep")
        assert v["allow"] == 1, v
        gkey = [k for k in redis.cmd("KEYS", "rl:*") if "{g:ep}" in k]
        assert len(gkey) == 1, gkey
        before = redis.cmd("GET", gkey[0])
        calls = script_calls(redis)
        for _ in range(3):
            v = q.ask(key="gk", tier="t", path="/ep")
            assert v["allow"] == 0 and v["rule"] == "p1", v
        assert script_calls(redis) == calls + 3, "one call per denied request"
        assert redis.cmd("GET", gkey[0]) == before, "the global key was charged"
        # another client still gets through (the global budget was not eaten)
        v = q.ask(key="gk2", tier="t", path="/ep")
        assert v["allow"] == 1 and v["remaining"] == 0, v
    assert metrics(a).get("spoa_ratelimit_refunds_total") == 0


def test_global_denial_still_refunds_the_principal(agent, redis):
    """The opposite split (principal allowed, global denied) is refunded as before."""
    cfg = dict(GLOBAL_CFG, limits=dict(GLOBAL_CFG["limits"], p1={"rate": 5, "period": "1h"},
                                       g1={"rate": 1, "period": "1h"}))
    a = agent(redis=redis, metrics=True,
              **dict(cfg, endpoints=LcList([{"name": "ep", "path_prefix": "/ep",
                                             "global_limits": ["g1"]}])))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(key="ga", tier="t", path="/ep")["allow"] == 1
        v = q.ask(key="gb", tier="t", path="/ep")
        assert v["allow"] == 0 and v["rule"] == "g1", v
        # gb was refunded: all 5 of its own tokens are left
        v = q.ask(key="gb", tier="t", path="/")
        assert v["allow"] == 1 and v["remaining"] == 4, v
    assert metrics(a).get("spoa_ratelimit_refunds_total") == 1



def test_a_failed_refund_is_counted_lost(agent):
    """Principal allowed, global denied, and the refund's script call fails (a fake Redis
    refuses it): the refund is counted lost, not silently counted done."""
    def script(nkeys, argv):
        if any(x.startswith(b"-") and x[1:].isdigit() for x in argv[3 + nkeys:]):
            return b"-ERR refund refused\r\n"            # a negative cost: the refund
        if any(b"{g:" in k for k in argv[3:3 + nkeys]):
            return script_reply(nkeys, [0, nkeys, 1700000000000000] + [0, 0, 1000, 1000] * nkeys)
        return script_reply(nkeys)

    cfg = dict(GLOBAL_CFG, limits=dict(GLOBAL_CFG["limits"], p1={"rate": 5, "period": "1h"},
                                       g1={"rate": 1, "period": "1h"}))
    fr = FakeRedis(script=script)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  **dict(cfg, endpoints=LcList([{"name": "ep", "path_prefix": "/ep",
                                                 "global_limits": ["g1"]}])))
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
        with sc.SpopClient(a.addr) as c:
            c.hello()
            v = Asker(c).ask(key="gr", tier="t", path="/ep")
            assert v["allow"] == 0 and v["rule"] == "g1", v
        wait_until(lambda: metrics(a).get("spoa_ratelimit_refunds_lost_total") == 1, 5, 0.05,
                   "the failed refund counted")
        assert metrics(a).get("spoa_ratelimit_refunds_total") == 1
        assert a.alive()
    finally:
        fr.close()


def no_ip_args(key=None):
    return [("key", key), ("tier", None), ("ip", None), ("method", "GET"), ("path", "/")]


def test_anonymous_without_address_is_denied_not_shared(agent, redis):
    """Default anonymous.without_address = "deny": an anonymous request without a source
    address is refused with fallback.deny_status and counted, never one shared bucket one
    client could empty for all; clients with an address are unaffected."""
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        calls = script_calls(redis)
        for _ in range(3):
            v = q.ask_args(no_ip_args())
            assert v["allow"] == 0 and v["status"] == 503, v
        # an unknown key without an address is anonymous too
        v = q.ask_args(no_ip_args(key="nokey"))
        assert v["allow"] == 0 and v["status"] == 503, v
        assert script_calls(redis) == calls
        assert [q.ask(ip="10.8.8.8")["allow"] for _ in range(6)] == [1] * 5 + [0]
    assert metrics(a).get("spoa_ratelimit_no_address_total") == 4


def test_anonymous_without_address_shared_when_configured(agent, redis):
    """without_address = "shared": the old single bucket, explicitly."""
    a = agent(redis=redis, **dict(CFG, anonymous={"limits": ["anon5"],
                                                  "without_address": "shared"}))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert [q.ask_args(no_ip_args())["allow"] for _ in range(6)] == [1] * 5 + [0]


def test_invalid_without_address_rejected(agent_bin, tmp):
    import subprocess
    cfg = agent_config("127.0.0.1:1", None, **dict(CFG, anonymous={
        "limits": ["anon5"], "without_address": "allow"}))
    path = tmp / "bad.conf"
    path.write_text(to_libconfig(cfg))
    r = subprocess.run([str(agent_bin), "-c", "-f", str(path)], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1 and "without_address 'allow'" in r.stderr + r.stdout, r


def test_drain_with_a_global_part_still_to_send(agent, redis):
    """SIGTERM while the principal's part waits on a frozen Redis: the store answers it
    SHUTDOWN, the ladder (local) allows it, the global part cannot be sent any more and
    its ladder (closed) denies: one ACK, and the agent exits 0 (under ASan: nothing used
    after the store is freed)."""
    import signal
    import time
    limits = {"p5": {"rate": 5, "period": "1h"},
              "gc": {"rate": 100, "period": "1h", "on_failure": "closed"},
              "anon5": LIMITS["anon5"]}
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 10000},
              **dict(GLOBAL_CFG, limits=limits, tiers={"t": {"limits": ["p5"]}},
                     endpoints=LcList([{"name": "ep", "path_prefix": "/ep",
                                        "global_limits": ["gc"]}])))
    with sc.SpopClient(a.addr, timeout=10) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="dg", tier="t", path="/ep")])["allow"] == 1
        redis.proc.signal(signal.SIGSTOP)
        try:
            c.send(sc.notify(3, 1, [sc.rl_message(key="dg", tier="t", path="/ep")]))
            time.sleep(0.2)
            a.proc.signal(signal.SIGTERM)
            f = c.recv_frame(timeout=8)
            assert f is not None and f.type == sc.T_ACK and f.sid == 3, f
            v = sc.ack_vars(f.payload)
            assert v["allow"] == 0 and v.get("status") == 503 and v.get("degraded") == 1, v
        finally:
            redis.proc.signal(signal.SIGCONT)
    wait_until(lambda: not a.alive(), 10, 0.05, "the agent to exit")
    assert a.proc.returncode() == 0, a.proc.log_tail()
