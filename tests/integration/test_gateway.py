"""End to end: client -> HAProxy (haproxy/haproxy.cfg) -> agent -> Redis, upstream
haproxy/upstream.cfg. Limits: key_rpm 5/min + key_day 1000/day (free, the default tier),
pro_rpm 10/min (pro), anon_rpm 3/min per IP."""
import json

from conftest import parse_sf_list


def check_allowed(r, rule, q, w, remaining):
    assert r.status == 200, r
    assert r.body == b"ok"
    assert r.h("X-RateLimit-Agent-Error") is None, r
    assert r.h("X-RateLimit-Degraded") is None, r
    assert r.h("Retry-After") is None
    policy = parse_sf_list(r.h("RateLimit-Policy"))
    assert (rule, {"q": q, "w": w}) in policy, policy
    rl = dict(parse_sf_list(r.h("RateLimit")))
    assert rule in rl, rl
    assert rl[rule]["r"] == remaining, (rl, remaining)
    assert 0 <= rl[rule]["t"] <= w
    assert r.h("RateLimit-Limit") == str(q)
    assert r.h("RateLimit-Remaining") == str(remaining)
    assert 0 <= int(r.h("RateLimit-Reset")) <= w


def check_denied(r, rule, q, w):
    assert r.status == 429, r
    ra = r.h("Retry-After")
    assert ra is not None and ra.isdigit(), r
    ra = int(ra)
    # one token comes back every w/q seconds
    assert 1 <= ra <= w // q + 1, (ra, r)
    assert r.h("Content-Type").startswith("application/problem+json")
    body = json.loads(r.body)
    assert body["status"] == 429 and body["violated-policies"] == [rule], body
    assert body["retry_after"] == ra
    policy = parse_sf_list(r.h("RateLimit-Policy"))
    assert (rule, {"q": q, "w": w}) in policy, policy
    rl = dict(parse_sf_list(r.h("RateLimit")))
    assert rl[rule]["r"] == 0, rl
    assert 1 <= rl[rule]["t"] <= w
    assert r.h("RateLimit-Remaining") == "0"
    assert r.h("X-RateLimit-Agent-Error") is None
    return ra


def test_key_limit(stack):
    s = stack()
    for i in range(5):
        r = s.get("/api/v1/thing", api_key="gw-free-1")
        check_allowed(r, "key_rpm", 5, 60, 4 - i)
        assert ("key_day", {"q": 1000, "w": 86400}) in parse_sf_list(r.h("RateLimit-Policy"))
    for _ in range(2):
        check_denied(s.get("/api/v1/thing", api_key="gw-free-1"), "key_rpm", 5, 60)
    # another key is untouched
    check_allowed(s.get("/", api_key="gw-free-2"), "key_rpm", 5, 60, 4)


def test_pro_tier_from_map(stack):
    s = stack(tiers={"gw-pro-1": "pro"})
    for i in range(10):
        check_allowed(s.get("/", api_key="gw-pro-1"), "pro_rpm", 10, 60, 9 - i)
    check_denied(s.get("/", api_key="gw-pro-1"), "pro_rpm", 10, 60)
    # a key absent from the map gets the default (free) tier
    for i in range(5):
        check_allowed(s.get("/", api_key="gw-unmapped"), "key_rpm", 5, 60, 4 - i)
    check_denied(s.get("/", api_key="gw-unmapped"), "key_rpm", 5, 60)


def test_anonymous_per_ip(stack):
    s = stack()
    for src in ("127.0.0.2", "127.0.0.3"):
        for i in range(3):
            check_allowed(s.get("/", source=src), "anon_rpm", 3, 60, 2 - i)
        check_denied(s.get("/", source=src), "anon_rpm", 3, 60)
    # keyed traffic from a blocked address is not affected by the anonymous budget
    check_allowed(s.get("/", api_key="gw-from-blocked-ip", source="127.0.0.2"),
                  "key_rpm", 5, 60, 4)


def test_keep_alive_connection(stack):
    """Several requests on one client connection: each one is decided."""
    import http.client
    s = stack()
    conn = http.client.HTTPConnection(*s.gw.front, timeout=5)
    try:
        statuses = []
        for _ in range(6):
            conn.request("GET", "/", headers={"X-API-Key": "gw-ka"})
            r = conn.getresponse()
            r.read()
            statuses.append(r.status)
    finally:
        conn.close()
    assert statuses == [200] * 5 + [429]


def test_tier_change_at_runtime(stack):
    """The key -> tier map changes through the runtime API, without a reload."""
    s = stack(tiers={"rt-other": "free"})
    check_allowed(s.get("/", api_key="rt-key"), "key_rpm", 5, 60, 4)
    out = s.gw.runtime("add map %s rt-key pro" % s.gw.map_path)
    assert out.strip() == "", out
    check_allowed(s.get("/", api_key="rt-key"), "pro_rpm", 10, 60, 9)
    out = s.gw.runtime("del map %s rt-key" % s.gw.map_path)
    assert out.strip() == "", out
    check_allowed(s.get("/", api_key="rt-key"), "key_rpm", 5, 60, 3)
