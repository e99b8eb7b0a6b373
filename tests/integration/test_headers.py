"""The RateLimit headers a client author reads, end to end through HAProxy
(haproxy/haproxy.cfg): which limit `RateLimit` describes when several apply, and how a
bucket that holds more than its rate shows in `RateLimit-Policy` and the legacy trio.

draft-ietf-httpapi-ratelimit-headers: `RateLimit` reports the limit closest to being
exhausted; `q`/`w` are the quota per window, and parameters the draft does not define
carry a vendor prefix (`rl-burst`)."""
import json
import time

import pytest

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


# ---------------------------------------------------------------------------------------
# Dialects (response.headers): each response read as a client of that dialect reads it.

def draft11_client(r):
    """A client of the structured fields (drafts 8 to 11): RateLimit is a list of
    "policy";r=;t= items, RateLimit-Policy of "policy";q=;w= items. Returns (limit,
    remaining, reset) of the first item, the limit from the policy it names; or None."""
    if r.h("RateLimit") is None:
        return None
    try:
        items = parse_sf_list(r.h("RateLimit"))
    except ValueError:
        return None                     # not a list of items: not for this client
    name, p = items[0]
    pol = dict(parse_sf_list(r.h("RateLimit-Policy") or ""))
    return pol[name]["q"], p["r"], p["t"]


def draft7_client(r):
    """A client of draft 7: RateLimit is one dictionary, limit=, remaining=, reset=;
    RateLimit-Policy a list of <quota>;w= items. A RateLimit it cannot read gives None:
    such clients then fall back to the legacy trio, and only when no RateLimit is there."""
    v = r.h("RateLimit")
    if v is None:
        return None
    d = {}
    for member in v.split(","):
        k, sep, val = member.strip().partition("=")
        if not sep or not val.isdigit():
            return None
        d[k] = int(val)
    if set(d) != {"limit", "remaining", "reset"}:
        return None
    for item in (r.h("RateLimit-Policy") or "").split(","):
        q, sep, w = item.strip().partition(";w=")
        assert q.isdigit() and sep and w.split(";")[0].isdigit(), r.h("RateLimit-Policy")
    return d["limit"], d["remaining"], d["reset"]


def draft6_client(r):
    """A client of the legacy trio (draft 6 and the X-RateLimit-* habit)."""
    if r.h("RateLimit-Limit") is None:
        return None
    return (int(r.h("RateLimit-Limit")), int(r.h("RateLimit-Remaining")),
            int(r.h("RateLimit-Reset")))


@pytest.mark.parametrize("dialect,readers", [
    ("structured+legacy", {"draft11": True, "draft7": False, "draft6": True}),
    ("structured", {"draft11": True, "draft7": False, "draft6": False}),
    ("draft7", {"draft11": False, "draft7": True, "draft6": False}),
    ("legacy", {"draft11": False, "draft7": False, "draft6": True}),
])
def test_header_dialects_as_their_clients_read_them(redis, agent, haproxy, dialect, readers):
    """response.headers: 5 per minute (a fixed window, so reset counts to the minute's
    end). Each kind of client reads the limit, remaining and reset the agent decided, or
    nothing it could mistake: a draft-7 client gets None from the structured RateLimit,
    and the legacy dialect sends no RateLimit to shadow the trio it falls back to."""
    a = agent(redis=redis, response={"headers": dialect},
              limits={"m": {"algorithm": "fixed_window", "rate": 5, "period": "1m"},
                      "anon": {"rate": 100, "period": "1m"}},
              tiers={"t": {"limits": ["m"]}}, default_tier="t",
              anonymous={"limits": ["anon"]})
    gw = haproxy(a.address)
    clients = {"draft11": draft11_client, "draft7": draft7_client, "draft6": draft6_client}
    for i in range(6):
        t0 = time.time()
        r = gw.request("/", api_key="dialect-" + dialect)
        left = 60 - int(t0) % 60
        assert r.status == (200 if i < 5 else 429), r
        for name, read in clients.items():
            got = read(r)
            if not readers[name]:
                assert got is None, (name, r.headers)
                continue
            assert got is not None, (name, r.headers)
            limit, remaining, reset = got
            assert (limit, remaining) == (5, max(0, 4 - i)), (name, got, r.headers)
            assert left - 1 <= reset <= left + 1, (name, got, left)
        if dialect == "legacy":
            assert r.h("RateLimit-Policy") is None, r.headers


def test_header_dialect_config_errors(tmp):
    from conftest import agent_config, check_config
    cfg = agent_config("127.0.0.1:1")
    cfg["response"] = {"headers": "draft-7"}
    r = check_config(tmp, cfg)
    assert r.returncode != 0 and "response.headers: use" in r.stderr, r.stderr
    cfg["response"] = {"headers": "draft7", "legacy_headers": True}
    r = check_config(tmp, cfg)
    assert r.returncode != 0 and "'headers' replaces 'legacy_headers'" in r.stderr, r.stderr
