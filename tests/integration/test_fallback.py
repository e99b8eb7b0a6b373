"""The failure ladder and the circuit breaker: Redis stopped or frozen under load.

Each limit says what happens when Redis cannot decide: `open` (allow, degraded), `closed`
(deny with fallback.deny_status, 503 here), `local` (a coarse limit kept by this gateway:
local_rate, or rate / fallback.gateways). Every decision must still be answered, the agent
must stay up, and exact limiting must resume once Redis is back.
"""
import signal
import time

import spop_client as sc
from conftest import Stack, wait_until

LIMITS = {
    "open_h": {"rate": 100, "period": "1h", "on_failure": "open"},
    "closed_h": {"rate": 100, "period": "1h", "on_failure": "closed"},
    # 6/h shared by the fleet; this gateway's fallback share: 6 / 2 gateways = 3
    "local_h": {"rate": 6, "period": "1h", "on_failure": "local"},
    "floor_h": {"rate": 1000, "period": "1h", "on_failure": "local", "local_rate": 2},
    "anon_h": {"rate": 100, "period": "1h"},
}
TIERS = {
    "open": {"limits": ["open_h"]},
    "closed": {"limits": ["open_h", "closed_h"]},
    "local": {"limits": ["local_h"]},
    "floor": {"limits": ["floor_h"]},
}
CFG = dict(limits=LIMITS, tiers=TIERS, default_tier="open",
           anonymous={"limits": ["anon_h"]}, fallback={"gateways": 2, "deny_status": 503})


def test_ladder_per_limit_when_redis_is_down(agent, redis, haproxy):
    a = agent(redis=redis, **CFG)
    s = Stack(redis, a, haproxy(a.address, tiers={"kc": "closed", "kl": "local",
                                                  "kf": "floor", "ko": "open"},
                                spoe_timeout="500ms"))
    for key in ("kc", "kl", "kf", "ko"):
        r = s.get("/", api_key=key)
        assert r.status == 200 and r.h("X-RateLimit-Degraded") is None, r
    s.redis.stop()

    # open: passes, degraded, no verdict headers from a guess
    for i in range(5):
        r = s.get("/", api_key="ko")
        assert r.status == 200 and r.h("X-RateLimit-Degraded") == "1", r
        assert r.h("RateLimit") is None and r.h("X-RateLimit-Agent-Error") is None, r

    # closed: refused with the configured status while Redis cannot decide
    r = s.get("/", api_key="kc")
    assert r.status == 503 and r.h("X-RateLimit-Degraded") == "1", r
    assert r.h("Retry-After") is not None

    # local: this gateway's share, 3 of the fleet's 6, counted in the agent
    statuses = [s.get("/", api_key="kl").status for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429], statuses
    r = s.get("/", api_key="kl")
    assert r.h("X-RateLimit-Degraded") == "1" and r.h("Retry-After") is not None, r

    # local with an explicit floor
    statuses = [s.get("/", api_key="kf").status for _ in range(4)]
    assert statuses == [200, 200, 429, 429], statuses

    assert s.agent.alive()
    s.redis.start()
    # back to exact decisions: the closed tier passes again, not degraded
    r = wait_until(lambda: (lambda r: r if r.status == 200 and r.h("X-RateLimit-Degraded")
                            is None else None)(s.get("/", api_key="kc")), 10, 0.1,
                   "exact decisions after Redis restart")
    assert r.h("RateLimit") is not None


def test_breaker_and_stall_under_load(agent, redis):
    """Redis frozen (SIGSTOP) while 300 pipelined decisions arrive: every one is answered,
    fail-open. Missed deadlines alone do not open the breaker; a Redis that answers
    nothing for the stall time does (later queries are not even sent), and after SIGCONT
    exact decisions come back."""
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 50, "breaker_failures": 3,
                                      "breaker_cooldown_ms": 200}, **CFG)
    with sc.SpopClient(a.addr, timeout=10) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="warm")]).get("degraded") is None
        redis.proc.signal(signal.SIGSTOP)
        try:
            sent = {}
            for i in range(300):
                sid = 3 + 2 * i
                c.send(sc.notify(sid, 1, [sc.rl_message(key="load-%d" % (i % 7))]))
                sent[sid] = True
            got = 0
            deadline = time.monotonic() + 20
            while sent and time.monotonic() < deadline:
                f = c.recv_frame(timeout=max(0.1, deadline - time.monotonic()))
                assert f is not None and f.type == sc.T_ACK, f
                v = sc.ack_vars(f.payload)
                assert v["allow"] == 1 and v["degraded"] == 1, v
                del sent[f.sid]
                got += 1
            assert got == 300 and not sent
            assert a.alive()
            # the stall time (20 command timeouts, at least 1 s) without any reply
            wait_until(lambda: "breaker open: stalled" in a.proc.log_text(), 10, 0.05,
                       "breaker open after the stall")
            v = c.request(701, 1, [sc.rl_message(key="load-0")])
            assert v["allow"] == 1 and v["degraded"] == 1, v
        finally:
            redis.proc.signal(signal.SIGCONT)
        sid = [10001]

        def exact():
            sid[0] += 2
            v = c.request(sid[0], 1, [sc.rl_message(key="after")])
            return v if v.get("degraded") is None and "ratelimit" in v else None
        wait_until(exact, 10, 0.05, "exact decisions after SIGCONT")
    assert "breaker closed" in a.proc.log_text()


def test_redis_restarted_empty_reloads_script(agent, redis):
    """A Redis restarted without its script cache: the agent's EVALSHA gets NOSCRIPT and
    is re-sent as EVAL transparently, without a degraded answer."""
    a = agent(redis=redis, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="ns")])
        assert v.get("degraded") is None and v["allow"] == 1
        redis.cmd("SCRIPT", "FLUSH")
        v = c.request(3, 1, [sc.rl_message(key="ns")])
        assert v.get("degraded") is None and v["allow"] == 1, v
        assert v["remaining"] == 98  # the second decision for this key


def test_stick_table_safety_net_when_agent_is_down(agent, redis, haproxy, monkeypatch):
    """The agent is gone: HAProxy passes requests (fail-open) but its per-instance stick
    table bounds each key to RL_FALLBACK_RATE requests per second."""
    monkeypatch.setenv("RL_FALLBACK_RATE", "3")
    a = agent(redis=redis, **CFG)
    gw = haproxy(a.address)
    assert gw.request("/", api_key="st-key").status == 200
    a.kill()
    # wait until HAProxy's health check marked the agent DOWN: failures are then immediate
    wait_until(lambda: gw.request("/", api_key="probe-key").h("X-RateLimit-Agent-Error")
               not in (None, "1"), 15, 0.2, "agent marked down")
    rs = [gw.request("/", api_key="st-key") for _ in range(10)]
    statuses = [r.status for r in rs]
    assert statuses.count(200) <= 4 and 429 in statuses, statuses
    denied = [r for r in rs if r.status == 429][0]
    assert denied.h("Retry-After") == "1" and denied.h("X-RateLimit-Agent-Error"), denied
    # per key: another key still has its own small budget
    assert gw.request("/", api_key="st-other").status == 200


def test_drain_timeout_with_decisions_in_flight_on_a_closed_limit(agent, redis):
    """SIGTERM while a decision waits on a frozen Redis longer than the drain allows: the
    store answers it SHUTDOWN, the failure ladder (closed) denies it one last time, and
    the agent exits 0 (under ASan: no use of freed top-offender state)."""
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 10000},
              limits={"c1": {"rate": 1, "period": "1h", "on_failure": "closed"},
                      "anon_h": {"rate": 100, "period": "1h"}},
              tiers={"t": {"limits": ["c1"]}}, default_tier="t",
              anonymous={"limits": ["anon_h"]}, blocked_cache=False)
    with sc.SpopClient(a.addr, timeout=10) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="dr")])["allow"] == 1
        assert c.request(3, 1, [sc.rl_message(key="dr")])["allow"] == 0
        redis.proc.signal(signal.SIGSTOP)
        try:
            c.send(sc.notify(5, 1, [sc.rl_message(key="dr")]))
            time.sleep(0.2)
            a.proc.signal(signal.SIGTERM)
            f = c.recv_frame(timeout=8)
            assert f is not None and f.type == sc.T_ACK and f.sid == 5, f
            v = sc.ack_vars(f.payload)
            assert v["allow"] == 0 and v.get("status") == 503 and v.get("degraded") == 1, v
        finally:
            redis.proc.signal(signal.SIGCONT)
    deadline = time.monotonic() + 10
    while a.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not a.alive() and a.proc.returncode() == 0, a.proc.log_tail()
