"""The RateLimit headers a client author reads, end to end through HAProxy
(haproxy/haproxy.cfg): which limit `RateLimit` describes when several apply, and how a
bucket that holds more than its rate shows in `RateLimit-Policy` and the legacy trio.

draft-ietf-httpapi-ratelimit-headers: `RateLimit` reports the limit closest to being
exhausted; `q`/`w` are the quota per window, and parameters the draft does not define
carry a vendor prefix (`rl-burst`)."""
import json

from conftest import LcList, parse_sf_list

# 10 per minute with a bucket of 20: the first 20 pass at once, then one every 6 s, so
# nothing refills between the requests of a test.
BURSTY = {"rate": 10, "period": "1m", "burst": 20}


def gateway(redis, agent, haproxy, limits, endpoints=None):
    """An agent with tier "t" = <limits> (in that order) for every key, behind HAProxy."""
    over = {"limits": dict(limits, anon={"rate": 100, "period": "1m"}),
            "tiers": {"t": {"limits": list(limits)}}, "default_tier": "t",
            "anonymous": {"limits": ["anon"]}}
    if endpoints:
        over["endpoints"] = LcList(endpoints)
    return haproxy(agent(redis=redis, **over).address)


def one_item(text):
    items = parse_sf_list(text)
    assert len(items) == 1, text
    return items[0]


def policies(r):
    return dict(parse_sf_list(r.h("RateLimit-Policy")))


def test_burst_bucket_is_reported_before_a_large_quota(redis, agent, haproxy):
    """Tier = a 10/min bucket of 20 + 10,000/day. The bucket runs out first, so every
    answer describes it (by tokens relative to the quota the day limit, 9,999 of 10,000,
    would look emptier than the bucket's 19 of 10), and r never exceeds the burst the
    policy announces."""
    gw = gateway(redis, agent, haproxy, {
        "bucket": BURSTY,
        "day": {"algorithm": "fixed_window", "rate": 10000, "period": "1d"}})
    for i in range(20):
        r = gw.request("/", api_key="hd-key")
        assert r.status == 200 and r.h("X-RateLimit-Degraded") is None, r
        pol = policies(r)
        assert pol == {"bucket": {"q": 10, "w": 60, "rl-burst": 20},
                       "day": {"q": 10000, "w": 86400}}, r
        name, p = one_item(r.h("RateLimit"))
        assert name == "bucket" and set(p) == {"r", "t"}, r
        assert p["r"] == 19 - i and p["r"] <= pol["bucket"]["rl-burst"], r
        # full again after (20 - r) tokens at one per 6 s
        assert (20 - p["r"]) * 6 - 1 <= p["t"] <= (20 - p["r"]) * 6, r
        # the legacy trio describes the same bucket: Remaining never above Limit
        assert r.h("RateLimit-Limit") == "20", r
        assert r.h("RateLimit-Remaining") == str(p["r"]), r
        assert r.h("RateLimit-Reset") == str(p["t"]), r
    r = gw.request("/", api_key="hd-key")
    assert r.status == 429, r
    assert json.loads(r.body)["violated-policies"] == ["bucket"], r
    name, p = one_item(r.h("RateLimit"))
    assert (name, p["r"]) == ("bucket", 0), r
    assert 1 <= p["t"] == int(r.h("Retry-After")) <= 6, r


def test_small_quota_is_reported_when_it_runs_out_first(redis, agent, haproxy):
    """The same bucket with 5 per day: the day limit admits fewer requests, so it is the
    one described from the first answer on, and the one the 429 names."""
    gw = gateway(redis, agent, haproxy, {
        "bucket": BURSTY,
        "day": {"algorithm": "fixed_window", "rate": 5, "period": "1d"}})
    for i in range(5):
        r = gw.request("/", api_key="hd-day")
        assert r.status == 200, r
        name, p = one_item(r.h("RateLimit"))
        assert (name, p["r"]) == ("day", 4 - i), r
        assert (r.h("RateLimit-Limit"), r.h("RateLimit-Remaining")) == ("5", str(4 - i)), r
    r = gw.request("/", api_key="hd-day")
    assert r.status == 429 and json.loads(r.body)["violated-policies"] == ["day"], r
    assert one_item(r.h("RateLimit"))[0] == "day", r


def test_closest_counts_requests_of_this_cost(redis, agent, haproxy):
    """An endpoint costing 10 tokens of `minute` and 1 of `day`: with 40 tokens of minute
    left (4 such requests) and 20 of day (20 requests), minute runs out first and is the
    one reported, although its r is the larger number."""
    gw = gateway(redis, agent, haproxy, {
        "minute": {"rate": 50, "period": "1m"},
        "day": {"algorithm": "fixed_window", "rate": 21, "period": "1d"}},
        endpoints=[{"name": "heavy", "path_prefix": "/heavy", "cost": 10,
                    "limit_costs": {"day": 1}}])
    r = gw.request("/heavy", api_key="hd-cost")
    assert r.status == 200, r
    name, p = one_item(r.h("RateLimit"))
    assert (name, p["r"]) == ("minute", 40), r
    # a plain request costs 1 everywhere: day, with 19 left, is now closer than minute's 39
    r = gw.request("/", api_key="hd-cost")
    assert r.status == 200, r
    name, p = one_item(r.h("RateLimit"))
    assert (name, p["r"]) == ("day", 19), r
