"""The local fallback follows the fleet (fallback.gateways = "auto", the default).

During a Redis outage each agent applies rate / G to its own traffic, G being the live
gateways the heartbeats counted in Redis before it (src/policy/heartbeat.c, lua/heartbeat.lua),
kept through the outage. Two and five agents share one client's traffic during an outage:
together they admit the limit (within 20%), where a count of 1 (today's explicit setting)
admits G times it. Counts only: a daily bucket, so nothing refills during the test.
"""
import pytest

import spop_client as sc
from conftest import wait_until
from test_ops import scrape

RATE = 100
LIMITS = {"fleet_d": {"rate": RATE, "period": "1d"}}
TIERS = {"free": {"limits": ["fleet_d"]}}
ANON = {"limits": ["fleet_d"]}


def fleet(agent, redis, n, fallback):
    """<n> agents on one Redis, each waiting until the heartbeats counted all of them."""
    cfg = dict(limits=LIMITS, tiers=TIERS, default_tier="free", anonymous=ANON)
    if fallback is not None:
        cfg["fallback"] = {"gateways": fallback}
    agents = [agent(redis=redis, name="agent%d" % i, metrics=True, **cfg) for i in range(n)]
    for a in agents:
        wait_until(lambda: scrape(a).get("spoa_ratelimit_gateways") == n, 10, 0.1,
                   "%d gateways counted" % n)
    return agents


def outage_admitted(agents, key, per_gateway):
    """Redis is down: <per_gateway> requests of <key> through each agent, in turns; the
    number admitted (every answer degraded: the local fallback decided)."""
    clients = [sc.SpopClient(a.addr, timeout=5) for a in agents]
    admitted, sid = 0, 1
    try:
        for c in clients:
            c.hello()
        for _ in range(per_gateway):
            for c in clients:
                v = c.request(sid, 1, [sc.rl_message(key=key)])
                assert v.get("degraded") == 1, v
                admitted += v["allow"]
                sid += 2
    finally:
        for c in clients:
            c.close()
    return admitted


@pytest.mark.parametrize("n,fallback,expect", [
    (2, None, RATE), (5, None, RATE),          # auto: the fleet shares the limit
    (2, 1, 2 * RATE), (5, 1, 5 * RATE),        # an explicit count overrides it
    (5, 2, 5 * (RATE // 2)),
])
def test_outage_admits_the_limit_across_the_fleet(agent, redis, n, fallback, expect):
    agents = fleet(agent, redis, n, fallback)
    for a in agents:
        p = scrape(a)
        assert p.get("spoa_ratelimit_fallback_gateways") == (fallback or n), p
        assert p.get("spoa_ratelimit_fallback_gateways_auto") == (0 if fallback else 1)
    redis.stop()
    admitted = outage_admitted(agents, "fleet-key", 2 * RATE)
    print("gateways=%d fallback.gateways=%s: %d admitted during the outage (limit %d)"
          % (n, fallback or "auto", admitted, RATE))
    assert admitted == expect, admitted
    if fallback is None:
        assert abs(admitted - RATE) <= RATE // 5
    # the count of the fleet before the outage is kept through it
    for a in agents:
        assert a.alive()
        p = scrape(a)
        assert p.get("spoa_ratelimit_gateways") == n
        assert p.get("spoa_ratelimit_fallback_gateways") == (fallback or n)
        status, body = a.http("/ready")
        assert status == 200, body
        assert ("fallback gateways: %d (%s)" % (
            fallback or n, "configured" if fallback else "auto: live gateways counted last")
        ) in body, body


def test_auto_before_any_heartbeat_is_one(agent, redis):
    """An agent that never reached Redis has counted nobody: its local limit is the whole
    rate (as with fallback.gateways = 1), and it says so."""
    redis.stop()
    a = agent(redis=redis, wait_redis=False, metrics=True, limits=LIMITS, tiers=TIERS,
              default_tier="free", anonymous=ANON)
    status, body = a.http("/ready")
    assert "fallback gateways: 1 (auto: none counted yet)" in body, body
    p = scrape(a)
    assert p.get("spoa_ratelimit_gateways") == 0
    assert p.get("spoa_ratelimit_fallback_gateways") == 1
    assert outage_admitted([a], "lonely-key", RATE + 10) == RATE


def test_check_says_which_count(tmp):
    from conftest import agent_config, check_config
    cfg = agent_config("127.0.0.1:1", "127.0.0.1:6379", limits=LIMITS, tiers=TIERS,
                       default_tier="free", anonymous=ANON)
    r = check_config(tmp, cfg)
    assert r.returncode == 0, r.stderr
    assert 'fallback.gateways = "auto"' in r.stdout, r.stdout
    cfg["fallback"] = {"gateways": 4}
    r = check_config(tmp, cfg)
    assert "rate / 4 gateways (fallback.gateways)" in r.stdout, r.stdout
    cfg["fallback"] = {"gateways": "many"}
    r = check_config(tmp, cfg)
    assert r.returncode != 0 and '\'gateways\' must be "auto" or an integer' in r.stderr, r
    cfg["fallback"] = {"gateways": 0}
    r = check_config(tmp, cfg)
    assert r.returncode != 0 and "'gateways' must be between 1 and 100000" in r.stderr, r
