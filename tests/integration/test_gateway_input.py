"""What a client controls at the gateway (haproxy/haproxy.cfg on the installed HAProxy):
the API key header and the path. Each spelling of a key is either limited exactly like
the plain form or refused with 400 before the agent is asked; each spelling of an
endpoint's path is charged the endpoint's cost, whether HAProxy (normalize-uri) or the
agent (normalised endpoint matching) is the one that sees through it. And the
stick-table safety net while the agent is down: it caps a busy key at RL_FALLBACK_RATE
per second instead of cutting it off, with the agent's own 429."""

import json
import socket
import time

import pytest

import spop_client as sc
from conftest import LcList, free_port, parse_sf_list, wait_until
from fake_agent import FakeAgent, txn_vars


def raw_request(addr, head, timeout=5.0):
    """Sends <head> (bytes: request line and headers, without the final blank line) on a
    fresh connection; returns (status, {lower-case name: value}, body)."""
    s = socket.create_connection(addr, timeout=timeout)
    try:
        s.sendall(head + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    head_b, _, body = data.partition(b"\r\n\r\n")
    lines = head_b.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def get(addr, key_lines, path=b"/", method=b"GET"):
    return raw_request(addr, method + b" " + path + b" HTTP/1.1\r\nHost: gw" +
                       b"".join(b"\r\n" + k for k in key_lines))


# Spellings of the key "mykey" that an application may read as "mykey" while HAProxy's
# req.hdr would read something else, or that are ambiguous: all refused with 400.
AMBIGUOUS = {
    "comma": [b"X-API-Key: mykey, junk"],
    "comma_first": [b"X-API-Key: junk,mykey"],
    "trailing_comma": [b"X-API-Key: mykey,"],
    "duplicate": [b"X-API-Key: mykey", b"X-API-Key: junk"],
    "duplicate_same": [b"X-API-Key: mykey", b"x-api-key: mykey"],
    "duplicate_empty": [b"X-API-Key: mykey", b"X-API-Key:"],
    "inner_space": [b"X-API-Key: mykey junk"],
    "inner_tab": [b"X-API-Key: mykey\tjunk"],
    "folded": [b"X-API-Key: mykey", b"\tjunk"],
    "underscore": [b"X_API_Key: junk"],
    "underscore_and_plain": [b"X-API-Key: mykey", b"X_API_KEY: junk"],
    "half_underscore": [b"X-API_Key: junk"],
}
# Spellings that are the key "mykey" for HAProxy and any HTTP parser alike.
SAME = {
    "plain": [b"X-API-Key: mykey"],
    "spaces": [b"X-API-Key:    mykey   "],
    "tabs": [b"X-API-Key:\tmykey\t"],
    "lower_name": [b"x-api-key: mykey"],
}


@pytest.fixture
def fake():
    agents = []

    def start(decide):
        a = FakeAgent(decide)
        agents.append(a)
        return a
    yield start
    for a in agents:
        a.close()


def notify_args(agent, i):
    return {n: t.value for n, t in agent.notifies[i][0][1]}


@pytest.mark.parametrize("variant", sorted(AMBIGUOUS))
def test_ambiguous_key_refused_before_the_agent(fake, haproxy, variant):
    agent = fake(lambda msgs: (txn_vars(allow=1), 0))
    gw = haproxy(agent.addr_str)
    status, h, body = get(gw.front, AMBIGUOUS[variant])
    assert status == 400, (status, h, body)
    assert h["content-type"].startswith("application/problem+json")
    assert json.loads(body)["status"] == 400
    assert agent.notifies == []
    # the same client with a plain key is asked about as usual
    assert get(gw.front, SAME["plain"])[0] == 200
    assert notify_args(agent, 0)["key"] == "mykey"


def test_key_spellings_sent_as_one_key(fake, haproxy):
    agent = fake(lambda msgs: (txn_vars(allow=1), 0))
    gw = haproxy(agent.addr_str)
    for lines in SAME.values():
        assert get(gw.front, lines)[0] == 200
    assert get(gw.front, [b"X-API-Key:"])[0] == 200           # empty: anonymous
    assert get(gw.front, [])[0] == 200
    keys = [notify_args(agent, i)["key"] for i in range(len(agent.notifies))]
    assert keys == ["mykey"] * len(SAME) + [None, None]


def test_key_smuggling_end_to_end(stack):
    """Through the real agent and Redis (key_rpm 5/min): refused spellings charge
    nothing, accepted ones share the plain key's budget."""
    s = stack()
    for name, lines in AMBIGUOUS.items():
        status, h, body = get(s.gw.front, lines)
        assert status == 400, (name, status, h, body)
    remaining = []
    for lines in [SAME["plain"], SAME["spaces"], SAME["tabs"], SAME["lower_name"],
                  SAME["plain"]]:
        status, h, _ = get(s.gw.front, lines)
        assert status == 200, (lines, h)
        remaining.append(int(h["ratelimit-remaining"]))
    assert remaining == [4, 3, 2, 1, 0]
    for lines in SAME.values():
        status, h, body = get(s.gw.front, lines)
        assert status == 429, (lines, h)
        assert json.loads(body)["violated-policies"] == ["key_rpm"]
    for name, lines in AMBIGUOUS.items():
        assert get(s.gw.front, lines)[0] == 400, name


# ---------------------------------------------------------------------------------------
# Paths

SEARCH = "/v1/search"
# (method, path): every one reaches the application's /v1/search handler
PATH_VARIANTS = [
    ("GET", "/v1//search"),
    ("GET", "//v1/search"),
    ("GET", "/v1/%73earch"),
    ("GET", "/v1/./search"),
    ("GET", "/v1/x/../search"),
    ("GET", "/v1/%2e%2E/v1/search"),
    ("GET", "/../v1/search"),
    ("GET", "/%76%31/%73%65%61%72%63%68?q=1"),
    ("GET", "/V1/search"),
    ("GET", "/v1/SEARCH"),
    ("get", "/v1/search"),
    ("Get", "//V1//%73EARCH/./"),
]


def test_haproxy_sends_normalised_path(fake, haproxy):
    """What the sample's normalize-uri rules send the agent (and the application):
    one spelling per path; case and the method are left as they are."""
    agent = fake(lambda msgs: (txn_vars(allow=1), 0))
    gw = haproxy(agent.addr_str)
    for method, path in PATH_VARIANTS:
        status, h, _ = raw_request(gw.front, b"%s %s HTTP/1.1\r\nHost: gw" %
                                   (method.encode(), path.encode()))
        assert status == 200, (method, path, h)
    sent = [(notify_args(agent, i)["method"], notify_args(agent, i)["path"])
            for i in range(len(agent.notifies))]
    assert sent == [
        ("GET", "/v1/search"), ("GET", "/v1/search"), ("GET", "/v1/search"),
        ("GET", "/v1/search"), ("GET", "/v1/search"), ("GET", "/v1/search"),
        ("GET", "/v1/search"), ("GET", "/v1/search"), ("GET", "/V1/search"),
        ("GET", "/v1/SEARCH"), ("get", "/v1/search"), ("Get", "/V1/sEARCH/"),
    ]
    # malformed escapes are refused (percent-decode-unreserved strict)
    for path in (b"/v1/%zz", b"/v1/%%73earch"):
        assert raw_request(gw.front, b"GET %s HTTP/1.1\r\nHost: gw" % path)[0] == 400, path
    assert len(agent.notifies) == len(PATH_VARIANTS)


ENDPOINT_CFG = dict(
    limits={"k": {"rate": 100, "period": "1h"}, "anon_rpm": {"rate": 3, "period": "1m"}},
    tiers={"t": {"limits": ["k"]}}, default_tier="t",
    endpoints=LcList([{"name": "search", "path_prefix": SEARCH, "methods": ["GET"],
                       "cost": 10}]))


def test_agent_matches_path_variants(agent, redis):
    """The agent alone (SPOP, no HAProxy in front): every variant is the endpoint and
    pays its cost; near misses are not."""
    a = agent(redis=redis, **ENDPOINT_CFG)
    sid = 1
    with sc.SpopClient(a.addr) as c:
        c.hello()
        for i, (method, path) in enumerate([("GET", SEARCH)] + PATH_VARIANTS):
            v = c.request(sid, 1, [sc.rl_message(key="pv%d" % i, method=method, path=path)])
            sid += 2
            assert v["allow"] == 1 and v.get("endpoint") == "search", (method, path, v)
            assert v["remaining"] == 90, (method, path, v)
        for i, (method, path) in enumerate([("POST", SEARCH), ("GET", "/v1/searc"),
                                            ("GET", "/v1%2Fsearch"),
                                            ("GET", "/v1/search/../x")]):
            v = c.request(sid, 1, [sc.rl_message(key="miss%d" % i, method=method, path=path)])
            sid += 2
            assert v["allow"] == 1 and v.get("endpoint") is None, (method, path, v)
            assert v["remaining"] == 99, (method, path, v)


@pytest.mark.parametrize("prefix,msg", [
    ("/v1/search?q", "'path_prefix' is a path: no '?' or '#'"),
    ("/v1#x", "'path_prefix' is a path: no '?' or '#'"),
    ("/" + "a" * 1024, "'path_prefix' longer than 1024 bytes"),
])
def test_path_prefix_checked(agent_bin, tmp, prefix, msg):
    """`-c`: a prefix is compared with at most 1,024 normalised bytes, never a query."""
    import subprocess
    from conftest import agent_config, to_libconfig
    cfg = agent_config("127.0.0.1:1", None, store="memory", endpoints=LcList([
        {"name": "x", "path_prefix": prefix}]))
    p = tmp / "check.conf"
    p.write_text(to_libconfig(cfg))
    out = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 1 and msg in out.stderr, out
    # the longest accepted prefix
    cfg["endpoints"] = LcList([{"name": "x", "path_prefix": "/" + "a" * 1023}])
    p.write_text(to_libconfig(cfg))
    out = subprocess.run([str(agent_bin), "-c", "-f", str(p)], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode == 0, out


def test_path_variants_end_to_end(redis, agent, haproxy):
    """Client -> HAProxy -> agent -> Redis: each variant charges the endpoint's cost (10)
    to its key, exactly like the plain path."""
    a = agent(redis=redis, **ENDPOINT_CFG)
    gw = haproxy(a.address)
    for i, (method, path) in enumerate([("GET", SEARCH)] + PATH_VARIANTS):
        key = "e2e-%d" % i
        status, h, _ = raw_request(gw.front, b"%s %s HTTP/1.1\r\nHost: gw\r\nX-API-Key: %s"
                                   % (method.encode(), path.encode(), key.encode()))
        assert status == 200, (method, path, h)
        assert h.get("ratelimit-remaining") == "90", (method, path, h)
    # a path outside the endpoint costs 1
    status, h, _ = raw_request(gw.front, b"GET /v1/other HTTP/1.1\r\nHost: gw\r\nX-API-Key: e2e-x")
    assert status == 200 and h.get("ratelimit-remaining") == "99", h


# ---------------------------------------------------------------------------------------
# The safety net while the agent is down

FALLBACK_RATE = 10


def test_safety_net_caps_instead_of_cutting_off(agent, redis, haproxy, monkeypatch):
    """RL_FALLBACK_RATE=10, the agent killed: a burst of 3x the rate admits exactly the
    rate; a key that keeps sending at twice the rate still gets requests through (the
    refused ones are not counted against it); refusals carry the agent's 429 body and
    headers, naming the policy "fallback"."""
    monkeypatch.setenv("RL_FALLBACK_RATE", str(FALLBACK_RATE))
    a = agent(redis=redis, limits={"one": {"rate": 1, "period": "1h"},
                                   "anon_rpm": {"rate": 3, "period": "1m"}},
              tiers={"t": {"limits": ["one"]}}, default_tier="t")
    gw = haproxy(a.address)
    # the agent's own 429, for comparison
    assert gw.request("/", api_key="cmp").status == 200
    agent_429 = gw.request("/", api_key="cmp")
    assert agent_429.status == 429, agent_429
    a.kill()
    wait_until(lambda: gw.request("/", api_key="probe-%d" % free_port()).h(
        "X-RateLimit-Agent-Error") not in (None, "1"), 15, 0.2, "agent marked down")

    # a burst of 3x the rate, sent as fast as one client can
    burst = [gw.request("/", api_key="net-key") for _ in range(3 * FALLBACK_RATE)]
    statuses = [r.status for r in burst]
    assert statuses[:FALLBACK_RATE] == [200] * FALLBACK_RATE, statuses
    assert set(statuses) == {200, 429}, statuses
    admitted = statuses.count(200)
    # the net's rate is a 1 s sliding estimate: a burst that happens to straddle the
    # turn of its second may admit a few more, never fewer
    assert FALLBACK_RATE <= admitted <= FALLBACK_RATE + FALLBACK_RATE // 2, statuses

    denied = [r for r in burst if r.status == 429][0]
    assert denied.h("Retry-After") == "1"
    assert denied.h("Content-Type") == agent_429.h("Content-Type")
    body, agent_body = json.loads(denied.body), json.loads(agent_429.body)
    assert sorted(body) == sorted(agent_body)
    assert body == {"type": agent_body["type"], "title": "Too Many Requests", "status": 429,
                    "violated-policies": ["fallback"], "retry_after": 1}
    assert parse_sf_list(denied.h("RateLimit-Policy")) == [
        ("fallback", {"q": FALLBACK_RATE, "w": 1})]
    assert parse_sf_list(denied.h("RateLimit")) == [("fallback", {"r": 0, "t": 1})]
    assert (denied.h("RateLimit-Limit"), denied.h("RateLimit-Remaining"),
            denied.h("RateLimit-Reset")) == (str(FALLBACK_RATE), "0", "1")
    assert denied.h("X-RateLimit-Agent-Error") not in (None, "")
    for name in ("content-type", "retry-after", "ratelimit", "ratelimit-policy",
                 "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"):
        assert (denied.h(name) is None) == (agent_429.h(name) is None), name

    # the key keeps sending at about twice the rate: refused requests must not keep it
    # at 0 (they did when every request was counted). Count, do not time: wait for two
    # more seconds' worth of admissions, whatever the machine's speed.
    more = 0
    sent = 0
    deadline = time.monotonic() + 20
    while more < 2 * FALLBACK_RATE and time.monotonic() < deadline:
        r = gw.request("/", api_key="net-key")
        sent += 1
        if r.status == 200:
            more += 1
        time.sleep(1.0 / (2 * FALLBACK_RATE))
    assert more >= 2 * FALLBACK_RATE, (more, sent)
    # per key: another key has its own budget
    assert gw.request("/", api_key="net-other").status == 200
