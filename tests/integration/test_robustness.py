"""Harder cases for the agent: concurrency accuracy, bounds (in-flight, frame size,
slow readers, idle connections), odd argument values."""

import socket
import threading
import time

import pytest

import spop_client as sc


@pytest.fixture
def ag(agent, redis):
    # a generous Redis budget: these tests check counts, not latency
    return agent(redis=redis, redis_cfg={"command_timeout_ms": 3000})


def collect_acks(c, n, timeout=10.0):
    got = {}
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        f = c.recv_frame(max(0.1, deadline - time.monotonic()))
        if f is None:
            break
        assert f.type == sc.T_ACK, f
        got[(f.sid, f.fid)] = sc.ack_vars(f.payload)
    return got


def test_concurrent_requests_exact_count(stack):
    """30 concurrent requests for one pro key (10/min) through HAProxy: exactly 10 pass."""
    s = stack(tiers={"conc-pro": "pro"})
    results = []
    lock = threading.Lock()

    def worker():
        r = s.get("/", api_key="conc-pro", timeout=10)
        with lock:
            results.append((r.status, r.h("X-RateLimit-Agent-Error"), r.h("X-RateLimit-Degraded")))

    threads = [threading.Thread(target=worker) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 30
    assert all(e is None and d is None for _, e, d in results), results
    assert sorted(st for st, _, _ in results) == [200] * 10 + [429] * 20


def test_more_than_inflight_bound_on_one_connection(ag):
    """600 NOTIFYs in one write, above the agent's per-connection in-flight bound: reading
    pauses, nothing is lost, every NOTIFY is ACKed."""
    n = 600
    out = b"".join(sc.notify(1 + 2 * i, 1, [sc.rl_message(key="bulk-%d" % (i % 50))])
                   for i in range(n))
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        t = threading.Thread(target=c.send, args=(out,))
        t.start()
        got = collect_acks(c, n, 20)
        t.join(10)
    assert len(got) == n
    assert not any(v.get("degraded") for v in got.values())
    allowed = sum(1 for v in got.values() if v["allow"] == 1)
    assert allowed == 50 * 5       # 12 requests per key, 5 allowed each


def test_largest_frame(ag):
    """A NOTIFY that fills the negotiated 16380 bytes exactly is accepted."""
    base = sc.notify(1, 1, [sc.rl_message(key="big", path="/")])
    pad = 16380 + 4 - len(base)
    msg = sc.rl_message(key="big", path="/" + "p" * (pad - 1))
    frame = sc.notify(1, 1, [msg])
    # the path's length varint grew by one byte: trim to land exactly on the limit
    while len(frame) - 4 > 16380:
        pad -= 1
        frame = sc.notify(1, 1, [sc.rl_message(key="big", path="/" + "p" * (pad - 1))])
    assert len(frame) - 4 <= 16380 and len(frame) - 4 >= 16378
    with sc.SpopClient(ag.addr) as c:
        c.hello(max_frame_size=16380)
        c.send(frame)
        f = c.recv_frame(5)
        assert f is not None and f.type == sc.T_ACK, f


def test_slow_reader_does_not_block_others(ag):
    """A peer that pipelines NOTIFYs and never reads its ACKs must not stall the agent."""
    hog = sc.SpopClient(ag.addr)
    hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.hello()
    batch = b"".join(sc.notify(1 + 2 * i, 1, [sc.rl_message(key="hog-%d" % i,
                                                             path="/" + "h" * 200)])
                     for i in range(300))
    hog.sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 3
    for _ in range(200):
        if time.monotonic() > deadline:
            break
        try:
            sent += hog.sock.send(batch)
        except BlockingIOError:
            time.sleep(0.02)
        except OSError:
            break
    assert sent > len(batch), "the hog must have queued NOTIFYs (%d bytes sent)" % sent
    try:
        t0 = time.monotonic()
        with sc.SpopClient(ag.addr) as c:
            c.hello()
            v = c.request(1, 1, [sc.rl_message(key="not-hogged")], timeout=3)
            assert v["allow"] == 1
        assert time.monotonic() - t0 < 2
        assert ag.alive()
    finally:
        hog.close()


def test_idle_connections_do_not_block_others(ag):
    """200 connections that never send a HELLO; a normal client is still served."""
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection(ag.addr, timeout=2))
        with sc.SpopClient(ag.addr) as c:
            c.hello()
            assert c.request(1, 1, [sc.rl_message(key="among-idle")])["allow"] == 1
    finally:
        for s in idle:
            s.close()
    assert ag.alive()


def test_many_short_connections(ag):
    for i in range(100):
        with sc.SpopClient(ag.addr) as c:
            if i % 3 == 0:
                c.send(sc.haproxy_hello(healthcheck=True, capabilities=""))
                f = c.recv_frame(3)
                assert f is not None and f.type == sc.T_AGENT_HELLO
            else:
                c.hello()
                if i % 3 == 1:
                    assert c.request(i, 1, [sc.rl_message(key="short-%d" % i)])["allow"] == 1
    assert ag.alive()


@pytest.mark.parametrize("key", [
    "k" * 8000,                         # long
    "{tag}:with:colons and spaces",     # Redis-special characters
    "caf\u00e9-\u2603",                 # UTF-8
    sc.Typed(sc.D_BINARY, b"\x00\xff\x00bin"),
])
def test_odd_keys(ag, key):
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        for i in range(5):
            assert c.request(1 + 2 * i, 1, [sc.rl_message(key=key)])["allow"] == 1
        assert c.request(99, 1, [sc.rl_message(key=key)])["allow"] == 0
        # a key sharing a long prefix is a different client
        other = sc.rl_message(key="k" * 7999 + "j")
        assert c.request(101, 1, [other])["allow"] == 1


def test_keys_do_not_collide_with_ips(ag):
    """An API key that looks like an IP address does not share the anonymous budget."""
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        for i in range(3):
            assert c.request(1 + 2 * i, 1, [sc.rl_message(ip="10.7.7.7")])["allow"] == 1
        assert c.request(11, 1, [sc.rl_message(ip="10.7.7.7")])["allow"] == 0
        v = c.request(13, 1, [sc.rl_message(key="10.7.7.7", ip="10.7.7.7")])
        assert v["allow"] == 1 and v["rule"] == "key_rpm", v


def test_negative_or_zero_cost_never_refunds(ag):
    """Odd costs (0, negative, huge) may be free or denied, but never give tokens back.
    (Observed: cost <= 0 is allowed and charges nothing.)"""
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        sid = 1
        for cost in (1, -5, 0, 2**40, -(2**62)):
            v = c.request(sid, 1, [sc.rl_message(key="neg-cost", cost=cost)])
            sid += 2
            assert "allow" in v, v
            if "remaining" in v:
                assert 0 <= v["remaining"] <= v["limit"], (cost, v)
                if v["rule"] == "key_rpm":
                    assert v["remaining"] <= 4, (cost, v)
        # whatever happened above, at most 4 more normal requests fit
        allowed = 0
        for _ in range(6):
            allowed += c.request(sid, 1, [sc.rl_message(key="neg-cost")])["allow"]
            sid += 2
        assert allowed <= 4, allowed


def test_cost_above_burst_is_denied(ag):
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="huge-cost", cost=6)])
        assert v["allow"] == 0, v
        # and it charged nothing
        v = c.request(3, 1, [sc.rl_message(key="huge-cost")])
        assert v["allow"] == 1 and v["remaining"] == 4, v


def test_unknown_tier_uses_default(ag):
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="tierless", tier="platinum")])
        assert v["allow"] == 1 and v["rule"] == "key_rpm", v
        v = c.request(3, 1, [sc.rl_message(key="pro-msg", tier="pro")])
        assert v["allow"] == 1 and v["rule"] == "pro_rpm", v


def test_missing_or_odd_args(ag):
    """NULL ip, no args at all, args of unexpected types: always an ACK, never a crash."""
    cases = [
        [("rl-req", [("key", None), ("ip", None)])],
        [("rl-req", [])],
        [("rl-req", [("key", 12345), ("ip", "not-an-ip"), ("cost", "3"), ("tier", True)])],
        [("rl-req", [("", "unnamed"), ("key", "dup1"), ("key", "dup2")])],
        [("rl-req", [("ip", sc.Typed(sc.D_IPV6, "::ffff:10.0.0.1"))])],
        [sc.rl_message(key="two-msgs"), sc.rl_message(key="two-msgs-b")],
    ]
    with sc.SpopClient(ag.addr) as c:
        c.hello()
        for i, msgs in enumerate(cases):
            c.send(sc.notify(1 + 2 * i, 1, msgs))
            f = c.recv_frame(3)
            assert f is not None and f.type == sc.T_ACK, (i, f)
            assert len(sc.decode_actions(f.payload)) >= 1
    assert ag.alive()
