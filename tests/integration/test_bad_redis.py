"""A misbehaving Redis: the agent stays up, answers, and keeps its memory.

A fake Redis (fake_redis.py) completes the agent's handshake like a real one, then answers
every decision's script call with one kind of misbehaviour for a few seconds (the breaker
set never to open, so that every decision meets it): a reply nested a
million deep, a bulk string announcing a terabyte and sent without end, an array announcing
2^31 - 1 elements followed by endless integers, the largest array a reply may hold
(built, then found to be no script reply), endless garbage, a line without its end, a
valid reply one byte a second, or silence. Meanwhile the test sends decisions over SPOP and
probes /healthz, and samples the agent's resident memory. The agent must stay alive, answer
every decision (degraded: the failure ladder) and every /healthz within 250 ms, keep its RSS
under 64 MB above its idle size, and decide with Redis again once Redis behaves.

Against an AddressSanitizer build (CI's debian12-asan leg), the memory bound is not
asserted (ASan keeps freed memory in quarantine, 256 MB by default, and shadows what it
maps) and the latency bound is 1 s (ASan's code is several times slower); what is asserted
there is what ASan is for: no crash, no invalid access, no leak.

Each case prints one line with what it measured (pytest -s shows them): decisions answered,
the worst SPOP and /healthz latencies, the RSS growth, the protocol errors logged.
"""
import os
import threading
import time

import pytest

import spop_client as sc
from conftest import SPOA_BIN, http_request, vm_rss_kb, wait_until
from fake_redis import FakeRedis, script_reply

WINDOW_S = 4.0          # how long Redis misbehaves


def _sanitized():
    try:
        return b"__asan_init" in SPOA_BIN.read_bytes()
    except OSError:
        return False


ASAN = _sanitized()
LATENCY_MAX_S = 1.0 if ASAN else 0.25


def endless(head, chunk):
    """A reply that starts with <head>, then <chunk> again and again until the fake closes."""
    def send(fr):
        yield head
        while not fr.closing:
            yield chunk
    return send


def nested(fr):
    yield b"*1\r\n" * 1000000 + b":1\r\n"


huge_bulk = endless(b"$1099511627776\r\n", b"x" * 65536)
huge_array = endless(b"*2147483647\r\n", b":1\r\n" * 16384)
garbage = endless(b"", os.urandom(1 << 20))
endless_line = endless(b"+", b"a" * 65536)


def largest_allowed(fr):
    """An array of as many elements as a reply may hold (the default limit), 1 MB of
    integers: read, built and refused as a script reply, every time."""
    yield b"*262144\r\n" + b":1\r\n" * 262144


def byte_a_second(fr):
    for b in script_reply(1):
        if fr.closing:
            return
        yield bytes([b])
        time.sleep(1.0)


def silent(fr):
    while not fr.closing:
        time.sleep(0.05)
    yield b""


CASES = {
    "nested": (nested, True),
    "huge_bulk": (huge_bulk, True),
    "huge_array": (huge_array, True),
    "garbage": (garbage, True),
    "largest_allowed": (largest_allowed, False),
    "endless_line": (endless_line, True),
    "byte_a_second": (byte_a_second, False),
    "silent": (silent, False),
}


class BadRedis(FakeRedis):
    """A fake Redis whose script calls misbehave (with <kind>) while .bad is set."""

    def __init__(self, kind):
        self.bad = False
        super().__init__(script=self._script)
        self.kind = kind

    def _script(self, nkeys, argv):
        if self.bad:
            return self.kind(self)
        return script_reply(nkeys)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_misbehaving_redis_neither_stops_nor_bloats_the_agent(agent, case):
    kind, protocol_error = CASES[case]
    fr = BadRedis(kind)
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False,
                  redis_cfg={"command_timeout_ms": 50, "breaker_failures": 1000000})
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.05, "store ready")
        pid = a.proc.pid
        time.sleep(0.5)
        idle = vm_rss_kb(pid)
        stop = threading.Event()
        peak = [idle]
        health = []                     # (latency s, status)
        errors = []

        def sample():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], vm_rss_kb(pid))
                except (OSError, AssertionError):
                    return
                time.sleep(0.01)

        def probe():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = http_request(a.metrics_addr, "/healthz", timeout=2.0)
                    health.append((time.monotonic() - t0, r.status))
                except OSError as e:
                    errors.append("healthz: %r" % e)
                    health.append((time.monotonic() - t0, 0))
                time.sleep(0.1)

        threads = [threading.Thread(target=f, daemon=True) for f in (sample, probe)]
        for t in threads:
            t.start()
        lat, degraded, sid = [], 0, 1
        try:
            fr.bad = True
            with sc.SpopClient(a.addr, timeout=2.0) as c:
                c.hello()
                end = time.monotonic() + WINDOW_S
                while time.monotonic() < end:       # ~100 decisions/s, bounded by the window
                    t0 = time.monotonic()
                    v = c.request(sid, 1, [sc.rl_message(key="bad-%d" % (sid % 50))])
                    lat.append(time.monotonic() - t0)
                    assert "allow" in v, v
                    degraded += v.get("degraded") == 1
                    sid += 2
                    time.sleep(0.01)
            fr.bad = False
        finally:
            stop.set()
            for t in threads:
                t.join(5)
        log = a.proc.log_text()
        perr = log.count("protocol error")
        worst_health = max(h[0] for h in health)
        print("\n%s: %d decisions (%d degraded), worst SPOP %.1f ms, worst /healthz %.1f ms "
              "(%d probes), RSS idle %d kB, peak +%d kB, protocol errors logged %d" % (
                  case, len(lat), degraded, max(lat) * 1e3, worst_health * 1e3, len(health),
                  idle, peak[0] - idle, perr))
        assert a.alive(), a.proc.log_tail()
        assert not errors, errors
        assert all(h[1] == 200 for h in health), health
        assert worst_health < LATENCY_MAX_S, health
        assert max(lat) < LATENCY_MAX_S, sorted(lat)[-5:]
        assert degraded > 0
        if not ASAN:
            assert peak[0] - idle < 64 * 1024, (idle, peak[0])
        if protocol_error:
            assert perr > 0, a.proc.log_tail()
            from test_overload import metric
            wait_until(lambda: metric(a, "spoa_ratelimit_redis_errors_total",
                                      **{"class": "protocol"}) >= 1, 5, 0.1,
                       "the protocol errors counted")
        # Redis behaves again: exact decisions come back
        a.wait_store(timeout=15)
    finally:
        fr.close()


# ---------------------------------------------------------------------------------------
# Misbehaving Sentinels: the watch connection (SUBSCRIBE +switch-master) is read within the
# same limits, and one that falls silent is dropped for the next Sentinel.

MASTER = "mymaster"


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


class BadSentinel(FakeRedis):
    """Answers where the master is (<master_port> on loopback) like a Sentinel; after
    SUBSCRIBE, confirms it and then <after_subscribe>: "silent" (no answer to anything,
    PING included) or "flood" (a message announcing a terabyte, sent without end)."""

    def __init__(self, master_port, after_subscribe):
        self.master_port = master_port
        self.after = after_subscribe
        super().__init__()

    def _flood(self):
        yield (b"*3\r\n" + bulk(b"subscribe") + bulk(b"+switch-master") + b":1\r\n" +
               b"*3\r\n" + bulk(b"message") + bulk(b"+switch-master") + b"$1099511627776\r\n")
        chunk = b"y" * 65536
        while not self.closing:
            yield chunk

    def _answer(self, argv):
        name = argv[0].upper()
        if name == b"SENTINEL":
            return b"*2\r\n" + bulk(b"127.0.0.1") + bulk(b"%d" % self.master_port)
        if name == b"SUBSCRIBE":
            if self.after == "flood":
                return self._flood()
            return b"*3\r\n" + bulk(b"subscribe") + bulk(b"+switch-master") + b":1\r\n"
        if name == b"PING":
            return b""                  # silent: never answered
        return b"+OK\r\n"


def decides_exactly(a, key):
    """<a> is alive and decides <key> with Redis (allowed, not degraded)."""
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(1, 1, [sc.rl_message(key=key)])
    assert v["allow"] == 1 and not v.get("degraded"), v
    assert a.alive()


def agent_on_sentinels(procs, tmp, sentinels):
    from conftest import Agent, agent_config, free_port
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1")
    cfg["redis"].pop("address")
    cfg["redis"].update({"sentinel": {"addresses": [s.address for s in sentinels],
                                      "master": MASTER},
                         "connect_timeout_ms": 300})
    return Agent(procs, tmp, cfg)


def test_a_silent_sentinel_watch_is_dropped_for_the_next(procs, tmp, agent_bin, redis):
    """Two Sentinels that confirm the subscription, then answer nothing, PINGs included (a
    frozen Sentinel, a link that drops packets): each in turn is dropped within a PING period
    and the deadline (2 s + connect_timeout_ms), with the reason logged, while decisions go
    on exactly through the master they named."""
    sns = [BadSentinel(redis.port, "silent") for _ in range(2)]
    try:
        a = agent_on_sentinels(procs, tmp, sns)
        for s in sns:
            wait_until(lambda: "%s: watch: no answer to PING for 2300 ms; watching the next "
                       "Sentinel" % s.address in a.proc.log_text(), 15, 0.1,
                       "the watch on %s dropped" % s.address)
        assert all(s.count("PING") >= 1 for s in sns)
        decides_exactly(a, "sn-silent")
    finally:
        for s in sns:
            s.close()


def test_a_flooding_sentinel_watch_is_refused(procs, tmp, agent_bin, redis):
    """A Sentinel whose subscription sends a message announcing a terabyte, without end (the
    agent once held 1.5 GB of it): refused when the header arrives, logged once with the
    limit, the next Sentinel watched; the agent's memory stays put and it decides exactly."""
    sns = [BadSentinel(redis.port, "flood") for _ in range(2)]
    try:
        a = agent_on_sentinels(procs, tmp, sns)
        idle = vm_rss_kb(a.proc.pid)
        wait_until(lambda: a.proc.log_text().count("would pass redis.max_reply_bytes") >= 2,
                   10, 0.1, "both Sentinels' floods refused")
        time.sleep(3)                   # more rounds: each refused again, logged once
        log = a.proc.log_text()
        assert log.count("%s: protocol error: a bulk string of 1099511627776 bytes would "
                         "pass redis.max_reply_bytes (16777216); watching the next Sentinel"
                         % sns[0].address) == 1, log
        assert sum(s.count("SUBSCRIBE") for s in sns) >= 4
        assert ASAN or vm_rss_kb(a.proc.pid) - idle < 64 * 1024
        decides_exactly(a, "sn-flood")
    finally:
        for s in sns:
            s.close()
