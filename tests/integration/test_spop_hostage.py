"""The SPOP server and the metrics listener cannot be held hostage, and what they take from
the network stays bounded and harmless: idle connections are evicted at the connection cap
and closed after the idle timeout, receive buffers follow the bytes really sent (RSS with
many idle connections), /metrics answers with idle sockets open, NOTIFYs HAProxy gave up on
(agent stopped while they queued) are answered empty and counted, a peer that pauses
reading is slowed down and not cut off, a long RateLimit-Policy is delivered whole, a live
unix socket is never stolen, and peer strings reach the log escaped.

Sockets here use blocking I/O with timeouts (not select()): the tests open more than 1,024
descriptors."""

import os
import signal
import socket
import struct
import threading
import time

import pytest

import spop_client as sc
from conftest import Agent, agent_config, free_port, vm_rss_kb, wait_until
from test_ops import scrape


def raw_connect(addr, timeout=5.0):
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_frame(s, timeout=5.0):
    """One frame read with blocking recv() (fine above 1,024 descriptors); None on EOF."""
    s.settimeout(timeout)
    buf = b""
    while True:
        if len(buf) >= 4:
            n = struct.unpack(">I", buf[:4])[0]
            if len(buf) >= 4 + n:
                assert len(buf) == 4 + n, "more than one frame"
                return sc.decode_frame_body(buf[4:])
            want = 4 + n - len(buf)
        else:
            want = 4 - len(buf)
        try:
            b = s.recv(want)
        except (ConnectionResetError, ConnectionAbortedError):
            b = b""
        if not b:
            return None
        buf += b


def hello(s):
    s.sendall(sc.haproxy_hello())
    f = recv_frame(s)
    assert f is not None and f.type == sc.T_AGENT_HELLO, f
    return f


def request(s, sid, msgs):
    s.sendall(sc.notify(sid, 1, msgs))
    f = recv_frame(s)
    assert f is not None and f.type == sc.T_ACK and f.sid == sid, f
    return sc.ack_vars(f.payload)


# ---------------------------------------------------------------------------------------
# Connection cap, idle timeout, memory per idle connection


def test_idle_flood_evicts_oldest_and_haproxy_still_answered(agent):
    """2,000 connections that say HELLO and go idle, with max_connections = 64: each new
    one evicts the one idle longest (AGENT-DISCONNECT, then close), the agent never holds
    more than 64, and a fresh HELLO + NOTIFY is answered."""
    a = agent(store="allow", max_connections=64, metrics=True)
    socks = []
    try:
        for _ in range(2000):
            s = raw_connect(a.addr)
            hello(s)
            socks.append(s)
        # the oldest was evicted with a normal AGENT-DISCONNECT and closed
        f = recv_frame(socks[0])
        assert f is not None and f.type == sc.T_AGENT_DISCONNECT, f
        assert f.kv()["status-code"].value == sc.ST_NONE
        assert recv_frame(socks[0], 2) is None
        fresh = raw_connect(a.addr)
        socks.append(fresh)
        hello(fresh)
        assert request(fresh, 1, [sc.rl_message(key="after-flood")])["allow"] == 1
        # the newest idle ones are still served
        assert request(socks[-2], 3, [sc.rl_message(key="recent")])["allow"] == 1
        p = scrape(a)
        assert p.get("spoa_ratelimit_spop_connections") <= 64
        assert p.get("spoa_ratelimit_spop_connections_closed_total",
                     reason="evicted") >= 2001 - 64
        assert p.get("spoa_ratelimit_spop_connections_closed_total", reason="refused") == 0
    finally:
        for s in socks:
            s.close()
    assert a.alive()


def test_partial_frames_do_not_pin_slots(agent):
    """max_connections = 4 taken by peers that each left a partial NOTIFY (its length
    announced, a few bytes sent): they are evicted like idle ones, a fresh connection is
    answered."""
    a = agent(store="allow", max_connections=4)
    socks = []
    try:
        for _ in range(4):
            s = raw_connect(a.addr)
            hello(s)
            s.sendall(sc.notify(1, 1, [sc.rl_message(key="partial")])[:9])
            socks.append(s)
        time.sleep(0.2)
        fresh = raw_connect(a.addr)
        socks.append(fresh)
        hello(fresh)
        assert request(fresh, 1, [sc.rl_message(key="fresh")])["allow"] == 1
        f = recv_frame(socks[0])
        assert f is not None and f.type == sc.T_AGENT_DISCONNECT, f
    finally:
        for s in socks:
            s.close()


def test_idle_timeout_closes_idle_connection_only(agent):
    """idle_timeout = 300ms: a connection silent after its HELLO gets AGENT-DISCONNECT(2)
    and is closed; one that keeps sending NOTIFYs stays open well past the timeout."""
    a = agent(store="allow", idle_timeout="300ms", metrics=True)
    idle = raw_connect(a.addr)
    busy = raw_connect(a.addr)
    try:
        hello(idle)
        hello(busy)
        t_end = time.monotonic() + 1.5
        sid = 1
        while time.monotonic() < t_end:
            assert request(busy, sid, [sc.rl_message(key="busy")])["allow"] == 1
            sid += 2
            time.sleep(0.1)
        f = recv_frame(idle, 5)
        assert f is not None and f.type == sc.T_AGENT_DISCONNECT, f
        assert f.kv()["status-code"].value == sc.ST_TOUT
        assert recv_frame(idle, 2) is None
        assert request(busy, sid, [sc.rl_message(key="busy")])["allow"] == 1
        assert scrape(a).get("spoa_ratelimit_spop_connections_closed_total",
                             reason="idle_timeout") == 1
    finally:
        idle.close()
        busy.close()


def test_idle_connections_memory_bounded(agent):
    """1,000 idle connections after HELLO (default max_frame_size 65532) cost the agent a
    small, bounded amount each: no receive buffer is kept for a connection with nothing
    pending (it was max_frame_size + 4 = 64 KB each, allocated at accept)."""
    a = agent(store="allow")
    n = 1000
    socks = []
    try:
        s = raw_connect(a.addr)
        hello(s)
        socks.append(s)
        before = vm_rss_kb(a.proc.pid)
        for _ in range(n):
            s = raw_connect(a.addr)
            hello(s)
            socks.append(s)
        after = vm_rss_kb(a.proc.pid)
        per_conn = (after - before) / n
        # generous (an ASan build keeps freed buffers in quarantine: ~12 kB here): the
        # connection state is well under 1 KB; 64 KB buffers fail this
        assert per_conn < 32, "%.1f kB per idle connection (RSS %d -> %d kB)" % (
            per_conn, before, after)
        # and they all still work
        assert request(socks[-1], 1, [sc.rl_message(key="mem")])["allow"] == 1
    finally:
        for s in socks:
            s.close()


def test_metrics_answers_with_idle_sockets(agent):
    """64 (the default bound) and then 200 idle sockets on the metrics listener: /metrics is
    still answered, the oldest idle socket made room."""
    a = agent(store="allow", metrics=True)
    idle = []
    try:
        for _ in range(64):
            idle.append(socket.create_connection(a.metrics_addr, timeout=5))
        time.sleep(0.2)
        status, body = a.http("/metrics", timeout=3)
        assert status == 200 and "spoa_ratelimit_spop_connections" in body
        for _ in range(200):
            idle.append(socket.create_connection(a.metrics_addr, timeout=5))
        status, _ = a.http("/healthz", timeout=3)
        assert status == 200
        assert scrape(a).get("spoa_ratelimit_http_connections_evicted_total") >= 64
    finally:
        for s in idle:
            s.close()


def test_metrics_connection_settings(procs, tmp, agent_bin):
    """metrics.max_connections and metrics.idle_timeout are applied: with a bound of 4, 10
    idle sockets leave /metrics answered; an idle socket is closed after idle_timeout."""
    cfg = agent_config("127.0.0.1:%d" % free_port(), store="allow",
                       metrics={"listen": "127.0.0.1:%d" % free_port(), "max_connections": 4,
                                "idle_timeout": "300ms"})
    a = Agent(procs, tmp, cfg)
    s = socket.create_connection(a.metrics_addr, timeout=5)
    s.settimeout(5)
    try:
        # closed by the deadline without a reply: EOF (or a reset), well before 5 s
        t0 = time.monotonic()
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
        assert data == b""
        assert time.monotonic() - t0 < 4
    finally:
        s.close()
    idle = [socket.create_connection(a.metrics_addr, timeout=5) for _ in range(10)]
    try:
        status, _ = a.http("/metrics", timeout=3)
        assert status == 200
        assert scrape(a).get("spoa_ratelimit_http_connections_evicted_total") >= 6
    finally:
        for x in idle:
            x.close()


# ---------------------------------------------------------------------------------------
# Stale NOTIFYs


def test_stale_notifies_answered_empty_and_counted(agent):
    """spoe_timeout = 50ms: NOTIFYs sent while the agent is stopped (SIGSTOP) are older
    than that once it resumes (SIGCONT): each gets an ACK without any decision (no `allow`)
    and is counted; a NOTIFY sent afterwards is decided normally."""
    a = agent(store="allow", spoe_timeout="50ms", metrics=True)
    n = 30
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="fresh")])["allow"] == 1
        a.proc.signal(signal.SIGSTOP)
        try:
            c.send(b"".join(sc.notify(3 + 2 * i, 1, [sc.rl_message(key="old-%d" % i)])
                            for i in range(n)))
            time.sleep(0.5)
        finally:
            a.proc.signal(signal.SIGCONT)
        got = {}
        while len(got) < n:
            f = c.recv_frame(5)
            assert f is not None and f.type == sc.T_ACK, f
            got[f.sid] = sc.ack_vars(f.payload)
        assert sorted(got) == [3 + 2 * i for i in range(n)]
        for v in got.values():
            assert "allow" not in v, v
        assert c.request(101, 1, [sc.rl_message(key="fresh")])["allow"] == 1
    assert scrape(a).get("spoa_ratelimit_spop_stale_total") == n


def test_stale_check_off_by_default(agent):
    """Without spoe_timeout, NOTIFYs delayed by a stop are still decided."""
    a = agent(store="allow")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        a.proc.signal(signal.SIGSTOP)
        try:
            c.send(sc.notify(1, 1, [sc.rl_message(key="late")]))
            time.sleep(0.3)
        finally:
            a.proc.signal(signal.SIGCONT)
        f = c.recv_frame(5)
        assert f is not None and sc.ack_vars(f.payload)["allow"] == 1


# ---------------------------------------------------------------------------------------
# Back-pressure and reply size

LONG = "x" * 50


def long_limits(n, prefix):
    return {"%s%02d_%s" % (prefix, i, LONG): {"rate": 1000 + i, "period": "1h"}
            for i in range(n)}


def test_paused_reader_is_slowed_not_disconnected(agent, redis):
    """A peer that sends many NOTIFYs (each answered with a ~1 KB ACK) and stops reading
    for a while: the agent stops reading too (back-pressure) instead of closing the
    connection; once the peer reads again every NOTIFY is answered."""
    limits = long_limits(12, "p")
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 3000}, limits=limits,
              tiers={"free": {"limits": sorted(limits)}}, default_tier="free",
              anonymous={"limits": sorted(limits)[:1]})
    n = 12000
    batch = b"".join(sc.notify(1 + 2 * i, 1, [sc.rl_message(key="slow-%d" % (i % 97))])
                     for i in range(n))
    s = raw_connect(a.addr)
    try:
        hello(s)
        sender = threading.Thread(target=lambda: s.sendall(batch), daemon=True)
        sender.start()
        time.sleep(3)                   # not reading: the agent's queue fills
        s.settimeout(10)
        buf = b""
        acks = 0
        deadline = time.monotonic() + 60
        while acks < n and time.monotonic() < deadline:
            b = s.recv(1 << 20)
            assert b, "connection closed after %d ACKs" % acks
            buf += b
            frames, buf = sc.split_frames(buf)
            for f in frames:
                assert f.type == sc.T_ACK, f
                acks += 1
        sender.join(10)
        assert acks == n
    finally:
        s.close()
    assert a.alive()
    assert "closing" not in a.proc.log_text()


def test_long_policy_delivered_whole(agent):
    """A tier with 16 limits of 60-character names: its RateLimit-Policy (over 1 KB) is
    sent whole, with every limit in it."""
    limits = long_limits(16, "q")
    a = agent(store="memory", limits=limits, tiers={"free": {"limits": sorted(limits)}},
              default_tier="free", anonymous={"limits": sorted(limits)[:1]})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="policy")])
    assert v["allow"] == 1
    pol = v.get("policy")
    assert pol is not None and len(pol) > 1024, v
    items = [p.strip() for p in pol.split(",")]
    assert [i.split(";")[0].strip('"') for i in items] == sorted(limits)
    assert v["ratelimit"].startswith('"q')


# ---------------------------------------------------------------------------------------
# Unix sockets, log injection


def test_live_unix_socket_not_stolen(procs, tmp, agent_bin):
    """A second agent configured on the unix socket of a running one refuses to start
    (clear error) instead of unlinking it; the first keeps serving. A stale socket file
    (nobody listening) is replaced."""
    path = str(tmp / "agent.sock")
    first = Agent(procs, tmp, agent_config("unix:" + path, store="allow"), name="first")
    second = procs.spawn("second", [agent_bin, "-f", first.conf_path])
    wait_until(lambda: not second.alive(), 10, what="second agent to exit")
    assert second.returncode() not in (0, None)
    assert "listening on this socket" in second.log_text(), second.log_text()
    with sc.SpopClient(path) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="still-first")])["allow"] == 1
    assert first.alive()

    stale = str(tmp / "stale.sock")
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.bind(stale)
    u.close()                           # the file stays, nobody listens
    assert os.path.exists(stale)
    third = Agent(procs, tmp, agent_config("unix:" + stale, store="allow"), name="third")
    with sc.SpopClient(stale) as c:
        c.hello()
    assert third.alive()


def test_peer_strings_escaped_in_log(agent):
    """HELLO engine-id and DISCONNECT message with a newline and control characters: the
    log line carries them escaped (\\xHH), never a forged line."""
    a = agent(store="allow", log_level="debug")
    evil = "id\nFORGED spoa-ratelimit: fake entry\x1b[31m"
    with sc.SpopClient(a.addr) as c:
        c.send(sc.haproxy_hello(engine_id=evil))
        f = c.recv_frame()
        assert f is not None and f.type == sc.T_AGENT_HELLO
        c.send(sc.haproxy_disconnect(0, "bye\r\nFORGED second\x00"))
        assert c.wait_closed(5)
    wait_until(lambda: "bye" in a.proc.log_text(), 5, what="disconnect logged")
    text = a.proc.log_text()
    assert "id\\x0aFORGED spoa-ratelimit: fake entry\\x1b[31m" in text, text[-2000:]
    assert "bye\\x0d\\x0aFORGED second\\x00" in text, text[-2000:]
    for line in text.splitlines():
        assert not line.startswith("FORGED"), line
        assert "\x1b" not in line


def test_reload_logs_restart_only_connection_settings(agent):
    """A reload changing max_frame_size and max_inflight says they are ignored until
    restart (they were silently ignored)."""
    a = agent(store="allow")
    a.reload(max_inflight=8, max_frame_size=20000)
    wait_until(lambda: "reload (SIGHUP) ok" in a.proc.log_text(), 10, what="reload")
    text = a.proc.log_text()
    assert "max_frame_size, max_inflight, max_connections or idle_timeout changed, ignored " \
           "until restart" in text, text[-2000:]
    # still the old frame size: HAProxy's 65532 is echoed, not 20000
    s = raw_connect(a.addr)
    try:
        s.sendall(sc.haproxy_hello(max_frame_size=65532))
        f = recv_frame(s)
        assert f.kv()["max-frame-size"].value == 65532
    finally:
        s.close()


def test_uint64_cost_does_not_wrap_to_free(agent, redis):
    """A UINT64 cost of 2^63 + 1 used to wrap to a negative number, clamped to a free
    request; it now reads as out of range (the largest value): never admitted for free."""
    a = agent(redis=redis, redis_cfg={"command_timeout_ms": 3000})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key="u64", cost=sc.UInt64(2**63 + 1))])
        assert v.get("allow") != 1, v
        v = c.request(3, 1, [sc.rl_message(key="u64", cost=sc.UInt64(2**64 - 1))])
        assert v.get("allow") != 1, v


def test_connection_settings_validated(tmp, agent_bin):
    """-c accepts the new settings and rejects bad values, each with its line."""
    import subprocess
    from conftest import to_libconfig
    good = agent_config("127.0.0.1:1", store="allow", max_connections=64, idle_timeout="3m",
                        spoe_timeout="10ms",
                        metrics={"listen": "127.0.0.1:9", "max_connections": 8,
                                 "idle_timeout": "2s"})
    path = tmp / "good.conf"
    path.write_text(to_libconfig(good))
    r = subprocess.run([str(agent_bin), "-c", "-f", str(path)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    bad = agent_config("127.0.0.1:1", store="allow", max_connections=0, idle_timeout=5,
                       spoe_timeout="1x", metrics={"max_connections": 5000, "timeout": 1})
    path = tmp / "bad.conf"
    path.write_text(to_libconfig(bad))
    r = subprocess.run([str(agent_bin), "-c", "-f", str(path)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0
    for what in ("'max_connections' must be between 1 and 1000000", "'idle_timeout' must be",
                 "'spoe_timeout' must be", "'max_connections' must be between 1 and 4096",
                 "unknown setting 'timeout' in metrics"):
        assert what in r.stderr, (what, r.stderr)
