"""Policy features end to end: tiers, several periods, anonymous grouping, endpoints
(cost, per-limit cost, HAProxy-sent cost, routes, per-endpoint and global limits with
refunds), shadow limits, unknown keys, tier lookup in a Redis hash, the five algorithms,
calendar-aligned fixed windows, and reloads (SIGHUP and file watch) under traffic.

Through HAProxy 2.6 (haproxy/haproxy.cfg) wherever the feature is visible over HTTP, with
the raw SPOP client where HAProxy cannot express the input (IPv6 sources, route, cost,
tier argument). Every test whose semantics do not depend on Redis runs against both
store = "redis" and store = "memory" (the `store` parameter).

State probe: a request with cost 0 only reports, so asking with a tier whose only limit is
X (`peek_X` tiers) reads X's remaining tokens for a principal without charging it.

Count-based limits use periods of a minute or more, with a token refilled every 10 s or
more wherever tokens are counted, so nothing refills mid-test; short windows (1s, 2s)
appear only where time is the subject.
"""

import datetime
import hashlib
import ipaddress
import json
import re
import signal
import threading
import time

import pytest

import spop_client as sc
from conftest import (HAPROXY_DIR, LcList, agent_config, check_config, key_principal, limit_state,
                      parse_sf_list, to_libconfig, wait_until)


# ---------------------------------------------------------------------------------------
# Set-up

@pytest.fixture(params=["redis", "memory"])
def store(request):
    return request.param


class Env:
    def __init__(self, store, redis, agent, gw):
        self.store, self.redis, self.agent, self.gw = store, redis, agent, gw

    def get(self, *a, **kw):
        return self.gw.request(*a, **kw)

    def spop(self):
        return Spop(self.agent.addr)


@pytest.fixture
def setup(request, agent, haproxy, store):
    """Factory: setup(gateway=True, tiers_map={key: tier}, haproxy_cfg=path, **agent
    overrides) -> Env with an agent on the parametrized store (Redis only when it is
    "redis"), and HAProxy in front of it when <gateway>."""
    def start(gateway=True, tiers_map=None, haproxy_cfg=None, redis_cfg=None, **over):
        with_anon(over)
        r = request.getfixturevalue("redis") if store == "redis" else None
        a = agent(redis=r, store=store, redis_cfg=redis_cfg, **over)
        gw = haproxy(a.address, tiers=tiers_map, cfg=haproxy_cfg) if gateway else None
        return Env(store, r, a, gw)
    return start


def with_anon(over):
    """Agent overrides completed against the harness defaults: given limits but no
    `anonymous`, anonymous clients get a limit of their own; given tiers but no
    `default_tier`, the first tier is the default."""
    if "limits" in over and "anonymous" not in over:
        over["limits"] = dict(over["limits"], anon_default=lim(50, "1m"))
        over["anonymous"] = {"limits": ["anon_default"]}
    if "tiers" in over and "default_tier" not in over:
        over["default_tier"] = None
    return over


def write_config(a, path=None, **over):
    """Rewrite the agent's config with top-level entries replaced (completed by
    with_anon; None removes one), to <path> if given, without a signal (the file watch)."""
    cfg = dict(a.cfg)
    for k, v in with_anon(over).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    a.cfg = cfg
    (path or a.conf_path).write_text(to_libconfig(cfg))


def reload_with(a, **over):
    """write_config, then SIGHUP."""
    write_config(a, **over)
    a.reload()


def lim(rate, period, **kw):
    return dict({"rate": rate, "period": period}, **kw)


def peek_tiers(*names):
    """Tiers `peek_<limit>` holding just that limit, for the cost-0 state probe."""
    return {"peek_" + n: {"limits": [n]} for n in names}


# ---------------------------------------------------------------------------------------
# Raw SPOP client speaking as haproxy/spoe-ratelimit.conf does

class Spop:
    def __init__(self, addr):
        self.c = sc.SpopClient(addr)
        self.c.hello()
        self.sid = 0

    def close(self):
        self.c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ask(self, key=None, ip="192.0.2.1", tier=None, method="GET", path="/", route=None,
            cost=None):
        """One rl-req message; absent variables are NULL, as HAProxy sends them."""
        self.sid += 1
        args = [("key", key), ("tier", tier), ("ip", ipaddress.ip_address(ip)),
                ("method", method), ("path", path), ("route", route),
                ("cost", sc.Int64(cost) if cost is not None else None)]
        return self.c.request(self.sid, 1, [("rl-req", args)])

    def remaining(self, limit, key=None, ip="192.0.2.1"):
        """Tokens left in <limit> for a principal, without charging (cost 0)."""
        v = self.ask(key=key, ip=ip, tier="peek_" + limit, path="/__peek", cost=0)
        assert v.get("allow") == 1 and v.get("rule") == limit, v
        return v["remaining"]


def rl_item(text):
    items = parse_sf_list(text)
    assert len(items) == 1, text
    name, p = items[0]
    assert set(p) == {"r", "t"}, text
    return name, p["r"], p["t"]


def policy_of(text):
    return [(n, p["q"], p["w"]) for n, p in parse_sf_list(text)]


def v_allowed(v, rule, remaining, policy=None):
    """An ACK that allows, decided by <rule> with <remaining> tokens left."""
    assert v.get("allow") == 1, v
    assert "degraded" not in v and "retry_after" not in v, v
    name, r, t = rl_item(v["ratelimit"])
    assert (v["rule"], name, r) == (rule, rule, remaining), v
    assert (v["remaining"], v["reset"]) == (remaining, t), v
    assert t >= 0, v
    if policy is not None:
        assert policy_of(v["policy"]) == policy, v
    return v


def v_denied(v, rule, max_retry, policy=None, remaining=0):
    """An ACK that denies, decided by <rule>, with 1 <= retry_after <= max_retry.
    <remaining>: tokens left (not 0 when the request cost more than what is left)."""
    assert v.get("allow") == 0, v
    assert "degraded" not in v, v
    name, r, t = rl_item(v["ratelimit"])
    assert (v["rule"], name, r) == (rule, rule, remaining), v
    assert 1 <= v["retry_after"] <= max_retry, v
    assert t == v["retry_after"] == v["reset"] and v["remaining"] == remaining, v
    if policy is not None:
        assert policy_of(v["policy"]) == policy, v
    return v


# ---------------------------------------------------------------------------------------
# HTTP checks (headers through the structured-field parser)

def h_allowed(r, rule, remaining, policy=None):
    assert r.status == 200 and r.body == b"ok", r
    assert r.h("X-RateLimit-Agent-Error") is None and r.h("X-RateLimit-Degraded") is None, r
    assert r.h("Retry-After") is None, r
    name, rem, t = rl_item(r.h("RateLimit"))
    assert (name, rem) == (rule, remaining), r
    assert r.h("RateLimit-Remaining") == str(remaining), r
    assert r.h("RateLimit-Reset") == str(t), r
    pol = policy_of(r.h("RateLimit-Policy"))
    assert rule in [p[0] for p in pol], r
    assert r.h("RateLimit-Limit") == str(dict((p[0], p[1]) for p in pol)[rule]), r
    if policy is not None:
        assert pol == policy, r
    return r


def h_denied(r, rule, max_retry, policy=None, remaining=0):
    assert r.status == 429, r
    assert r.h("X-RateLimit-Agent-Error") is None and r.h("X-RateLimit-Degraded") is None, r
    ra = r.h("Retry-After")
    assert ra is not None and ra.isdigit() and 1 <= int(ra) <= max_retry, r
    assert r.h("Content-Type").startswith("application/problem+json"), r
    body = json.loads(r.body)
    assert body["status"] == 429 and body["violated-policies"] == [rule], body
    assert body["retry_after"] == int(ra), body
    name, rem, t = rl_item(r.h("RateLimit"))
    assert (name, rem, t) == (rule, remaining, int(ra)), r
    assert r.h("RateLimit-Remaining") == str(remaining), r
    if policy is not None:
        assert policy_of(r.h("RateLimit-Policy")) == policy, r
    return int(ra)


def gw_log_lines(gw, marker):
    """{N: {rl_* fields}} from the HAProxy log lines of requests whose URI holds
    `<marker>=N`. Keyed by N: HAProxy logs a request when its stream ends, so a 429 may
    be logged after the next request."""
    out = {}
    for line in gw.proc.log_text().splitlines():
        m = re.search(r'"[A-Z]+ \S*[?&]%s=(\d+)[ &]' % re.escape(marker), line)
        if m and "rl_allow=" in line:
            out[int(m.group(1))] = dict(re.findall(r"(rl_\w+)=(\S*)", line))
    return out


def wait_log(gw, marker, n):
    """The rl_* fields of requests <marker>=0 .. n-1, in that order."""
    lines = wait_until(lambda: (lambda x: x if len(x) >= n else None)(gw_log_lines(gw, marker)),
                       5, 0.05, "%d HAProxy log lines for %r" % (n, marker))
    return [lines[i] for i in range(n)]


def digest32(key):
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def layout2_entries(cmd, principal, prefix="rl"):
    """The entries of <principal>'s key in key layout 2 ("<prefix>:v2:{<principal>}",
    "|<field>=<state>" each): {field: state}, {} when there is no such key."""
    v = cmd("GET", "%s:v2:{%s}" % (prefix, principal))
    out = {}
    for e in (v.split("|")[1:] if v else []):
        field, _, state = e.partition("=")
        out[field] = state
    return out


# ---------------------------------------------------------------------------------------
# Harness self-check: endpoints need a libconfig list of groups

def test_libconfig_list_rendering(agent_bin, tmp):
    text = to_libconfig({"e": LcList([{"a": 1}, {"b": [1, 2]}]), "f": ("x", "y")})
    assert text == 'e = ( {\n  a = 1;\n}, {\n  b = [ 1, 2 ];\n} );\nf = [ "x", "y" ];\n'
    import subprocess
    from conftest import agent_config
    cfg = agent_config("127.0.0.1:1", None, store="memory", endpoints=LcList([
        {"name": "a", "path_prefix": "/a", "methods": ["GET", "POST"], "cost": 2},
        {"name": "b", "route": "b"}]))
    p = tmp / "check.conf"
    p.write_text(to_libconfig(cfg))
    out = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0, out


_CFG_ERRORS = {
    # case: (overrides, message, text on the line the error must name)
    "tier_lookup_memory": (dict(tier_lookup={"redis_hash": "h"}),
                           'tier_lookup needs store = "redis"', "tier_lookup = {"),
    "endpoints_group": (dict(endpoints={"x": {"name": "x", "route": "r"}}),
                        "'endpoints' must be a list", "endpoints = {"),
    "endpoint_no_match": (dict(endpoints=LcList([{"name": "x"}])),
                          "endpoint 'x': needs 'route' or 'path_prefix'", "endpoints = ("),
    "endpoint_unknown_limit": (dict(endpoints=LcList([{"name": "x", "route": "r",
                                                       "global_limits": ["zz"]}])),
                               "'x' refers to unknown limit 'zz'", "endpoints = ("),
    "endpoint_twice": (dict(endpoints=LcList([{"name": "x", "route": "r"},
                                              {"name": "x", "route": "s"}])),
                       "endpoint 'x' defined twice", "}, {"),
    "algorithm": (dict(limits={"a": lim(1, "1m", algorithm="leaky")}),
                  "unknown algorithm 'leaky'", "a = {"),
    "burst_not_gcra": (dict(limits={"a": lim(1, "1m", algorithm="fixed_window", burst=3)}),
                       "'burst' applies to gcra/token_bucket only", "burst = 3;"),
    "unknown_keys": (dict(unknown_keys="deny"), "unknown_keys 'deny'", 'unknown_keys = "deny"'),
    "reload_key": (dict(reload={"watch": True, "x": 1}), "unknown setting 'x' in reload",
                   "x = 1;"),
    "period": (dict(limits={"a": lim(1, "1w")}), "'period' must be a duration", 'period = "1w"'),
}


@pytest.mark.parametrize("case", sorted(_CFG_ERRORS))
def test_config_errors_name_file_and_line(agent_bin, tmp, case):
    """`-c` on the new settings: refused, with the file and the offending line."""
    import subprocess
    from conftest import agent_config
    over, msg, needle = _CFG_ERRORS[case]
    base = dict(limits={"a": lim(1, "1m")}, tiers={"t": {"limits": ["a"]}}, default_tier=None,
                anonymous={"limits": ["a"]}, store="memory")
    text = to_libconfig(agent_config("127.0.0.1:1", None, **dict(base, **over)))
    p = tmp / "bad.conf"
    p.write_text(text)
    out = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 1, out
    assert "%s:%d: " % (p, _line_of(text, needle)) in out.stderr and msg in out.stderr, (
        out.stderr, text)


# ---------------------------------------------------------------------------------------
# Tiers and several periods

def test_two_tiers(setup):
    e = setup(limits={"t_free": lim(3, "1m"), "t_pro": lim(6, "1h")},
              tiers={"free": {"limits": ["t_free"]}, "pro": {"limits": ["t_pro"]}},
              default_tier="free", tiers_map={"tt-pro": "pro"})
    for i in range(3):
        h_allowed(e.get("/", api_key="tt-free"), "t_free", 2 - i, [("t_free", 3, 60)])
    h_denied(e.get("/", api_key="tt-free"), "t_free", 21, [("t_free", 3, 60)])
    for i in range(6):
        h_allowed(e.get("/", api_key="tt-pro"), "t_pro", 5 - i, [("t_pro", 6, 3600)])
    h_denied(e.get("/", api_key="tt-pro"), "t_pro", 601, [("t_pro", 6, 3600)])
    # the free key is still denied, a new free key is not
    h_denied(e.get("/", api_key="tt-free"), "t_free", 21)
    h_allowed(e.get("/", api_key="tt-free-2"), "t_free", 2)


def test_short_and_long_limits_both_enforced(setup):
    """A tier with a per-minute and a per-hour (resp. per-day) limit: both are enforced,
    and a request denied by one charges neither. The other limit's state is read by
    moving the key (HAProxy runtime map) to a tier holding only that limit: buckets
    belong to (principal, limit), not to tiers."""
    limits = {"m3": lim(3, "1m"), "h5": lim(5, "1h"), "m6": lim(6, "1m"), "d2": lim(2, "1d")}
    tiers = {"mh": {"limits": ["m3", "h5"]}, "h": {"limits": ["h5"]},
             "md": {"limits": ["m6", "d2"]}, "m": {"limits": ["m6"]}}
    e = setup(limits=limits, tiers=tiers, default_tier="h",
              tiers_map={"sl-a": "mh", "sl-b": "md"})
    pol_mh = [("m3", 3, 60), ("h5", 5, 3600)]
    pol_md = [("m6", 6, 60), ("d2", 2, 86400)]

    # A: the minute limit denies; the hour limit keeps what the 3 passed requests left
    for i in range(3):
        h_allowed(e.get("/", api_key="sl-a"), "m3", 2 - i, pol_mh)
    for _ in range(3):
        h_denied(e.get("/", api_key="sl-a"), "m3", 21, pol_mh)
    out = e.gw.runtime("set map %s sl-a h" % e.gw.map_path)
    assert out.strip() == "", out
    h_allowed(e.get("/", api_key="sl-a"), "h5", 1, [("h5", 5, 3600)])    # 5 - 3 - 1
    h_allowed(e.get("/", api_key="sl-a"), "h5", 0)
    h_denied(e.get("/", api_key="sl-a"), "h5", 721)

    # B: the day limit denies (retry ~ 12 h); the minute limit is not charged by that
    for i in range(2):
        h_allowed(e.get("/", api_key="sl-b"), "d2", 1 - i, pol_md)
    for _ in range(3):
        ra = h_denied(e.get("/", api_key="sl-b"), "d2", 43201, pol_md)
        assert ra >= 43199, ra
    out = e.gw.runtime("set map %s sl-b m" % e.gw.map_path)
    assert out.strip() == "", out
    h_allowed(e.get("/", api_key="sl-b"), "m6", 3, [("m6", 6, 60)])      # 6 - 2 - 1
    if e.store == "redis":
        # the Redis key: one per principal (key layout 2), named as documented, with an
        # entry per limit; written last by a decision of the minute limit alone, it
        # still lives as long as the day limit's entry needs (more than an hour)
        p = key_principal("sl-b")
        ent = layout2_entries(e.redis.cmd, p)
        assert "m6" in ent and "d2" in ent, ent
        assert e.redis.cmd("PTTL", "rl:v2:{%s}" % p) > 3600 * 1000


# ---------------------------------------------------------------------------------------
# Anonymous clients

def test_anonymous_ip_grouping(setup):
    e = setup(gateway=False, limits={"anon": lim(2, "1m"), "k": lim(5, "1m")},
              tiers={"t": {"limits": ["k"]}},
              anonymous={"limits": ["anon"], "ipv6_prefix": 64, "ipv4_prefix": 32})
    pol = [("anon", 2, 60)]
    with e.spop() as c:
        v_allowed(c.ask(ip="2001:db8::1"), "anon", 1, pol)
        v_allowed(c.ask(ip="2001:db8::2"), "anon", 0, pol)              # same /64
        v_denied(c.ask(ip="2001:db8::ffff:1"), "anon", 31, pol)
        v_allowed(c.ask(ip="2001:db8:0:1::1"), "anon", 1, pol)          # next /64
        v_allowed(c.ask(ip="2001:db9::1"), "anon", 1, pol)
        # IPv4-mapped IPv6 is the IPv4 client, per /32
        v_allowed(c.ask(ip="192.0.2.7"), "anon", 1, pol)
        v_allowed(c.ask(ip="::ffff:192.0.2.7"), "anon", 0, pol)
        v_denied(c.ask(ip="192.0.2.7"), "anon", 31)
        v_denied(c.ask(ip="::ffff:192.0.2.7"), "anon", 31)
        v_allowed(c.ask(ip="192.0.2.8"), "anon", 1, pol)                # /32: its own
        v_allowed(c.ask(ip="::ffff:192.0.2.8"), "anon", 0, pol)
        # a keyed request from a blocked address uses its key's budget
        v_allowed(c.ask(key="anon-k", ip="2001:db8::1"), "k", 4, [("k", 5, 60)])
    if e.store == "redis":
        # a key per principal (key layout 2), each holding the anonymous limit's entry
        principals = ["ip6:20010db8000000000000000000000000/64",
                      "ip6:20010db8000000010000000000000000/64",
                      "ip4:c0000207/32", "ip4:c0000208/32"]
        keys = set(e.redis.cmd("KEYS", "rl:v2:{ip*"))
        assert {"rl:v2:{%s}" % p for p in principals} <= keys, keys
        for p in principals:
            assert "anon" in layout2_entries(e.redis.cmd, p), (p, keys)


def test_anonymous_prefix_settings(setup):
    e = setup(gateway=False, limits={"anon": lim(1, "1m")}, tiers={"t": {"limits": ["anon"]}},
              anonymous={"limits": ["anon"], "ipv6_prefix": 48, "ipv4_prefix": 24})
    with e.spop() as c:
        v_allowed(c.ask(ip="2001:db8:1:2::1"), "anon", 0)
        v_denied(c.ask(ip="2001:db8:1:ffff::9"), "anon", 61)            # same /48
        v_allowed(c.ask(ip="2001:db8:2::1"), "anon", 0)
        v_allowed(c.ask(ip="198.51.100.1"), "anon", 0)
        v_denied(c.ask(ip="198.51.100.254"), "anon", 61)                # same /24
        v_denied(c.ask(ip="::ffff:198.51.100.77"), "anon", 61)
        v_allowed(c.ask(ip="198.51.101.1"), "anon", 0)


# ---------------------------------------------------------------------------------------
# Endpoints: cost, per-limit cost, HAProxy-sent cost, routes

def test_heavy_endpoint_costs_10(setup):
    e = setup(limits={"k30": lim(30, "1h")}, tiers={"t": {"limits": ["k30"]}},
              endpoints=LcList([{"name": "search", "path_prefix": "/search",
                                 "methods": ["GET"], "cost": 10}]))
    pol = [("k30", 30, 3600)]
    h_allowed(e.get("/search?q=0", api_key="he"), "k30", 20, pol)
    h_allowed(e.get("/search/deep?q=1", api_key="he"), "k30", 10, pol)
    h_allowed(e.get("/other?q=2", api_key="he"), "k30", 9, pol)          # not the endpoint
    h_allowed(e.get("/search?q=3", api_key="he", method="POST"), "k30", 8, pol)  # method
    # 8 tokens left: a 10-token request is denied (and charges nothing) ...
    ra = h_denied(e.get("/search?q=4", api_key="he"), "k30", 241, pol, remaining=8)
    assert ra >= 230, ra                                # 2 tokens missing, 120 s each
    # ... while a 1-token request still passes
    h_allowed(e.get("/?q=5", api_key="he"), "k30", 7, pol)
    lines = wait_log(e.gw, "q", 6)
    assert [x["rl_endpoint"] for x in lines] == ["search", "search", "-", "-", "search", "-"]
    assert [x["rl_allow"] for x in lines] == ["1", "1", "1", "1", "0", "1"]


def test_per_limit_cost_override(setup):
    """limit_costs wins over the HAProxy cost, which wins over the endpoint cost."""
    limits = {"m": lim(60, "1h"), "h": lim(600, "1d"), "ep_m": lim(20, "1h")}
    e = setup(gateway=False, limits=limits,
              tiers=dict({"mh": {"limits": ["m", "h"]}}, **peek_tiers("m", "h")),
              default_tier="mh",
              endpoints=LcList([{"name": "exp", "path_prefix": "/exp", "cost": 10,
                                 "limit_costs": {"h": 1, "ep_m": 0}, "limits": ["ep_m"]}]))
    with e.spop() as c:
        v = c.ask(key="pc", path="/exp")
        assert v["allow"] == 1 and v["endpoint"] == "exp", v
        assert policy_of(v["policy"]) == [("m", 60, 3600), ("h", 600, 86400),
                                          ("ep_m", 20, 3600)]
        assert (c.remaining("m", key="pc"), c.remaining("h", key="pc")) == (50, 599)
        # HAProxy's cost replaces the endpoint's, not a limit's own cost
        v = c.ask(key="pc", path="/exp", cost=4)
        assert v["allow"] == 1 and v["endpoint"] == "exp", v
        assert (c.remaining("m", key="pc"), c.remaining("h", key="pc")) == (46, 598)
        # outside the endpoint: HAProxy's cost for every limit
        v_allowed(c.ask(key="pc", path="/", cost=6), "m", 40)
        assert c.remaining("h", key="pc") == 592
        # HAProxy's cost 0: m only reports, h still pays its own cost, so h is the
        # limit such requests exhaust: it is the one reported
        v = c.ask(key="pc", path="/exp", cost=0)
        assert v["allow"] == 1 and v["rule"] == "h" and v["remaining"] == 591, v
        assert c.remaining("h", key="pc") == 591
        # ep_m's own cost is 0: it only reports, so it never denies
        for _ in range(25):                    # more than ep_m's 20
            v = c.ask(key="pc2", path="/exp", cost=1)
            assert v["allow"] == 1, v
        assert c.remaining("h", key="pc2") == 575


def test_haproxy_sent_cost(setup):
    e = setup(gateway=False, limits={"k": lim(20, "1h")},
              tiers={"t": {"limits": ["k"]}},
              endpoints=LcList([{"name": "heavy", "path_prefix": "/heavy", "cost": 10}]))
    with e.spop() as c:
        v_allowed(c.ask(key="hc", cost=3), "k", 17)
        v_allowed(c.ask(key="hc"), "k", 16)                     # absent: 1
        v_allowed(c.ask(key="hc", cost=0), "k", 16)             # 0: only reports
        v_allowed(c.ask(key="hc", path="/heavy", cost=2), "k", 14)   # replaces 10
        v_allowed(c.ask(key="hc", path="/heavy"), "k", 4)            # endpoint's 10
        # a negative cost from the gateway is an error, never free nor a refund: it is
        # charged the maximum (1000000), so denied, charging nothing
        v_denied(c.ask(key="hc", cost=-5), "k", 10 ** 12, remaining=4)
        v_denied(c.ask(key="hc", cost=5), "k", 721, remaining=4)     # 4 < 5
        v_allowed(c.ask(key="hc", cost=4), "k", 0)
        # absurd costs are charged the maximum (1000000) and simply denied
        v_denied(c.ask(key="hc2", cost=10 ** 12), "k", 10 ** 12, remaining=20)
        v_allowed(c.ask(key="hc2"), "k", 19)


def test_route_matching(setup):
    e = setup(gateway=False, limits={"k": lim(100, "1h")}, tiers={"t": {"limits": ["k"]}},
              endpoints=LcList([
                  {"name": "export", "route": "export", "cost": 5},
                  {"name": "search", "path_prefix": "/search", "methods": ["GET", "HEAD"],
                   "cost": 10},
                  {"name": "admin", "route": "admin", "path_prefix": "/admin", "cost": 3}]))
    with e.spop() as c:
        def ep(**kw):
            v = c.ask(key="rm", **kw)
            assert v["allow"] == 1, v
            return v.get("endpoint"), v["remaining"]
        assert ep(route="export", path="/anything") == ("export", 95)
        assert ep(route="export", path="/search") == ("export", 90)   # first match wins
        assert ep(path="/export") == (None, 89)           # a route-only endpoint: by route
        assert ep(route="nope", path="/search/x") == ("search", 79)  # unknown route: path
        assert ep(path="/search", method="HEAD") == ("search", 69)
        assert ep(path="/search", method="POST") == (None, 68)
        assert ep(path="/admin/users", method="DELETE") == ("admin", 65)  # no methods: any
        assert ep(route="admin", path="/") == ("admin", 62)
        assert ep(route="export", path="/", cost=1) == ("export", 61)    # cost still wins


def _cfg_with_route_and_cost(tmp):
    """haproxy/haproxy.cfg with its two commented example lines enabled: route "export"
    for /v1/export and cost 10 for /v1/search."""
    text = (HAPROXY_DIR / "haproxy.cfg").read_text()
    new = text
    for var in ("txn.rl_route", "txn.rl_cost"):
        new = new.replace("#   http-request set-var(%s)" % var, "http-request set-var(%s)" % var)
    assert new.count("http-request set-var(txn.rl_route) str(export)") == 1
    assert new.count("http-request set-var(txn.rl_cost) int(10)") == 1
    p = tmp / "haproxy-route-cost.cfg"
    p.write_text(new)
    return p


def test_route_and_cost_through_haproxy(setup, tmp):
    """HAProxy sends route and cost when the configuration sets txn.rl_route/rl_cost."""
    e = setup(haproxy_cfg=_cfg_with_route_and_cost(tmp),
              limits={"k": lim(100, "1h")}, tiers={"t": {"limits": ["k"]}},
              endpoints=LcList([{"name": "export", "route": "export", "cost": 5},
                                {"name": "search", "path_prefix": "/v1/search", "cost": 2}]))
    h_allowed(e.get("/v1/export/all?m=0", api_key="rc"), "k", 95)
    h_allowed(e.get("/v1/search?m=1", api_key="rc"), "k", 85)          # HAProxy's 10, not 2
    h_allowed(e.get("/v1/other?m=2", api_key="rc"), "k", 84)
    lines = wait_log(e.gw, "m", 3)
    assert [x["rl_endpoint"] for x in lines] == ["export", "search", "-"]


# ---------------------------------------------------------------------------------------
# Per-endpoint and global limits, refunds

def test_global_endpoint_limit_and_refunds(setup):
    """`global_limits` are one budget for every client of the endpoint; a request denied
    on one side (own or global) leaves the other side uncharged (refund)."""
    limits = {"k": lim(100, "1h"), "per_key": lim(3, "1h"), "glob": lim(5, "1h")}
    ep = {"name": "report", "path_prefix": "/report", "limits": ["per_key"],
          "global_limits": ["glob"]}
    e = setup(limits=limits, tiers={"t": {"limits": ["k"]}}, endpoints=LcList([ep]))
    pol = [("k", 100, 3600), ("per_key", 3, 3600), ("glob", 5, 3600)]
    # A: 3 pass (global 5 -> 2), then A's own limit denies: global must not be charged
    for i in range(3):
        h_allowed(e.get("/report", api_key="gl-a"), "per_key", 2 - i, pol)
    for _ in range(3):
        h_denied(e.get("/report", api_key="gl-a"), "per_key", 1201, pol)
    # B: gets exactly the 2 global tokens A left, then the global limit denies
    h_allowed(e.get("/report", api_key="gl-b"), "glob", 1, pol)
    h_allowed(e.get("/report", api_key="gl-b"), "glob", 0, pol)
    for _ in range(3):
        h_denied(e.get("/report", api_key="gl-b"), "glob", 721, pol)
    # C: a fresh key is denied by the shared budget too; other paths are not affected
    h_denied(e.get("/report", api_key="gl-c"), "glob", 721, pol)
    h_allowed(e.get("/", api_key="gl-c"), "k", 99, [("k", 100, 3600)])
    h_allowed(e.get("/", api_key="gl-b"), "k", 97, [("k", 100, 3600)])  # 2 passed, not 5
    if e.store == "redis":
        assert limit_state(e.redis.cmd, "g:report", "glob") is not None
        assert limit_state(e.redis.cmd, key_principal("gl-b"), "per_key@report") is not None
    # B's own limit was refunded after each global denial: without the global limit
    # B has exactly 3 - 2 = 1 left
    reload_with(e.agent, endpoints=LcList([dict(ep, global_limits=[])]))
    pol2 = [("k", 100, 3600), ("per_key", 3, 3600)]
    wait_until(lambda: policy_of(e.get("/report", api_key="gl-probe").h("RateLimit-Policy"))
               == pol2, 5, 0.05, "reloaded endpoint")
    h_allowed(e.get("/report", api_key="gl-b"), "per_key", 0, pol2)
    h_denied(e.get("/report", api_key="gl-b"), "per_key", 1201, pol2)


def test_refund_redis_state(redis, agent):
    """Redis specifically: after a split denial (the global script allowed and charged,
    the principal's denied) the global limit's state (its entry in principal g:g's key)
    is back to what it was before."""
    a = agent(redis=redis, **with_anon(dict(
        limits={"own": lim(1, "1h"), "glob": lim(10, "1h")}, tiers={"t": {"limits": ["own"]}},
        endpoints=LcList([{"name": "g", "path_prefix": "/g", "global_limits": ["glob"]}]))))
    e = Env("redis", redis, a, None)
    with e.spop() as c:
        v_allowed(c.ask(key="rs", path="/g"), "own", 0)

        def glob():
            return int(limit_state(e.redis.cmd, "g:g", "glob"))
        before = glob()
        for _ in range(3):
            v_denied(c.ask(key="rs", path="/g"), "own", 3601)
        # TAT: charged +360 s, then refunded -360 s. The refund is a separate command
        # that may reach Redis just after the ACK: poll briefly. (The agent's own next
        # decision is queued behind it on the same connection.)
        wait_until(lambda: glob() == before, 2, 0.02,
                   "global TAT back to %d" % before)
        v_allowed(c.ask(key="rs2", path="/g"), "own", 0)
        assert glob() == before + 360 * 10 ** 6


# ---------------------------------------------------------------------------------------
# Shadow limits

def test_shadow_limit(setup):
    e = setup(limits={"enf": lim(5, "1m"), "shad": lim(2, "1m", shadow=True)},
              tiers={"t": {"limits": ["enf", "shad"]}})
    pol = [("enf", 5, 60)]                          # shadow limits are not advertised
    for i in range(5):
        h_allowed(e.get("/?s=%d" % i, api_key="sh"), "enf", 4 - i, pol)
    h_denied(e.get("/?s=5", api_key="sh"), "enf", 13, pol)
    lines = wait_log(e.gw, "s", 6)
    assert [x["rl_shadow"] for x in lines] == ["-", "-", "shad", "shad", "shad", "shad"]
    assert [x["rl_rule"] for x in lines] == ["enf"] * 6
    with e.spop() as c:
        v = v_allowed(c.ask(key="sh2", tier="t"), "enf", 4, pol)
        assert "shadow" not in v
        v_allowed(c.ask(key="sh2"), "enf", 3)
        v = v_allowed(c.ask(key="sh2"), "enf", 2)
        assert v["shadow"] == "shad", v


def test_shadow_only_tier(setup):
    """A tier whose limits are all in shadow mode: never denies, advertises nothing."""
    e = setup(gateway=False, limits={"s1": lim(1, "1m", shadow=True), "k": lim(5, "1m")},
              tiers={"t": {"limits": ["k"]}, "obs": {"limits": ["s1"]}})
    with e.spop() as c:
        # ("done": a NULL placeholder the SPOP library adds to very short ACKs)
        v = c.ask(key="so", tier="obs")
        v.pop("done", None)
        assert v == {"allow": 1}, v
        for _ in range(3):
            v = c.ask(key="so", tier="obs")
            v.pop("done", None)
            assert v == {"allow": 1, "shadow": "s1"}, v


# ---------------------------------------------------------------------------------------
# Unknown keys

def test_unknown_keys_anonymous(setup):
    # sources 127.0.0.2/3: the harness's readiness probe may charge 127.0.0.1
    e = setup(limits={"anon": lim(2, "1m"), "pro": lim(5, "1m")},
              tiers={"pro": {"limits": ["pro"]}}, default_tier="pro",
              anonymous={"limits": ["anon"]}, unknown_keys="anonymous",
              tiers_map={"uk-known": "pro", "uk-gold": "gold"})
    pol = [("anon", 2, 60)]
    h_allowed(e.get("/", api_key="uk-1", source="127.0.0.2"), "anon", 1, pol)
    h_allowed(e.get("/", api_key="uk-2", source="127.0.0.2"), "anon", 0, pol)   # per IP
    h_denied(e.get("/", source="127.0.0.2"), "anon", 31, pol)          # keyless: same IP
    h_denied(e.get("/", api_key="uk-gold", source="127.0.0.2"), "anon", 31)   # no such tier
    h_allowed(e.get("/", api_key="uk-1", source="127.0.0.3"), "anon", 1, pol)
    h_allowed(e.get("/", api_key="uk-known", source="127.0.0.2"), "pro", 4, [("pro", 5, 60)])


def test_unknown_keys_default_tier(setup):
    e = setup(gateway=False, limits={"anon": lim(1, "1m"), "free": lim(3, "1m")},
              tiers={"free": {"limits": ["free"]}}, default_tier="free",
              anonymous={"limits": ["anon"]}, unknown_keys="default_tier")
    with e.spop() as c:
        v_allowed(c.ask(key="ud", tier="gold"), "free", 2)
        v_allowed(c.ask(key="ud"), "free", 1)
        v_allowed(c.ask(key="ud2", ip="192.0.2.50"), "free", 2)


# ---------------------------------------------------------------------------------------
# Tier lookup in a Redis hash (store redis only)

def _policy_names(r):
    return [p[0] for p in policy_of(r.h("RateLimit-Policy"))]


def test_tier_lookup_redis_hash(redis, agent, haproxy):
    a = agent(redis=redis,
              limits={"free_m": lim(3, "1m"), "pro_m": lim(100, "1m"), "anon": lim(50, "1m")},
              tiers={"free": {"limits": ["free_m"]}, "pro": {"limits": ["pro_m"]}},
              default_tier="free", anonymous={"limits": ["anon"]},
              tier_lookup={"redis_hash": "rl:tiers", "cache_ttl": "1s", "cache_size": 1024})
    s = Env("redis", redis, a, haproxy(a.address))
    rd = redis
    rd.cmd("HSET", "rl:tiers", digest32("tl-pro"), "pro")
    rd.cmd("HSET", "rl:tiers", digest32("tl-gold"), "gold")
    h_allowed(s.get("/", api_key="tl-pro"), "pro_m", 99, [("pro_m", 100, 60)])
    h_allowed(s.get("/", api_key="tl-none"), "free_m", 2, [("free_m", 3, 60)])
    h_allowed(s.get("/", api_key="tl-gold"), "free_m", 2)               # unknown tier name

    # the cache: a change is not seen before cache_ttl, and is seen after it
    conclusive = False
    for attempt in range(3):
        key = "tl-cache-%d" % attempt
        rd.cmd("HSET", "rl:tiers", digest32(key), "pro")
        t0 = time.monotonic()
        assert _policy_names(s.get("/", api_key=key)) == ["pro_m"]      # looked up, cached
        rd.cmd("HSET", "rl:tiers", digest32(key), "free")
        r = s.get("/", api_key=key)
        if time.monotonic() - t0 < 0.9:
            assert _policy_names(r) == ["pro_m"], "cache not used: %r" % (r,)
            conclusive = True
        seen = wait_until(lambda: (lambda r: r if _policy_names(r) == ["free_m"] else None)(
            s.get("/", api_key=key)), 4, 0.1, "new tier after cache_ttl")
        assert time.monotonic() - t0 >= 1.0, "tier changed before cache_ttl elapsed"
        h_allowed(seen, "free_m", 2)
        if conclusive:
            break
    assert conclusive, "machine too slow to observe the cache within its TTL"

    # an entry removed from the hash: back to the default tier after the TTL
    rd.cmd("HDEL", "rl:tiers", digest32("tl-pro"))
    wait_until(lambda: _policy_names(s.get("/", api_key="tl-pro")) == ["free_m"], 4, 0.1,
               "default tier after HDEL")


def test_tier_lookup_map_wins_and_unknown_anonymous(redis, agent, haproxy):
    a = agent(redis=redis,
              limits={"free_m": lim(3, "1m"), "pro_m": lim(100, "1m"), "anon": lim(2, "1m")},
              tiers={"free": {"limits": ["free_m"]}, "pro": {"limits": ["pro_m"]}},
              default_tier="free", anonymous={"limits": ["anon"]}, unknown_keys="anonymous",
              tier_lookup={"redis_hash": "rl:tiers", "cache_ttl": "30s"})
    gw = haproxy(a.address, tiers={"tlm-free": "free"})
    redis.cmd("HSET", "rl:tiers", digest32("tlm-free"), "pro")
    redis.cmd("HSET", "rl:tiers", digest32("tlm-pro"), "pro")
    # a tier sent by HAProxy is used as is: no lookup
    h_allowed(gw.request("/", api_key="tlm-free", source="127.0.0.2"), "free_m", 2)
    h_allowed(gw.request("/", api_key="tlm-pro", source="127.0.0.2"), "pro_m", 99)
    # not in the hash: anonymous, per IP (shared with keyless requests from there)
    h_allowed(gw.request("/", api_key="tlm-x", source="127.0.0.2"), "anon", 1)
    h_allowed(gw.request("/", source="127.0.0.2"), "anon", 0)
    h_denied(gw.request("/", api_key="tlm-y", source="127.0.0.2"), "anon", 31)


def test_reload_dropping_tier_lookup_with_lookup_in_flight(redis, agent):
    """A reload that removes tier_lookup while an HGET is in flight: the late answer
    must not touch the (now absent) tier cache."""
    limits = {"free_m": lim(3, "1m"), "pro_m": lim(100, "1m")}
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 4000}, **with_anon(dict(
              limits=limits, default_tier="free",
              tiers={"free": {"limits": ["free_m"]}, "pro": {"limits": ["pro_m"]}},
              tier_lookup={"redis_hash": "rl:tiers", "cache_ttl": "30s"})))
    redis.cmd("HSET", "rl:tiers", digest32("inflight"), "pro")
    with Spop(a.addr) as c:
        redis.proc.signal(signal.SIGSTOP)
        try:
            c.c.send(sc.notify(1, 1, [("rl-req", [("key", "inflight"),
                                                  ("ip", ipaddress.ip_address("192.0.2.1"))])]))
            time.sleep(0.2)                               # the HGET is on its way
            before = a.proc.log_text().count("reload (SIGHUP) ok")
            reload_with(a, tier_lookup=None)
            wait_until(lambda: a.proc.log_text().count("reload (SIGHUP) ok") > before, 5,
                       0.05, "reload")
        finally:
            redis.proc.signal(signal.SIGCONT)
        f = c.c.recv_frame(5)
        time.sleep(0.2)
        alive = a.alive()
        if not alive:
            a.proc.expect_exit_zero = False       # reported by the assertion below
        assert alive, "agent died (exit %r) when the HGET answer arrived after the reload" % (
            a.proc.returncode(),)
        assert f is not None and f.type == sc.T_ACK, f
        v = sc.ack_vars(f.payload)
        # "pro" came from the hash: the decision looked the tier up across the reload
        # (decided with the new rules, it would have had the default tier, free)
        assert v["allow"] == 1 and v["rule"] == "pro_m", v


# ---------------------------------------------------------------------------------------
# Algorithms, calendar-aligned fixed windows

_ALGS = {"gcra": 21, "token_bucket": 21, "fixed_window": 61, "sliding_log": 61,
         "sliding_window": 121}     # algorithm: largest Retry-After for 3 per minute


def test_algorithms_count(setup):
    """Each algorithm, 3 per minute: 3 pass, then denied with a sane Retry-After; a cost
    above the limit is denied and charges nothing."""
    e = setup(gateway=False, limits={a: lim(3, "1m", algorithm=a) for a in _ALGS},
              tiers={a: {"limits": [a]} for a in _ALGS})
    with e.spop() as c:
        for alg, max_retry in _ALGS.items():
            pol = [(alg, 3, 60)]
            for i in range(3):
                v_allowed(c.ask(key="alg", tier=alg), alg, 2 - i, pol)
            for _ in range(2):
                v_denied(c.ask(key="alg", tier=alg), alg, max_retry, pol)
            v_denied(c.ask(key="alg2", tier=alg, cost=4), alg, max_retry, remaining=3)
            v_allowed(c.ask(key="alg2", tier=alg, cost=3), alg, 0)


def test_gcra_burst(setup):
    e = setup(gateway=False, limits={"b": lim(6, "1m", burst=2)}, tiers={"t": {"limits": ["b"]}})
    with e.spop() as c:
        v_allowed(c.ask(key="bu"), "b", 1, [("b", 6, 60)])
        v_allowed(c.ask(key="bu"), "b", 0)
        v_denied(c.ask(key="bu"), "b", 11)               # one token every 10 s


def test_fixed_window_calendar_alignment(setup):
    """Fixed windows start on the Unix epoch: a 1d window resets at 00:00 UTC, 1h on the
    hour, 1m on the minute. Read from the reset time the agent reports."""
    limits = {"fd": lim(2, "1d", algorithm="fixed_window"),
              "fh": lim(2, "1h", algorithm="fixed_window"),
              "fm": lim(2, "1m", algorithm="fixed_window")}
    e = setup(gateway=False, limits=limits, tiers=peek_tiers("fd", "fh", "fm"))
    with e.spop() as c:
        for name, w in (("fd", 86400), ("fh", 3600), ("fm", 60)):
            for attempt in range(3):
                key = "fw-%s-%d" % (name, attempt)
                t0 = time.time()
                v1 = c.ask(key=key, tier="peek_" + name)
                c.ask(key=key, tier="peek_" + name)
                v3 = c.ask(key=key, tier="peek_" + name)
                t1 = time.time()
                if int(t0 // w) == int(t1 // w):
                    break                                # all three in one window
            lo, hi = w - (t1 % w), w - (t0 % w)          # seconds to the next boundary
            v_allowed(v1, name, 1)
            assert lo - 1 <= v1["reset"] <= hi + 1, (name, v1, lo, hi)
            v_denied(v3, name, w)
            assert lo - 1 <= v3["retry_after"] <= hi + 1, (name, v3, lo, hi)


def next_month_start(t):
    """The Unix time of 00:00 UTC on the 1st of the month after the one holding <t>."""
    d = datetime.datetime.fromtimestamp(int(t), datetime.timezone.utc)
    y, m = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return datetime.datetime(y, m, 1, tzinfo=datetime.timezone.utc).timestamp()


def test_fixed_window_calendar_month(setup):
    """period "1mo": a fixed window from 00:00 UTC on the 1st to the next 1st, whatever the
    month's length: Reset and Retry-After count to the next 1st, the policy's w is the mean
    Gregorian month (2,629,746 s), and the count lives in the month's window."""
    e = setup(gateway=False, limits={"mo": lim(2, "1mo", algorithm="fixed_window")},
              tiers=peek_tiers("mo"))
    with e.spop() as c:
        t0 = time.time()
        v1 = c.ask(key="month", tier="peek_mo")
        c.ask(key="month", tier="peek_mo")
        v3 = c.ask(key="month", tier="peek_mo")
        t1 = time.time()
    lo, hi = next_month_start(t1) - t1, next_month_start(t0) - t0
    v_allowed(v1, "mo", 1, [("mo", 2, 2629746)])
    assert lo - 1 <= v1["reset"] <= hi + 1, (v1, lo, hi)
    v_denied(v3, "mo", 31 * 86400)
    assert lo - 1 <= v3["retry_after"] <= hi + 1, (v3, lo, hi)


def test_calendar_month_is_for_fixed_window_only(tmp):
    for alg in ("gcra", "sliding_window", "sliding_log"):
        cfg = agent_config("127.0.0.1:1", limits={"m": lim(10, "1mo", algorithm=alg)},
                           tiers={"free": {"limits": ["m"]}})
        r = check_config(tmp, cfg)
        assert r.returncode != 0, (alg, r.stdout, r.stderr)
        assert "\"1mo\" (a calendar month) is for fixed_window only" in r.stderr, r.stderr
    for bad in ("2mo", "1month", "0mo"):
        cfg = agent_config("127.0.0.1:1", limits={"m": lim(10, bad, algorithm="fixed_window")},
                           tiers={"free": {"limits": ["m"]}})
        r = check_config(tmp, cfg)
        assert r.returncode != 0 and "or \"1mo\" (a calendar month)" in r.stderr, r.stderr


def _sleep_to_fresh_second(margin=0.03):
    now = time.time()
    time.sleep(1 - (now % 1) + margin)


def test_fixed_window_boundary_per_second(setup):
    """fixed_window 2 per 1s through HAProxy: 2 pass, the 3rd is denied with a retry of
    at most 1 s, and right after the calendar second ends requests pass again."""
    e = setup(limits={"fs": lim(2, "1s", algorithm="fixed_window")},
              tiers={"t": {"limits": ["fs"]}})
    pol = [("fs", 2, 1)]
    for attempt in range(4):
        key = "fsb-%d" % attempt
        _sleep_to_fresh_second()
        t0 = time.time()
        r1, r2, r3 = (e.get("/", api_key=key) for _ in range(3))
        t1 = time.time()
        if int(t0) != int(t1):
            continue                                      # crossed a boundary: again
        h_allowed(r1, "fs", 1, pol)
        assert rl_item(r1.h("RateLimit"))[2] == 1         # resets within the second
        h_allowed(r2, "fs", 0, pol)
        assert h_denied(r3, "fs", 1, pol) == 1
        # still the same second: denied
        t2 = time.time()
        r4 = e.get("/", api_key=key)
        if int(t2) == int(time.time()) == int(t0):
            h_denied(r4, "fs", 1)
        # the next calendar second: a fresh window
        _sleep_to_fresh_second()
        t3 = time.time()
        h_allowed(e.get("/", api_key=key), "fs", 1, pol)
        r6 = e.get("/", api_key=key)
        h_allowed(r6, "fs", 0 if int(t3) == int(time.time()) else 1, pol)
        return
    pytest.fail("could not fit 3 requests into one calendar second in 4 attempts")


def test_sliding_window_retry_after_is_tight(setup):
    """sliding_window: the Retry-After it reports is not later than when the request
    actually passes again by more than a second (the rounding), at any point of the
    window where the limit is reached."""
    e = setup(gateway=False, limits={"sw": lim(3, "2s", algorithm="sliding_window")},
              tiers={"t": {"limits": ["sw"]}})
    with e.spop() as c:
        for attempt in range(4):
            key = "swr-%d" % attempt
            if time.time() % 2 > 1.9:                   # too close to the window's end
                time.sleep(0.15)
            t0 = time.time()
            vs = [c.ask(key=key) for _ in range(3)]
            t_deny = time.time()
            vs.append(c.ask(key=key))
            if int(t0 // 2) != int(time.time() // 2):
                continue
            assert [v["allow"] for v in vs] == [1, 1, 1, 0], vs
            retry = vs[3]["retry_after"]
            # measure when it really passes again (polling every 50 ms, bounded)
            deadline = t0 + 5                   # a denied request charges nothing
            while time.time() < deadline and c.ask(key=key)["allow"] != 1:
                time.sleep(0.05)
            waited = time.time() - t_deny
            # Retry-After is rounded up to whole seconds: the request passes within the
            # second before it. Not later (understated; 1 s slack for the polling) ...
            assert waited <= retry + 1, (
                "Retry-After %d s but the request passed only after %.2f s" % (retry, waited))
            # ... and not earlier (overstated)
            assert retry <= waited + 1.05, (
                "Retry-After %d s but the request passed again after %.2f s" % (retry, waited))
            return
    pytest.fail("could not start in a fresh window")


# ---------------------------------------------------------------------------------------
# Reload: SIGHUP and file watch under traffic, broken files

class Traffic:
    """Worker threads sending HTTP requests through the gateway until stopped (bounded),
    recording anything that is not a clean decision."""

    def __init__(self, gw, nthreads=2, max_requests=3000):
        self.gw = gw
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.count = 0
        self.failures = []
        self.policies = set()
        self.threads = [threading.Thread(target=self.run, args=(t, max_requests), daemon=True)
                        for t in range(nthreads)]
        for t in self.threads:
            t.start()

    def run(self, tid, max_requests):
        for i in range(max_requests):
            if self.stop_ev.is_set():
                return
            try:
                r = self.gw.request("/", api_key="traffic-%d-%d" % (tid, i % 7), timeout=5)
                bad = (r.status not in (200, 429) or r.h("X-RateLimit-Agent-Error") is not None
                       or r.h("X-RateLimit-Degraded") is not None
                       or r.h("RateLimit-Policy") is None)
                pol = r.h("RateLimit-Policy")
            except Exception as exc:   # noqa: BLE001 - any failure is recorded
                bad, r, pol = True, repr(exc), None
            with self.lock:
                self.count += 1
                if bad:
                    self.failures.append(r)
                if pol:
                    self.policies.add(pol)

    def wait_count(self, n, timeout=10):
        wait_until(lambda: self.count >= n, timeout, 0.02, "%d requests of traffic" % n)

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)
        assert not any(t.is_alive() for t in self.threads)


def _q_of(r, rule):
    return dict((p[0], p[1]) for p in policy_of(r.h("RateLimit-Policy"))).get(rule)


def test_live_reload_under_traffic(setup):
    e = setup(limits={"live": lim(1000, "1h")}, tiers={"t": {"limits": ["live"]}},
              reload={"watch": True})
    a = e.agent
    traffic = Traffic(e.gw)
    try:
        traffic.wait_count(30)
        # 1. SIGHUP
        reload_with(a, limits={"live": lim(3, "1h")})
        n = [0]

        def q_is(q):
            n[0] += 1
            return _q_of(e.get("/", api_key="probe-%d" % n[0]), "live") == q
        wait_until(lambda: q_is(3), 5, 0.05, "limit 3 after SIGHUP")
        mark = traffic.count
        traffic.wait_count(mark + 30)
        # 2. file watch: rewrite the file, no signal (same size, soon after the last write)
        write_config(a, limits={"live": lim(4, "1h")})
        wait_until(lambda: q_is(4), 5, 0.1, "limit 4 after the file changed")
        # 3. file watch, atomic replacement (write + rename, as deployment tools do)
        mark = traffic.count
        traffic.wait_count(mark + 30)
        tmpf = a.conf_path.with_suffix(".new")
        write_config(a, path=tmpf, limits={"live": lim(2, "1h")})
        tmpf.rename(a.conf_path)
        wait_until(lambda: q_is(2), 5, 0.1, "limit 2 after the file was replaced")
        mark = traffic.count
        traffic.wait_count(mark + 30)
    finally:
        traffic.stop()
    assert traffic.failures == [], traffic.failures[:5]
    qs = {_q_of_text(p) for p in traffic.policies}
    assert {1000, 3, 4, 2} <= qs, qs
    # the new limit takes effect for counting
    for i in range(2):
        h_allowed(e.get("/", api_key="after-reload"), "live", 1 - i, [("live", 2, 3600)])
    h_denied(e.get("/", api_key="after-reload"), "live", 1801)
    assert a.alive()
    log = a.proc.log_text()
    assert "reload (SIGHUP) ok" in log and "reload (file changed) ok" in log, log[-3000:]


def _q_of_text(text):
    return policy_of(text)[0][1]


def test_watch_same_size_edits_within_a_second(agent, tmp):
    """Edits written in place, each once the previous one is applied, all within one
    second; the last two keep the file's size. Every one must be applied."""
    a = agent(store="memory", **with_anon(dict(
        limits={"w": lim(3, "1h")}, tiers={"t": {"limits": ["w"]}}, reload={"watch": True})))

    def put(rate):                      # one write(2), no intermediate truncated state
        a.cfg = dict(a.cfg, limits=dict(a.cfg["limits"], w=lim(rate, "1h")))
        data = to_libconfig(a.cfg).encode()
        with open(a.conf_path, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
    n = [0]
    with Spop(a.addr) as c:
        def q():
            n[0] += 1
            return policy_of(c.ask(key="ws-%d" % n[0])["policy"])[0][1]
        assert q() == 3
        for attempt in range(3):
            _sleep_to_fresh_second(0.01)
            t0 = time.time()
            # 3 -> 100 changes the size, 100 -> 101 keeps it
            for rate in (100 + 10 * attempt, 101 + 10 * attempt):
                put(rate)
                wait_until(lambda: q() == rate, 3, 0.01, "rate %d applied" % rate)
            if time.time() - t0 < 0.55:
                break
        else:
            pytest.skip("too slow to apply two edits within half a second")
        put(rate + 1)                                       # same size, same second
        if int(time.time()) != int(t0):
            pytest.skip("the 3rd edit fell into the next second")
        wait_until(lambda: q() == rate + 1, 2, 0.02,
                   "rate %d (the 3rd edit within one second) applied" % (rate + 1))


def _line_of(text, needle):
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_broken_reload_keeps_old_limits(setup):
    e = setup(limits={"kb": lim(5, "1m")}, tiers={"t": {"limits": ["kb"]}},
              reload={"watch": True})
    a = e.agent
    pol = [("kb", 5, 60)]
    for i in range(2):
        h_allowed(e.get("/", api_key="br"), "kb", 4 - i, pol)
    good = a.conf_path.read_text()
    errors = lambda: a.proc.log_text().count("%s:" % a.conf_path)   # noqa: E731

    # SIGHUP with an invalid value: error with file:line, old rules stay
    bad1 = good.replace("rate = 5;", "rate = 0;")
    a.reload(text=bad1)
    wait_until(lambda: errors() >= 1, 5, 0.05, "reload error logged")
    assert "%s:%d:" % (a.conf_path, _line_of(bad1, "rate = 0;")) in a.proc.log_text()
    h_allowed(e.get("/", api_key="br"), "kb", 2, pol)

    # file watch with a syntax error (no signal; the size differs from bad1): the same
    bad2 = good.replace("tiers = {", "tiers = {{")
    a.conf_path.write_text(bad2)
    where2 = "%s:%d:" % (a.conf_path, _line_of(bad2, "tiers = {{"))
    assert where2 not in a.proc.log_text()
    wait_until(lambda: where2 in a.proc.log_text(), 5, 0.05, "watch reload error logged")
    assert "reload (file changed) failed" in a.proc.log_text()
    h_allowed(e.get("/", api_key="br"), "kb", 1, pol)
    # an unknown limit referenced by a tier
    bad3 = good.replace('limits = [ "kb" ]', 'limits = [ "kb", "nope" ]')
    assert bad3 != good
    a.reload(text=bad3)
    wait_until(lambda: "unknown limit 'nope'" in a.proc.log_text(), 5, 0.05,
               "3rd reload error logged")
    h_allowed(e.get("/", api_key="br"), "kb", 0, pol)
    h_denied(e.get("/", api_key="br"), "kb", 13, pol)
    assert a.alive()

    # a good file again: applied; kb's bucket keeps its state across the reload
    reload_with(a, limits={"kb": lim(5, "1m"), "kb2": lim(7, "1m")},
                tiers={"t": {"limits": ["kb", "kb2"]}})
    pol2 = [("kb", 5, 60), ("kb2", 7, 60)]
    wait_until(lambda: policy_of(e.get("/", api_key="br-probe").h("RateLimit-Policy")) == pol2,
               5, 0.05, "good reload")
    h_denied(e.get("/", api_key="br"), "kb", 13, pol2)
