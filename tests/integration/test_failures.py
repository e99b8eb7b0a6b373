"""Failures: agent killed, Redis stopped. Requests must keep flowing (fail-open), the
agent must stay up, and limiting must resume when the failed piece comes back."""

import time

from conftest import agent_errors, wait_until

# Limits for outage tests: hourly, so nothing refills however slow the machine is.
HOURLY = {
    "key_rpm": {"rate": 3, "period": "1h"},
    "key_day": {"rate": 1000, "period": "1d"},
    "pro_rpm": {"rate": 10, "period": "1h"},
    "anon_rpm": {"rate": 3, "period": "1h"},
}
# The same, failing open explicitly (the default is on_failure = "local").
HOURLY_OPEN = {k: dict(v, on_failure="open") for k, v in HOURLY.items()}


def exhaust(s, key, n=3):
    for i in range(n):
        r = s.get("/", api_key=key)
        assert r.status == 200 and r.h("RateLimit") is not None, r
    r = s.get("/", api_key=key)
    assert r.status == 429, r


def decided(s, key):
    """One request; the response if the agent answered (not degraded, no agent error)."""
    r = s.get("/", api_key=key)
    if r.h("X-RateLimit-Agent-Error") is None and r.h("X-RateLimit-Degraded") is None \
            and r.h("RateLimit") is not None:
        return r
    return None


def test_agent_killed_fails_open_then_recovers(stack):
    s = stack(limits=HOURLY)
    exhaust(s, "fo-agent")
    s.agent.kill()
    errors = set()
    for i in range(8):
        r = s.get("/", api_key="fo-agent")
        assert r.status == 200, r               # fail-open: the key is over its limit
        assert r.h("RateLimit") is None
        err = r.h("X-RateLimit-Agent-Error")
        assert err is not None, r               # set-on-error recorded the failure
        errors.add(err)
        time.sleep(0.1)
    assert errors <= agent_errors(1, 2, 257), errors   # 257: the killed agent's I/O error
    s.agent.restart()
    # health checks bring the agent back (rise 2 x downinter 250ms); Redis kept the state
    r = wait_until(lambda: decided(s, "fo-agent"), 15, 0.2, "agent answering again")
    assert r.status == 429, r
    assert s.get("/", api_key="fo-agent-other").status == 200


def test_redis_down_fails_open_then_recovers(stack):
    s = stack(limits=HOURLY_OPEN, spoe_timeout="200ms")
    exhaust(s, "fo-redis")
    s.redis.stop()
    for i in range(10):
        # 10 requests on a 3/h key: on_failure = "open" lets them all pass
        r = s.get("/", api_key="fo-redis-open")
        assert r.status == 200, r
        # the agent answered in time (no SPOE error) and said it did not ask Redis
        assert r.h("X-RateLimit-Degraded") == "1", r
        assert r.h("X-RateLimit-Agent-Error") is None, r
        assert r.h("Retry-After") is None
    # the key Redis denied stays denied until its Retry-After (the blocked-key cache)
    r = s.get("/", api_key="fo-redis")
    assert r.status == 429 and r.h("X-RateLimit-Degraded") is None, r
    # anonymous traffic too
    r = s.get("/", source="127.0.0.6")
    assert r.status == 200 and r.h("X-RateLimit-Degraded") == "1", r
    assert s.agent.alive()
    s.redis.start()
    # Redis came back empty (no persistence): a fresh budget, limited again
    wait_until(lambda: decided(s, "fo-redis-2"), 5, 0.1, "agent using Redis again")
    statuses = [s.get("/", api_key="fo-redis-3").status for _ in range(5)]
    assert statuses == [200] * 3 + [429] * 2, statuses
    assert s.agent.alive()


def test_redis_restart_under_traffic(stack):
    """Redis restarts between requests several times; never a 5xx, never an agent error."""
    s = stack(limits=HOURLY)
    for round_ in range(3):
        for i in range(3):
            r = s.get("/", api_key="fo-flap-%d-%d" % (round_, i))
            assert r.status == 200, r
            assert r.h("X-RateLimit-Agent-Error") is None, r
        s.redis.restart()
    wait_until(lambda: decided(s, "fo-flap-end"), 5, 0.1, "agent using Redis again")
    assert s.agent.alive()


def test_redis_stalled_fails_open_then_recovers(stack):
    """Redis frozen (SIGSTOP): the agent's command timeout answers fail-open well inside
    the SPOE processing timeout; after SIGCONT the late replies are discarded and
    limiting resumes."""
    import signal
    s = stack(limits=HOURLY, spoe_timeout="200ms", redis_cfg={"command_timeout_ms": 50})
    exhaust(s, "fo-stall")
    s.redis.proc.signal(signal.SIGSTOP)
    try:
        # a key Redis never denied must be decided: by the fail policy, at once
        for i in range(6):
            r = s.get("/", api_key="fo-stall-fresh-%d" % i)
            assert r.status == 200, r
            assert r.h("X-RateLimit-Degraded") == "1", r
            assert r.h("X-RateLimit-Agent-Error") is None, r
        # the exhausted key: its cached denial (a fact Redis computed), also once
        # the breaker opened
        r = s.get("/", api_key="fo-stall")
        assert r.status == 429 and r.h("X-RateLimit-Degraded") is None, r
        assert r.h("X-RateLimit-Agent-Error") is None, r
        assert s.agent.alive()
    finally:
        s.redis.proc.signal(signal.SIGCONT)
    r = wait_until(lambda: decided(s, "fo-stall"), 10, 0.2, "agent using Redis again")
    assert r.status == 429, r
    assert s.agent.alive()


def test_agent_starts_without_redis(agent, redis):
    """The agent starts while Redis is down, answers fail-open (degraded) at once, and
    uses Redis as soon as it appears."""
    import spop_client as sc
    redis.stop()
    a = agent(redis=redis, wait_redis=False)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(3):
            t0 = time.monotonic()
            v = c.request(1 + 2 * i, 1, [sc.rl_message(key="no-redis-yet")])
            assert v["allow"] == 1 and v.get("degraded") == 1, v
            assert "retry_after" not in v
            assert time.monotonic() - t0 < 1.0
        redis.start()
        sid = [100]

        def answered():
            sid[0] += 2
            v = c.request(sid[0], 1, [sc.rl_message(key="redis-now")])
            return v.get("degraded", 0) == 0 and "rule" in v and v
        wait_until(answered, 8, 0.1, "agent using Redis")
    assert a.alive()


def test_redis_killed_hard(stack):
    """SIGKILL on Redis (connections reset, no goodbye): same fail-open behaviour."""
    s = stack(limits=HOURLY_OPEN, spoe_timeout="200ms")
    exhaust(s, "fo-kill")
    s.redis.proc.kill()
    for i in range(5):
        r = s.get("/", api_key="fo-kill-open")
        assert r.status == 200 and r.h("X-RateLimit-Degraded") == "1", r
        assert r.h("X-RateLimit-Agent-Error") is None, r
    # still denied from the blocked-key cache, not let through by the outage
    r = s.get("/", api_key="fo-kill")
    assert r.status == 429 and r.h("X-RateLimit-Agent-Error") is None, r
    assert s.agent.alive()
    s.redis.start()
    wait_until(lambda: decided(s, "fo-kill-2"), 8, 0.1, "agent using Redis again")
