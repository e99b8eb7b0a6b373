"""Post-charges: the cost of a request known from its response (HAProxy's rl-res message on
`http-response send-spoe-group`), charged to the request's own buckets, debt allowed.

End to end through real HAProxy (haproxy/haproxy.cfg, haproxy/spoe-ratelimit.conf) and
real Redis; the SPOP-level tests check what HAProxy cannot easily be made to send.
"""

import hashlib
import http.server
import subprocess
import threading
import time

import pytest

import spop_client as sc
from conftest import (HAProxy, LcList, StubApp, agent_env, free_port, key_principal,
                      limit_state, parse_sf_list, to_libconfig, wait_until)
from test_ops import Prom

# cb: a bucket of 10, one token every 6 s; cw: a day's window, its count read exactly.
LIMITS = {
    "cb": {"rate": 10, "period": "1m", "burst": 10},
    "cw": {"algorithm": "fixed_window", "rate": 100000, "period": "1d"},
    "cl": {"algorithm": "sliding_log", "rate": 10, "period": "1m"},
    "ca": {"rate": 10, "period": "1m"},
}
CFG = dict(
    limits=LIMITS,
    tiers={"free": {"limits": ["cb", "cw"]}, "logged": {"limits": ["cl"]}},
    default_tier="free",
    anonymous={"limits": ["ca"]},
    endpoints=LcList([
        {"name": "search", "path_prefix": "/search", "cost": 5},
        {"name": "dl", "path_prefix": "/dl", "post_charge": {"from": "bytes", "per": 100}},
        {"name": "fixed", "path_prefix": "/fixed", "cost": 2, "limit_costs": {"cw": 3}},
    ]),
    post_charge={"max": 500},
)


def digest(key):
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def window_count(redis, key, limit="cw"):
    """The count in a fixed window's state ("<window>:<count>"), 0 when absent."""
    v = limit_state(redis.cmd, key_principal(key), limit)
    return int(v.split(":")[1]) if v else 0


def bucket_owed_s(redis, key, limit="cb"):
    """Seconds of tokens a GCRA bucket owes now: its TAT minus Redis time."""
    v = limit_state(redis.cmd, key_principal(key), limit)
    t = redis.cmd("TIME")
    now = int(t[0]) * 1000000 + int(t[1])
    return (int(v.split(":")[0]) - now) / 1e6


def metrics(a):
    status, body = a.http("/metrics")
    assert status == 200
    return Prom(body)


def posts(a, outcome):
    return metrics(a).get("spoa_ratelimit_post_charges_total", outcome=outcome) or 0


class App(StubApp):
    """The application: answers GET /<anything> with 200, and
    ?cost=N   sets X-RateLimit-Cost: N (the value as given, any text)
    ?n=N      sends a body of N bytes with a Content-Length
    ?chunked  sends its body chunked (no Content-Length)
    ?sleep=S  answers after S seconds."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                q = {}
                if "?" in self.path:
                    for kv in self.path.split("?", 1)[1].split("&"):
                        k, _, v = kv.partition("=")
                        q[k] = v
                if "sleep" in q:
                    time.sleep(float(q["sleep"]))
                body = b"x" * int(q.get("n", "2"))
                self.send_response(200)
                if "cost" in q:
                    self.send_header("X-RateLimit-Cost", q["cost"].replace("%20", " "))
                if "chunked" in q:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *a):
                pass

        super().__init__(Handler)


@pytest.fixture
def app():
    a = App()
    yield a
    a.close()


@pytest.fixture
def gw(redis, agent, procs, tmp, app):
    """Redis + agent (CFG, metrics on) + the sample gateway in front of App."""
    def start(**over):
        a = agent(redis=redis, metrics=True, **dict(CFG, **over))
        return a, HAProxy(procs, tmp, a.address, app.address)
    return start


def check_clean(r):
    """A response the post-charge left alone: no cost header, no agent error."""
    assert r.h("X-RateLimit-Cost") is None, r
    assert r.h("X-RateLimit-Agent-Error") is None, r
    assert r.h("X-RateLimit-Degraded") is None, r


def test_header_cost_puts_the_bucket_in_debt(gw, redis):
    a, g = gw()
    r = g.request("/x?cost=18", api_key="debtor")
    assert r.status == 200, r
    check_clean(r)
    rl = dict(parse_sf_list(r.h("RateLimit")))
    assert rl["cb"]["r"] == 9, rl  # the request itself cost 1
    # charged after the response: 17 more tokens, to both limits of the request
    wait_until(lambda: window_count(redis, "debtor") == 18, 5, what="window count 18")
    owed = bucket_owed_s(redis, "debtor")
    assert 18 * 6 - 3 <= owed <= 18 * 6, owed  # 18 tokens of 6 s, past the bucket's 60 s
    # later requests wait until the debt is repaid: 19 tokens owed, 10 tolerated
    r = g.request("/x", api_key="debtor")
    assert r.status == 429, r
    ra = int(r.h("Retry-After"))
    assert 9 * 6 - 4 <= ra <= 9 * 6, ra
    rl = dict(parse_sf_list(r.h("RateLimit")))
    assert rl["cb"]["r"] == 0 and rl["cb"]["t"] == ra, rl
    assert r.h("RateLimit-Remaining") == "0"
    assert posts(a, "charged") == 1
    # another key is untouched
    assert g.request("/x", api_key="other").status == 200


def test_a_cheaper_response_is_refunded(gw, redis):
    a, g = gw()
    r = g.request("/search?cost=1", api_key="cheap")
    assert r.status == 200, r
    check_clean(r)
    assert dict(parse_sf_list(r.h("RateLimit")))["cb"]["r"] == 5  # pre-charged 5
    wait_until(lambda: window_count(redis, "cheap") == 1, 5, what="window count back to 1")
    r = g.request("/x", api_key="cheap")
    # 1 for the search after its refund, 1 for this one (a token may have come back)
    assert dict(parse_sf_list(r.h("RateLimit")))["cb"]["r"] in (8, 9), r
    assert posts(a, "refunded") == 1


def test_the_same_cost_charges_nothing_and_limit_costs_stand(gw, redis):
    a, g = gw()
    assert g.request("/search?cost=5", api_key="exact").status == 200
    # /fixed: cost 2 for cb, its own 3 for cw; the response says 10
    assert g.request("/fixed?cost=10", api_key="fixed").status == 200
    wait_until(lambda: posts(a, "unchanged") == 1 and posts(a, "charged") == 1, 5,
               what="both post-charges handled")
    assert window_count(redis, "exact") == 5
    assert window_count(redis, "fixed") == 3          # limit_costs: what it costs, always
    assert 9 * 6 - 3 <= bucket_owed_s(redis, "fixed") <= 10 * 6  # cb: 10 tokens


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "0x10", "5,%207", "%20"])
def test_garbage_costs_leave_the_pre_charge(gw, redis, value):
    a, g = gw()
    r = g.request("/x?cost=" + value, api_key="garbage")
    assert r.status == 200, r
    check_clean(r)
    wait_until(lambda: posts(a, "invalid") == 1, 5, what="an invalid post-charge counted")
    assert window_count(redis, "garbage") == 1
    assert posts(a, "charged") == posts(a, "refunded") == 0


def test_huge_costs_are_clamped_and_zero_refunds(gw, redis):
    a, g = gw()
    assert g.request("/x?cost=" + "9" * 40, api_key="huge").status == 200
    assert g.request("/search?cost=0", api_key="zero").status == 200
    wait_until(lambda: window_count(redis, "huge") == 500, 5, what="clamped to max 500")
    wait_until(lambda: window_count(redis, "zero") == 0, 5, what="search refunded to 0")
    m = metrics(a)
    assert m.get("spoa_ratelimit_post_charge_clamped_total") == 1
    # the bucket's debt is bounded: 2^51 ticks of 2^-24 us (T = 6 s in ticks of 2^-k us,
    # k = 24 the largest with 10 T <= 2^50), 134.2 s, what -c reports for it
    cap = 2 ** 27 / 1e6
    assert cap - 3 <= bucket_owed_s(redis, "huge") <= cap


def test_bytes_endpoint_charges_the_response_size(gw, redis):
    a, g = gw()
    r = g.request("/dl?n=1050", api_key="bytes")  # ceil(1050 / 100) = 11 tokens
    assert r.status == 200 and len(r.body) == 1050, r
    check_clean(r)
    wait_until(lambda: window_count(redis, "bytes") == 11, 5, what="11 tokens for 1050 bytes")
    # chunked: no size known, the pre-charge stands
    r = g.request("/dl?n=5000&chunked", api_key="chunked")
    assert r.status == 200 and len(r.body) == 5000, r
    wait_until(lambda: posts(a, "absent") == 1, 5, what="a post-charge without a value")
    assert window_count(redis, "chunked") == 1
    # elsewhere the size does not count: no header, no post-charge sent at all
    assert g.request("/x?n=5000", api_key="plain").status == 200
    time.sleep(0.3)
    assert window_count(redis, "plain") == 1
    assert posts(a, "absent") == 1


def test_a_denied_request_is_not_post_charged(gw, redis):
    a, g = gw()
    for _ in range(10):
        assert g.request("/x", api_key="full").status == 200
    r = g.request("/x?cost=50", api_key="full")
    assert r.status == 429, r
    time.sleep(0.3)
    assert window_count(redis, "full") == 10
    assert sum(posts(a, o) for o in ("charged", "refunded", "unchanged", "absent",
                                      "invalid", "failed")) == 0


def test_agent_gone_before_the_response_fails_silently(gw, redis):
    a, g = gw()
    assert g.request("/x", api_key="warm").status == 200
    out = {}

    def slow():
        out["r"] = g.request("/x?cost=50&sleep=1.0", api_key="silent")

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.4)
    a.kill()                       # the request was decided; its response finds no agent
    t.join(10)
    r = out["r"]
    assert r.status == 200 and r.body == b"xx", r
    assert r.h("X-RateLimit-Cost") is None, r
    assert r.h("X-RateLimit-Agent-Error") is None, r
    assert r.elapsed < 1.0 + 1.5, r.elapsed  # within the SPOE processing budget (500ms)
    assert window_count(redis, "silent") == 1


def reloads(a):
    return metrics(a).get("spoa_ratelimit_reloads_total", result="ok") or 0


def endpoints_with_search_cost(cost):
    return LcList([dict(e, cost=cost) if e["name"] == "search" else e for e in CFG["endpoints"]])


def test_a_reload_between_request_and_response_keeps_what_was_charged(gw, redis):
    """/search costs 5 when the request is charged; a reload makes it cost 1 before the
    response says 3: the difference is 3 - 5 (a refund of 2), not 3 - 1."""
    a, g = gw()
    out = {}

    def slow():
        out["r"] = g.request("/search?cost=3&sleep=1.5", api_key="reloaded")

    t = threading.Thread(target=slow)
    t.start()
    wait_until(lambda: window_count(redis, "reloaded") == 5, 5, what="pre-charged 5")
    a.reload(endpoints=endpoints_with_search_cost(1))
    wait_until(lambda: reloads(a) == 1, 5, what="the reload")
    t.join(10)
    r = out["r"]
    assert r.status == 200, r
    check_clean(r)
    wait_until(lambda: posts(a, "refunded") == 1, 5, what="the post-charge")
    assert window_count(redis, "reloaded") == 3
    # the new cost is in force for new requests
    assert g.request("/search", api_key="after").status == 200
    assert window_count(redis, "after") == 1


# ---------------------------------------------------------------------------------------
# SPOP level

def res_message(key, charge=None, endpoint=None, ip="127.0.0.1", **more):
    import ipaddress
    args = [("key", key), ("tier", None), ("ip", ipaddress.ip_address(ip)),
            ("endpoint", endpoint), ("cost", None), ("charge", charge)]
    args += list(more.items())
    return ("rl-res", args)


# what the agent answers a post-charge: nothing of ours (the library's placeholder only)
ACKED = {"done": None}


class Asker:
    def __init__(self, c):
        self.c, self.sid = c, -1

    def ask(self, msg):
        self.sid += 2
        return self.c.request(self.sid, 1, [msg])


def test_spop_post_charge_is_acked_empty_at_once(agent, redis):
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(sc.rl_message(key="spop"))["allow"] == 1
        # an int from HAProxy (e.g. a converter) counts like a header's digits
        assert q.ask(res_message("spop", charge=30)) == ACKED
        wait_until(lambda: window_count(redis, "spop") == 30, 5, what="count 30")
        # a fetch HAProxy could not evaluate is NULL: nothing to charge
        assert q.ask(res_message("spop", charge=None)) == ACKED
        assert q.ask(res_message("spop", charge=-3)) == ACKED
        wait_until(lambda: posts(a, "invalid") == 1 and posts(a, "absent") == 1, 5,
                   what="null and negative counted")
        v = q.ask(sc.rl_message(key="spop"))
        assert v["allow"] == 0 and v["retry_after"] > 60, v


def test_spop_charged_names_the_endpoint_cost_and_survives_a_reload(agent, redis):
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        v = q.ask(sc.rl_message(key="spop", path="/search"))
        assert v["allow"] == 1 and v["endpoint"] == "search" and v["charged"] == 5, v
        # HAProxy's own cost: nothing to name; no endpoint: nothing either
        v = q.ask(sc.rl_message(key="spop2", path="/search", cost=2))
        assert v["allow"] == 1 and "charged" not in v, v
        assert "charged" not in q.ask(sc.rl_message(key="spop3", path="/x"))
        a.reload(endpoints=endpoints_with_search_cost(1))
        wait_until(lambda: reloads(a) == 1, 5, what="the reload")
        assert q.ask(sc.rl_message(key="probe", path="/search"))["charged"] == 1
        # charged 5 at request time, 3 by the response: a refund of 2
        assert q.ask(res_message("spop", charge=3, endpoint="search", charged=5)) == ACKED
        wait_until(lambda: window_count(redis, "spop") == 3, 5, what="count 3")
        # without `charged` (an older SPOE file) the endpoint's cost now is taken
        assert q.ask(res_message("spop", charge=4, endpoint="search")) == ACKED
        wait_until(lambda: window_count(redis, "spop") == 6, 5, what="count 6")
        # garbage in `charged` is as if not sent
        assert q.ask(res_message("spop", charge=4, endpoint="search", charged="x")) == ACKED
        wait_until(lambda: window_count(redis, "spop") == 9, 5, what="count 9")


def test_spop_memory_store_takes_debt(agent):
    a = agent(store="memory", metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(sc.rl_message(key="mem"))["allow"] == 1
        assert q.ask(res_message("mem", charge="15")) == ACKED
        wait_until(lambda: posts(a, "charged") == 1, 5, what="charged")
        v = q.ask(sc.rl_message(key="mem"))
        # 16 tokens owed, 10 tolerated
        assert v["allow"] == 0 and 6 * 6 - 4 <= v["retry_after"] <= 6 * 6, v


def test_spop_sliding_log_owes_at_most_100(agent, redis):
    a = agent(redis=redis, metrics=True, **dict(CFG, default_tier="logged"))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(sc.rl_message(key="log"))["allow"] == 1
        assert q.ask(res_message("log", charge="500")) == ACKED
        key = "rl:{k:%s}:cl" % digest("log")
        wait_until(lambda: redis.cmd("ZCARD", key) == 101, 5, what="1 + 100 entries")
        assert q.ask(sc.rl_message(key="log"))["allow"] == 0


def test_spop_redis_down_counts_failed(agent, redis):
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        assert q.ask(sc.rl_message(key="down"))["allow"] == 1
        redis.stop()
        t0 = time.monotonic()
        assert q.ask(res_message("down", charge="40")) == ACKED
        assert time.monotonic() - t0 < 0.5
        wait_until(lambda: posts(a, "failed") == 1, 5, what="failed counted")
        assert posts(a, "charged") == 1
    assert a.alive()


def test_check_notes_sliding_log(agent_bin, tmp):
    from conftest import agent_config
    p = tmp / "c.conf"
    p.write_text(to_libconfig(agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1",
                                           **CFG)))
    r = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                       timeout=20, env=agent_env())
    assert r.returncode == 0, r
    assert "limit 'cl' (sliding_log) owes at most 100 tokens" in r.stdout, r.stdout
    assert "limit 'cb' (gcra) owes at most 22 tokens (134 s)" in r.stdout, r.stdout
    assert "'cw'" not in r.stdout
    # without post_charge configured anywhere, nothing to say
    p.write_text(to_libconfig(agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1",
                                           **dict(CFG, post_charge=None, endpoints=None))))
    r = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                       timeout=20, env=agent_env())
    assert r.returncode == 0 and "note:" not in r.stdout, r


def test_bad_post_charge_config_is_an_error(agent_bin, tmp):
    from conftest import agent_config
    for bad, msg in ((dict(post_charge={"from": "rows"}), "post_charge.from 'rows'"),
                     (dict(post_charge={"per": 0}), "'per' must be between 1"),
                     (dict(post_charge={"max": -1}), "'max' must be between 0"),
                     (dict(post_charge={"message": "rl-req"}), "is the request's message"),
                     (dict(endpoints=LcList([{"name": "e", "path_prefix": "/e",
                                              "post_charge": {"message": "x"}}])),
                      "belongs to the top level")):
        p = tmp / "bad.conf"
        p.write_text(to_libconfig(agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1",
                                               **bad)))
        r = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True,
                           text=True, timeout=20, env=agent_env())
        assert r.returncode != 0 and msg in r.stderr, (bad, r)


def test_worked_example_of_the_docs(agent, haproxy, redis):
    """doc/configuration.md, "Worked example": the sample gateway and the sample
    application (haproxy/upstream.cfg echoes X-App-Cost as X-RateLimit-Cost)."""
    a = agent(redis=redis,
              limits={"per_minute": {"rate": 10, "period": "1m", "burst": 10},
                      "per_day": {"algorithm": "fixed_window", "rate": 10000,
                                  "period": "1d"},
                      "anon": {"rate": 10, "period": "1m"}},
              tiers={"free": {"limits": ["per_minute", "per_day"]}},
              anonymous={"limits": ["anon"]}, post_charge={"max": 1000})
    g = haproxy(a.address)
    r = g.request("/", api_key="k1", headers={"X-App-Cost": "18"})
    assert r.status == 200 and r.body == b"ok", r
    check_clean(r)
    assert dict(parse_sf_list(r.h("RateLimit")))["per_minute"]["r"] == 9
    wait_until(lambda: window_count(redis, "k1", "per_day") == 18, 5, what="18 charged")
    r = g.request("/", api_key="k1")
    assert r.status == 429, r
    ra = int(r.h("Retry-After"))
    assert 54 - 4 <= ra <= 54, r
    assert dict(parse_sf_list(r.h("RateLimit")))["per_minute"] == {"r": 0, "t": ra}


# ---------------------------------------------------------------------------------------
# Races and reloads: what a post-charge adjusts is what the request was charged

# pw: a day's window with a local quota (pre-checks only, trusted for an hour): the second
# request of a key is admitted by a pre-check and reported later, or when the agent stops
RACE_CFG = dict(
    limits={"pw": {"algorithm": "fixed_window", "rate": 100000, "period": "1d",
                   "accuracy_budget": 0.05},
            "ca": LIMITS["ca"]},
    tiers={"free": {"limits": ["pw"]}},
    default_tier="free",
    anonymous={"limits": ["ca"]},
    endpoints=LcList([{"name": "search", "path_prefix": "/search", "cost": 10}]),
    local_quota={"leases": False, "lease_ms": 3600000, "flush_ms": 60000},
)


def test_spop_refund_of_a_prechecked_request_is_not_lost(agent, redis):
    """Two /search requests (cost 10 each) whose responses cost 0. The first is decided in
    Redis, the second by a pre-check, its charge not reported yet when its refund comes.
    The refund must not reach Redis before that report (the window cannot go below 0: the
    refund would be lost and the report charge 10 after it): the window ends at 0."""
    a = agent(redis=redis, metrics=True, **RACE_CFG)
    # local quotas start once the heartbeats have counted the gateways
    wait_until(lambda: metrics(a).get("spoa_ratelimit_gateways") == 1, 5, what="counted")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        for i in range(2):
            v = q.ask(sc.rl_message(key="racer", path="/search"))
            assert v["allow"] == 1 and v.get("charged") == 10, v
        p = metrics(a)
        assert p.get("spoa_ratelimit_local_quota_requests_total", what="prechecked") == 1
        assert window_count(redis, "racer", "pw") == 10
        for i in range(2):
            assert q.ask(res_message("racer", charge=0, endpoint="search", charged=10)) == ACKED
        wait_until(lambda: posts(a, "refunded") == 2, 5, what="two refunds")
    a.stop()   # what is left unreported is reported before the agent exits
    assert window_count(redis, "racer", "pw") == 0


SHADOW_CFG = dict(
    limits={"sw": {"algorithm": "fixed_window", "rate": 10, "period": "1d", "shadow": True},
            "ew": {"algorithm": "fixed_window", "rate": 100000, "period": "1d"},
            "ca": LIMITS["ca"]},
    tiers={"free": {"limits": ["ew", "sw"]}},
    default_tier="free",
    anonymous={"limits": ["ca"]},
    endpoints=LcList([{"name": "heavy", "path_prefix": "/heavy", "cost": 8}]),
)


def test_spop_shadow_limit_that_would_deny_is_not_post_charged(agent, redis):
    """A shadow limit that would have denied a request was not charged for it: a response
    that costs less must not credit it, one that costs more must not charge it (enforced,
    it would have denied the request, which would never have had a response). The ACK
    names it in `shadow`, and the rl-res message carries that name back."""
    a = agent(redis=redis, metrics=True, **SHADOW_CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        v = q.ask(sc.rl_message(key="shady", path="/heavy"))
        assert v["allow"] == 1 and "shadow" not in v, v
        v = q.ask(sc.rl_message(key="shady", path="/heavy"))
        assert v["allow"] == 1 and v["shadow"] == "sw", v
        assert window_count(redis, "shady", "sw") == 8
        assert window_count(redis, "shady", "ew") == 16
        # the second request's response costs 0: the enforced limit gets its 8 back, the
        # shadow limit nothing (it was not charged)
        assert q.ask(res_message("shady", charge=0, endpoint="heavy", charged=8,
                                 shadow="sw")) == ACKED
        wait_until(lambda: posts(a, "refunded") == 1, 5, what="the refund")
        wait_until(lambda: window_count(redis, "shady", "ew") == 8, 5, what="ew refunded")
        assert window_count(redis, "shady", "sw") == 8
        # and one costing 20: charged 12 more on the enforced limit only
        assert q.ask(res_message("shady", charge=20, endpoint="heavy", charged=8,
                                 shadow="sw")) == ACKED
        wait_until(lambda: window_count(redis, "shady", "ew") == 20, 5, what="ew charged")
        assert window_count(redis, "shady", "sw") == 8
        # the first request's response (no shadow named: it was charged everywhere)
        assert q.ask(res_message("shady", charge=2, endpoint="heavy", charged=8)) == ACKED
        wait_until(lambda: window_count(redis, "shady", "sw") == 2, 5, what="sw refunded")
        assert window_count(redis, "shady", "ew") == 14


def test_shadow_name_travels_back_through_haproxy(redis, agent, procs, tmp, app):
    """The sample gateway sends the ACK's `shadow` back in rl-res: a shadow limit of 1 a
    day that would deny the second request is not credited by its cheaper response."""
    cfg = dict(SHADOW_CFG, limits=dict(SHADOW_CFG["limits"], sw={
        "algorithm": "fixed_window", "rate": 1, "period": "1d", "shadow": True}))
    a = agent(redis=redis, metrics=True, **cfg)
    g = HAProxy(procs, tmp, a.address, app.address)
    assert g.request("/x", api_key="shade").status == 200
    r = g.request("/x?cost=0", api_key="shade")
    assert r.status == 200, r
    check_clean(r)
    wait_until(lambda: posts(a, "refunded") == 1, 5, what="the refund")
    wait_until(lambda: window_count(redis, "shade", "ew") == 1, 5, what="ew refunded")
    assert window_count(redis, "shade", "sw") == 1


def test_spop_reload_removing_a_limit_leaves_its_charge(agent, redis):
    """A reload removes limit cw from the tier between a request and its response: the
    response's refund adjusts the limits in force (cb), and leaves cw's charge as it is,
    which is no longer enforced and expires with its state (its entry in the client's key,
    which expires with its last entry: see doc/configuration.md, Post-charges, "Reloads",
    and "Key layouts")."""
    a = agent(redis=redis, metrics=True, **CFG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        q = Asker(c)
        v = q.ask(sc.rl_message(key="removed", path="/search"))
        assert v["allow"] == 1 and v["charged"] == 5, v
        assert window_count(redis, "removed") == 5
        a.reload(tiers={"free": {"limits": ["cb"]}, "logged": {"limits": ["cl"]}})
        wait_until(lambda: reloads(a) == 1, 5, what="the reload")
        owed = bucket_owed_s(redis, "removed")
        assert q.ask(res_message("removed", charge=1, endpoint="search", charged=5)) == ACKED
        wait_until(lambda: posts(a, "refunded") == 1, 5, what="the refund")
        # cb got 4 tokens back (24 s of a 6 s token), cw kept its 5
        wait_until(lambda: bucket_owed_s(redis, "removed") < owed - 20, 5, what="cb refunded")
        assert window_count(redis, "removed") == 5
        # the key of the client's limits (cb's and cw's states) expires within cw's day
        ttl = redis.cmd("PTTL", "rl:v2:{%s}" % key_principal("removed"))
        assert 0 < ttl <= 86400 * 1000 + 1000, ttl
