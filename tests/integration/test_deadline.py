"""One budget, HAProxy's: with spoe_timeout set, a decision waits for Redis until its share of
HAProxy's processing budget has passed (80% of spoe_timeout from the NOTIFY's arrival),
whatever redis.command_timeout_ms says. A Redis whose replies are held back by a proxy on
loopback answers late for the command timeout but within that budget: exact answers; held
back beyond it: the failure ladder answers while HAProxy still listens.

The issue's figures are a 10 ms budget and replies after 7 and 12 ms; here everything is a
hundred times longer (1 s, 0.7 s, 1.2 s) so that a loaded or ASan run keeps its margins.
The tests assert the kind of each answer (exact, ladder), never a duration."""

import threading
import time

import pytest

from conftest import wait_until
from delay_proxy import DelayProxy
from test_overload import degraded_by

HOURLY = {
    "key_rpm": {"rate": 3, "period": "1h"},
    "key_day": {"rate": 1000, "period": "1d"},
    "pro_rpm": {"rate": 10, "period": "1h"},
    "anon_rpm": {"rate": 3, "period": "1h"},
}
SPOE_TIMEOUT = "1000ms"


@pytest.fixture
def delayed_redis(redis):
    p = DelayProxy(redis.port)
    yield p
    p.close()


def gateway(agent, haproxy, proxy, command_timeout_ms):
    a = agent(redis=proxy, limits=HOURLY, spoe_timeout=SPOE_TIMEOUT, metrics=True,
              redis_cfg={"command_timeout_ms": command_timeout_ms})
    return a, haproxy(a.address, spoe_timeout=SPOE_TIMEOUT)


def parallel(fn, n):
    """fn(i) for i in range(n) in threads at once; their results in order."""
    out = [None] * n

    def run(i):
        out[i] = fn(i)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    return out


@pytest.mark.parametrize("command_timeout_ms", [None, 150],
                         ids=["derived", "set-below-the-reply-time"])
def test_a_reply_late_for_the_command_timeout_but_within_haproxys_budget_is_exact(
        agent, haproxy, delayed_redis, command_timeout_ms):
    """Replies held 0.7 s under a 1 s spoe_timeout (the issue's 7 ms under 10 ms): every
    answer is Redis's own (no degraded answer, no agent error), and Redis counted them, up
    to the limit's denial. With command_timeout_ms derived (0.8 s) or set to 150 ms: both
    are exact, decisions wait for HAProxy's budget, not the command timeout."""
    a, gw = gateway(agent, haproxy, delayed_redis, command_timeout_ms)
    # the start-up probes may have met Redis not connected yet (degraded, reason "down"):
    # only what follows counts (counters are published every 250 ms)
    time.sleep(0.5)
    before = degraded_by(a)
    delayed_redis.delay = 0.7
    # three keys of 3/h at once: each gets its three requests, one after the other
    def three(i):
        return [gw.request("/", api_key="late-%d" % i) for _ in range(3)]
    rs = [r for seq in parallel(three, 3) for r in seq]
    for r in rs:
        assert r.status == 200, r
        assert r.h("X-RateLimit-Degraded") is None, r
        assert r.h("X-RateLimit-Agent-Error") is None, r
    assert sorted(r.h("RateLimit-Remaining") for r in rs) == ["0", "0", "0", "1", "1", "1",
                                                               "2", "2", "2"], rs
    # the fourth is denied by Redis (the bucket holds the three), exactly
    r = gw.request("/", api_key="late-0")
    assert r.status == 429 and r.h("X-RateLimit-Degraded") is None, r
    time.sleep(0.5)
    assert degraded_by(a) == before, (before, degraded_by(a))


def test_a_reply_later_than_haproxys_budget_gets_the_ladder_before_haproxy_gives_up(
        agent, haproxy, delayed_redis, redis):
    """Replies held 1.2 s under a 1 s spoe_timeout (the issue's 12 ms under 10 ms): the
    failure ladder answers at 80% of the budget, so HAProxy gets the agent's (degraded)
    verdict and no agent error; the local limit still applies (3/h with one gateway)."""
    a, gw = gateway(agent, haproxy, delayed_redis, None)
    delayed_redis.delay = 1.2
    rs = parallel(lambda i: gw.request("/", api_key="slow-%d" % i), 3)
    for r in rs:
        assert r.status == 200, r
        assert r.h("X-RateLimit-Degraded") == "1", r
        assert r.h("X-RateLimit-Agent-Error") is None, r
    # the ladder's local limit (3/h, fallback.gateways = 1) denies the fourth of one key
    for _ in range(3):
        r = gw.request("/", api_key="slow-ladder")
        assert r.status == 200 and r.h("X-RateLimit-Degraded") == "1", r
    r = gw.request("/", api_key="slow-ladder")
    assert r.status == 429 and r.h("X-RateLimit-Degraded") == "1", r
    # Redis answered all of them in the end (late replies, discarded): exact again at once
    delayed_redis.delay = 0
    wait_until(lambda: gw.request("/", api_key="slow-after").h("X-RateLimit-Degraded") is None,
               10, 0.2, "exact answers again")
    _, body = a.http("/metrics")
    assert 'spoa_ratelimit_redis_breaker_opened_total 0' in body, body


def test_a_tier_lookup_waits_no_longer_than_haproxys_budget(
        agent, haproxy, delayed_redis):
    """The tier lookup (tier_lookup.redis_hash) is a command a NOTIFY waits on: with
    spoe_timeout set its deadline is the decision's answer_by too, not command_timeout_ms
    (5 s here). Replies held 2 s: the failure ladder answers before HAProxy gives up (a
    degraded verdict, no agent error), as for the decision's own script call."""
    a = agent(redis=delayed_redis, limits=HOURLY, spoe_timeout=SPOE_TIMEOUT, metrics=True,
              redis_cfg={"command_timeout_ms": 5000},
              tier_lookup={"redis_hash": "rl:tiers", "cache_ttl": "30s"})
    gw = haproxy(a.address, spoe_timeout=SPOE_TIMEOUT)
    wait_until(lambda: gw.request("/", api_key="tl-warm").h("X-RateLimit-Degraded") is None,
               10, 0.2, "exact answers with the lookup")
    delayed_redis.delay = 2.0
    rs = parallel(lambda i: gw.request("/", api_key="tl-slow-%d" % i), 3)
    for r in rs:
        assert r.status == 200, r
        assert r.h("X-RateLimit-Agent-Error") is None, r
        assert r.h("X-RateLimit-Degraded") == "1", r
