"""The blocked-key cache: once Redis denied a query, the same query is denied locally,
without a Redis call, until its Retry-After; then Redis decides again."""
import time

import spop_client as sc
from test_quota import script_calls

# 2 per 6 s: after two requests the third waits 3 s, far longer than the local answers take
LIMITS = {"b2": {"rate": 2, "period": "6s"}, "anon_h": {"rate": 100, "period": "1h"}}
CFG = dict(limits=LIMITS, tiers={"t": {"limits": ["b2"]}}, default_tier="t",
           anonymous={"limits": ["anon_h"]})


def test_denied_key_answered_locally_until_retry(agent, redis):
    a = agent(redis=redis, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        sid = [1]

        def ask(key):
            sid[0] += 2
            return c.request(sid[0], 1, [sc.rl_message(key=key)])
        t0 = time.monotonic()
        assert [ask("blk")["allow"] for _ in range(3)] == [1, 1, 0]
        calls = script_calls(redis)
        denied = [ask("blk") for _ in range(20)]
        assert time.monotonic() - t0 < 2.5, "20 local answers must not take seconds"
        assert all(v["allow"] == 0 for v in denied), denied
        assert all(1 <= v["retry_after"] <= 3 for v in denied), denied
        assert all(v.get("degraded") is None for v in denied)
        assert script_calls(redis) == calls, "denials within Retry-After must not call Redis"
        # another key is unaffected and still decided by Redis
        assert ask("other")["allow"] == 1
        assert script_calls(redis) == calls + 1
        # once the Retry-After has passed, Redis decides again and a token is back
        time.sleep(max(0.0, t0 + 3.2 - time.monotonic()))
        v = ask("blk")
        assert v["allow"] == 1, v
        assert script_calls(redis) > calls + 1


def test_blocked_cache_can_be_disabled(agent, redis):
    a = agent(redis=redis, blocked_cache=False, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i in range(3):
            c.request(1 + 2 * i, 1, [sc.rl_message(key="nb")])
        calls = script_calls(redis)
        for i in range(5):
            assert c.request(11 + 2 * i, 1, [sc.rl_message(key="nb")])["allow"] == 0
        assert script_calls(redis) == calls + 5
