"""The agent's SPOP side, spoken to with the raw Python client (no HAProxy): handshake,
health-check hello, pipelining, stream/frame ids, malformed and oversize frames,
disconnects, and the variables of a verdict."""

import ipaddress
import socket
import struct
import time

import pytest

import spop_client as sc
from conftest import DEFAULT_TIERS, parse_sf_list


@pytest.fixture
def ag(agent, redis):
    return agent(redis=redis)


def client(ag, **kw):
    return sc.SpopClient(ag.addr, **kw)


def hello_ok(c, **kw):
    f = c.hello(**kw)
    assert f.flags == sc.FLAG_FIN and (f.sid, f.fid) == (0, 0)
    return f


def expect_disconnect(c, status, timeout=3.0):
    f = c.recv_frame(timeout)
    assert f is not None, "connection closed/timed out without AGENT-DISCONNECT"
    assert f.type == sc.T_AGENT_DISCONNECT, f
    assert f.flags & sc.FLAG_FIN and (f.sid, f.fid) == (0, 0)
    kv = f.kv()
    assert kv["status-code"].value == status, kv
    if "message" in kv:
        assert kv["message"].type == sc.D_STRING and len(kv["message"].value) <= 255
    assert c.wait_closed(3.0), "agent did not close after AGENT-DISCONNECT"
    return kv


def still_serving(ag):
    """The agent is alive and completes a normal exchange on a new connection."""
    assert ag.alive(), "agent process died"
    with client(ag) as c:
        hello_ok(c)
        v = c.request(7, 1, [sc.rl_message(key="alive-check")])
        assert v.get("allow") == 1, v


@pytest.mark.parametrize("mfs", [16380, 4096, 65532])
def test_handshake(ag, mfs):
    with client(ag) as c:
        f = hello_ok(c, max_frame_size=mfs, capabilities="pipelining,async",
                     engine_id="b7221426-38a6-4339-a6e1-666299755845")
        kv = f.kv()
        assert kv["version"] == sc.Typed(sc.D_STRING, "2.0")
        assert kv["max-frame-size"].type in (sc.D_UINT32, sc.D_INT32, sc.D_UINT64, sc.D_INT64)
        assert kv["max-frame-size"].value == mfs
        assert kv["capabilities"] == sc.Typed(sc.D_STRING, "pipelining")
        # and the connection is usable
        v = c.request(1, 1, [sc.rl_message(key="hs-%d" % mfs)])
        assert v["allow"] == 1


def test_handshake_tolerates_spaces_and_unknown_capabilities(ag):
    with client(ag) as c:
        f = hello_ok(c, versions=" 2.0 ,3.0", capabilities="pipelining, foo,async")
        assert f.kv()["capabilities"].value == "pipelining"


def test_healthcheck_hello(ag):
    """The fixed health-check frame of 2.6/3.x: a full AGENT-HELLO, then the agent closes."""
    with client(ag) as c:
        c.send(sc.haproxy_hello(16380, "", healthcheck=True))
        f = c.recv_frame(3)
        assert f is not None and f.type == sc.T_AGENT_HELLO, f
        assert f.flags == sc.FLAG_FIN and (f.sid, f.fid) == (0, 0)
        kv = f.kv()
        assert kv["version"].value == "2.0"
        assert 256 <= kv["max-frame-size"].value <= 16380
        assert "capabilities" in kv and kv["capabilities"].type == sc.D_STRING
        assert c.wait_closed(3), "agent kept the health-check connection open"
        assert c.frames == []
    still_serving(ag)


def test_unsupported_version(ag):
    with client(ag) as c:
        c.send(sc.haproxy_hello(versions="3.0"))
        expect_disconnect(c, sc.ST_BAD_VSN)
    still_serving(ag)


def test_sid_zero(ag):
    """HAProxy 2.6 numbers streams from 0: (0, 1) is a valid NOTIFY id."""
    with client(ag) as c:
        hello_ok(c)
        v = c.request(0, 1, [sc.rl_message(key="sid0")])
        assert v["allow"] == 1


def test_pipelined_notifies(ag):
    """20 NOTIFYs in one write on one connection: 20 ACKs with the same (sid, fid) pairs,
    in any order (ids include 0, repeated sids with other fids, big varints)."""
    ids = [(0, 1), (0, 2), (1, 1), (3, 1), (5, 7), (239, 1), (240, 1), (2288, 3),
           (300000, 1), (2**32 + 5, 2)]
    ids += [(1000 + 2 * i, 1 + i % 3) for i in range(20 - len(ids))]
    assert len(set(ids)) == 20
    out = b""
    for n, (sid, fid) in enumerate(ids):
        if n % 3 == 0:
            msg = sc.rl_message(ip="10.1.%d.%d" % (n, n + 1))          # anonymous
        elif n % 3 == 1:
            msg = sc.rl_message(key="pipe-%d" % n, tier="pro", path="/p/%d" % n)
        else:
            msg = sc.rl_message(key="pipe-shared", cost=1)
        out += sc.notify(sid, fid, [msg])
    with client(ag) as c:
        hello_ok(c)
        c.send(out)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            f = c.recv_frame(max(0.1, deadline - time.monotonic()))
            if f is None:
                break
            assert f.type == sc.T_ACK, f
            assert f.flags == sc.FLAG_FIN
            v = sc.ack_vars(f.payload)
            assert v.get("allow") in (0, 1), v
            got.append((f.sid, f.fid))
        assert sorted(got) == sorted(ids), "missing ACKs: %r" % (set(ids) - set(got))
        print("ACK order %s the NOTIFY order" % ("matches" if got == ids else "differs from"))
        # still usable after the burst
        assert c.request(9, 9, [sc.rl_message(key="after-burst")])["allow"] == 1


def test_acks_complete_out_of_order(agent, redis):
    """NOTIFYs that need Redis wait while Redis is frozen (SIGSTOP, up to the agent's
    command timeout); NOTIFYs that need no store (empty, unknown message) sent after them
    on the same connection are ACKed first: the agent does not ACK in arrival order."""
    import signal
    ag = agent(redis=redis, redis_cfg={"command_timeout_ms": 300})
    with client(ag) as c:
        hello_ok(c)
        # warm up the Redis connection (and script cache)
        assert c.request(1, 1, [sc.rl_message(key="ooo-warm")])["allow"] == 1
        slow = [(101 + 2 * i, 1) for i in range(10)]
        fast = [(201 + 2 * i, 1) for i in range(10)]
        out = b"".join(sc.notify(sid, fid, [sc.rl_message(key="ooo-%d" % sid)])
                       for sid, fid in slow)
        for n, (sid, fid) in enumerate(fast):
            if n % 2:
                out += sc.encode_frame(sc.T_NOTIFY, sid, fid, b"")
            else:
                out += sc.notify(sid, fid, [("not-rl", [("x", 1)])])
        redis.proc.signal(signal.SIGSTOP)
        try:
            c.send(out)
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 20 and time.monotonic() < deadline:
                f = c.recv_frame(max(0.1, deadline - time.monotonic()))
                if f is None:
                    break
                assert f.type == sc.T_ACK, f
                assert len(sc.decode_actions(f.payload)) >= 1
                got.append((f.sid, f.fid))
        finally:
            redis.proc.signal(signal.SIGCONT)
        assert sorted(got) == sorted(slow + fast)
        first = set(got[:10])
        assert first == set(fast), "ACK order: %r" % got


def test_empty_notify_is_acked(ag):
    """3.1.0-3.3-dev6 may send a NOTIFY with no message: ACK it with >= 1 action."""
    with client(ag) as c:
        hello_ok(c)
        c.send(sc.encode_frame(sc.T_NOTIFY, 1, 1, b""))
        f = c.recv_frame(3)
        assert f is not None and f.type == sc.T_ACK and (f.sid, f.fid) == (1, 1), f
        assert len(sc.decode_actions(f.payload)) >= 1


def test_unknown_message_is_acked(ag):
    with client(ag) as c:
        hello_ok(c)
        c.send(sc.notify(3, 1, [("other-msg", [("x", 1)])]))
        f = c.recv_frame(3)
        assert f is not None and f.type == sc.T_ACK and (f.sid, f.fid) == (3, 1), f
        assert len(sc.decode_actions(f.payload)) >= 1


@pytest.mark.parametrize("when", ["before-hello", "after-hello"])
def test_oversize_length(ag, when):
    with client(ag) as c:
        if when == "after-hello":
            hello_ok(c)
        c.send(struct.pack(">I", 0x00100000) + b"\x03\x00\x00\x00\x01\x01\x01")
        expect_disconnect(c, sc.ST_TOO_BIG)
    still_serving(ag)


def test_frame_above_negotiated_size(ag):
    """Negotiated 4096: a complete 5000-byte NOTIFY is too big."""
    with client(ag) as c:
        hello_ok(c, max_frame_size=4096)
        c.send(sc.notify(1, 1, [sc.rl_message(key="k", path="/" + "a" * 5000)]))
        expect_disconnect(c, sc.ST_TOO_BIG)
    still_serving(ag)


GARBAGE = {
    "type-200-before-hello": sc.encode_frame(200, 0, 0, b"\x01\x02\x03"),
    "notify-before-hello": sc.notify(1, 1, [sc.rl_message(key="k")]),
    "short-frame": struct.pack(">I", 3) + b"\xc8\x00\x00",
    "random-bytes": struct.pack(">I", 24) + bytes(range(0xe0, 0xf8)),
    "hello-truncated-kv": sc.encode_frame(sc.T_HAPROXY_HELLO, 0, 0,
                                          b"\x12supported-versions\x08\x50" + b"2.0"),
    "hello-bad-type-nibble": sc.encode_frame(sc.T_HAPROXY_HELLO, 0, 0, b"\x01x\x0c"),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_before_hello(ag, name):
    with client(ag) as c:
        c.send(GARBAGE[name])
        expect_disconnect(c, sc.ST_INVALID)
    still_serving(ag)


BAD_NOTIFY = {
    # string length 80 with 2 bytes present
    "truncated-string": b"\x06rl-req\x01\x03key\x08\x50ab",
    # 3 args announced, 1 present
    "missing-args": b"\x06rl-req\x03\x03key\x08\x01a",
    # type nibble 12
    "bad-type": b"\x06rl-req\x01\x03key\x0c",
    # 11-byte varint
    "long-varint": b"\x06rl-req\x01\x04cost\x04" + b"\xff" * 10 + b"\x00",
    # name length overflowing the frame
    "name-overflow": b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x0e",
}


@pytest.mark.parametrize("name", sorted(BAD_NOTIFY))
def test_malformed_notify(ag, name):
    with client(ag) as c:
        hello_ok(c)
        c.send(sc.encode_frame(sc.T_NOTIFY, 1, 1, BAD_NOTIFY[name]))
        expect_disconnect(c, sc.ST_INVALID)
    still_serving(ag)


@pytest.mark.parametrize("cut", ["mid-length", "mid-hello", "mid-notify", "after-notify"])
def test_abrupt_close(ag, cut):
    """The peer vanishes mid-frame (or with a NOTIFY in flight): the agent stays up."""
    hello = sc.haproxy_hello()
    note = sc.notify(1, 1, [sc.rl_message(key="abrupt")])
    c = client(ag)
    if cut == "mid-length":
        c.send(hello[:2])
    elif cut == "mid-hello":
        c.send(hello[:len(hello) // 2])
    else:
        c.send(hello)
        assert c.recv_frame(3).type == sc.T_AGENT_HELLO
        c.send(note if cut == "after-notify" else note[:len(note) - 3])
    # RST instead of FIN for the harshest variant
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    time.sleep(0.1)
    still_serving(ag)


def test_haproxy_disconnect(ag):
    with client(ag) as c:
        hello_ok(c)
        c.send(sc.haproxy_disconnect(0, "normal"))
        expect_disconnect(c, 0)
    still_serving(ag)


def test_fragmented_frame_rejected(ag):
    """We never announce fragmentation: a NOTIFY without FIN is refused."""
    with client(ag) as c:
        hello_ok(c)
        c.send(sc.encode_frame(sc.T_NOTIFY, 1, 1,
                               sc.encode_messages([sc.rl_message(key="f")]), flags=0))
        f = c.recv_frame(3)
        assert f is not None and f.type == sc.T_AGENT_DISCONNECT, f
        assert f.kv()["status-code"].value == sc.ST_FRAG_NOT_SUPPORTED
    still_serving(ag)


# ---- verdicts over the raw protocol -----------------------------------------------------

def test_anonymous_verdicts_and_ipv6_prefix(ag):
    """anon_rpm = 3/min per IPv4 address; IPv6 grouped by /64."""
    with client(ag) as c:
        hello_ok(c)
        sid = 1
        for i in range(3):
            v = c.request(sid, 1, [sc.rl_message(ip="10.9.9.9")])
            sid += 2
            assert v["allow"] == 1, v
            assert v["remaining"] == 2 - i, v
            assert v["limit"] == 3 and v["rule"] == "anon_rpm", v
        v = c.request(sid, 1, [sc.rl_message(ip="10.9.9.9")])
        sid += 2
        assert v["allow"] == 0, v
        assert 1 <= v["retry_after"] <= 21, v
        assert v["rule"] == "anon_rpm" and v["remaining"] == 0
        # another address has its own budget
        assert c.request(sid, 1, [sc.rl_message(ip="10.9.9.10")])["allow"] == 1
        sid += 2
        # same /64: one budget
        for i in range(3):
            ip = "2001:db8:1:2::%x" % (i + 1)
            assert c.request(sid, 1, [sc.rl_message(ip=ip)])["allow"] == 1
            sid += 2
        assert c.request(sid, 1, [sc.rl_message(ip="2001:db8:1:2:ffff::1")])["allow"] == 0
        sid += 2
        assert c.request(sid, 1, [sc.rl_message(ip="2001:db8:1:3::1")])["allow"] == 1


def test_key_verdict_variables(ag):
    """The full set of variables for a keyed request, and structured-field values."""
    with client(ag) as c:
        hello_ok(c)
        f_vars = None
        for i in range(5):
            f_vars = c.request(1 + 2 * i, 1, [sc.rl_message(key="vars-key")])
            assert f_vars["allow"] == 1
            assert f_vars["remaining"] == 4 - i
        assert f_vars["limit"] == 5 and f_vars["rule"] == "key_rpm"
        assert parse_sf_list(f_vars["policy"]) == [
            ("key_rpm", {"q": 5, "w": 60}), ("key_day", {"q": 1000, "w": 86400})]
        rl = parse_sf_list(f_vars["ratelimit"])
        assert rl[0][0] == "key_rpm" and rl[0][1]["r"] == 0 and 0 <= rl[0][1]["t"] <= 60
        d = c.request(99, 1, [sc.rl_message(key="vars-key")])
        assert d["allow"] == 0 and d["rule"] == "key_rpm"
        assert 1 <= d["retry_after"] <= 13
        assert "degraded" not in d or d["degraded"] == 0


def test_cost(ag):
    """cost=3 of 5 tokens, then 3 more is denied and charges nothing, then 2 fit."""
    with client(ag) as c:
        hello_ok(c)
        v = c.request(1, 1, [sc.rl_message(key="cost-key", cost=3)])
        assert v["allow"] == 1 and v["remaining"] == 2, v
        v = c.request(3, 1, [sc.rl_message(key="cost-key", cost=3)])
        assert v["allow"] == 0, v
        v = c.request(5, 1, [sc.rl_message(key="cost-key", cost=2)])
        assert v["allow"] == 1 and v["remaining"] == 0, v


def test_no_limit_charged_when_one_denies(agent, redis):
    """free tier = key_rpm (5/min) + key_day (1000/day): the 6th request is denied by
    key_rpm and key_day is not charged for it."""
    ag = agent(redis=redis, limits={"key_rpm": {"rate": 5, "period": "1m"},
                                    "key_day": {"rate": 7, "period": "1d"},
                                    "pro_rpm": {"rate": 10, "period": "1m"},
                                    "anon_rpm": {"rate": 3, "period": "1m"}},
               tiers=dict(DEFAULT_TIERS, peek={"limits": ["key_day"]}))
    with client(ag) as c:
        hello_ok(c)
        for i in range(5):
            assert c.request(1 + 2 * i, 1, [sc.rl_message(key="both")])["allow"] == 1
        for i in range(3):
            v = c.request(21 + 2 * i, 1, [sc.rl_message(key="both")])
            assert v["allow"] == 0 and v["rule"] == "key_rpm", v
        pol = dict(parse_policy(v["policy"]))
        assert pol == {"key_rpm": (5, 60), "key_day": (7, 86400)}
        # key_day charged 5 times, not 8: a cost-0 look through a tier of key_day alone
        v = c.request(41, 1, [sc.rl_message(key="both", tier="peek", cost=0)])
        assert v["rule"] == "key_day" and v["remaining"] == 2, v


def parse_policy(s):
    return [(n, (p["q"], p["w"])) for n, p in parse_sf_list(s)]
