"""Concurrency limits: requests in flight per client, across gateways.

A limit `concurrency = N` holds each admitted request to a slot in Redis (a lease of
max_duration, Redis time) until HAProxy's response message (rl-res) gives it back. End to
end through real HAProxy gateways (haproxy/haproxy.cfg, haproxy/spoe-ratelimit.conf), real
agents and a real Redis, in front of a test application that holds each request and counts
the requests in flight per key.
"""

import hashlib
import http.server
import json
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import (SPOA_BIN, HAProxy, LcList, StubApp, agent_env, parse_sf_list,
                      wait_until)
from test_ops import Prom

CONC = {"concurrency": 5, "max_duration": "2s"}
CFG = dict(
    limits={"inflight": CONC, "rate": {"rate": 100000, "period": "1s"}},
    tiers={"free": {"limits": ["inflight", "rate"]}},
    default_tier="free",
    anonymous={"limits": ["rate"]},
)


class HoldApp(StubApp):
    """GET /hold?k=KEY&ms=N: holds the request N ms, counting KEY's requests in flight
    (now, the most at once, and the time-weighted sum of in-flight seconds)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now, self.most, self.served = {}, {}, {}
        self.area, self.since = {}, {}
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                q = dict(kv.partition("=")[::2] for kv in self.path.partition("?")[2].split("&")
                         if kv)
                key, ms = q.get("k", "-"), int(q.get("ms", "0"))
                app.enter(key, +1)
                try:
                    time.sleep(ms / 1000.0)
                finally:
                    app.enter(key, -1)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        super().__init__(Handler)

    def enter(self, key, d):
        with self.lock:
            t = time.monotonic()
            n = self.now.get(key, 0)
            self.area[key] = self.area.get(key, 0.0) + n * (t - self.since.get(key, t))
            self.since[key] = t
            self.now[key] = n + d
            self.most[key] = max(self.most.get(key, 0), n + d)
            if d < 0:
                self.served[key] = self.served.get(key, 0) + 1


@pytest.fixture
def app():
    a = HoldApp()
    yield a
    a.close()


def metric(a, name, **labels):
    status, body = a.http("/metrics")
    assert status == 200
    return Prom(body).get(name, **labels) or 0


def slots_in_redis(redis, key):
    """The slots API key <key> holds in Redis (its sorted set), leases ended or not."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return int(redis.cmd("ZCARD", "rl:{k:%s}:inflight" % digest))


def hold_requests(g, key, hold_ms, n):
    """<n> requests of API key <key> held <hold_ms> by the application, through gateway
    <g>, each in a thread of its own (started, returned); one whose gateway goes away
    under it just ends."""
    def held():
        try:
            g.request("/hold?k=%s&ms=%d" % (key, hold_ms), api_key=key, timeout=10)
        except OSError:
            pass

    threads = [threading.Thread(target=held) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def hammer(gateways, key, hold_ms, seconds, clients):
    """<clients> threads, each sending requests for <key> in a loop through the gateways
    (client i on gateway i mod n) for <seconds>. Returns (statuses, 429 responses)."""
    statuses, denials, lock = {}, [], threading.Lock()
    stop = time.monotonic() + seconds

    def run(i):
        g = gateways[i % len(gateways)]
        while time.monotonic() < stop:
            r = g.request("/hold?k=%s&ms=%d" % (key, hold_ms), api_key=key, timeout=10)
            with lock:
                statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status == 429 and len(denials) < 5:
                    denials.append(r)
            if r.status == 429:
                time.sleep(0.005)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return statuses, denials


@pytest.mark.haproxy
def test_four_gateways_hold_a_key_to_its_slots(redis, agent, procs, tmp, app):
    """4 gateways (an agent each), one key with concurrency = 5, 40 clients: the
    application never sees more than 5 of the key's requests at once, and sees close to
    5 most of the time (slots are given back with each response)."""
    agents = [agent(redis=redis, metrics=True, name="agent%d" % i, **CFG) for i in range(4)]
    gws = [HAProxy(procs, tmp, a.address, app.address, name="haproxy%d" % i)
           for i, a in enumerate(agents)]
    hold, seconds = 0.2, 6.0
    t0 = time.monotonic()
    statuses, denials = hammer(gws, "fleet", int(hold * 1000), seconds, 40)
    elapsed = time.monotonic() - t0
    assert app.most.get("fleet", 0) <= 5, (app.most, statuses)
    assert statuses.get(200, 0) > 0 and statuses.get(429, 0) > 0, statuses
    assert set(statuses) <= {200, 429}, statuses
    # occupancy: the mean in flight over the run, against the 5 the key may hold
    mean = app.area["fleet"] / elapsed
    print("concurrency: most %d, mean in flight %.2f of 5, served %d in %.1f s "
          "(%.2f of 5 / %.1f s), statuses %r"
          % (app.most["fleet"], mean, app.served["fleet"], elapsed,
             app.served["fleet"] * hold / elapsed / 5, hold, statuses))
    assert mean >= 0.75 * 5, (mean, statuses)
    r = denials[0]
    assert r.h("Retry-After") == "1", r
    pol = r.h("RateLimit-Policy")
    assert '"inflight";q=5;qu="concurrent-requests"' in pol, pol
    rl = dict(parse_sf_list(r.h("RateLimit")))
    assert rl["inflight"]["r"] == 0, rl
    # every admitted request's slot was given back: none left once the clients are done
    wait_until(lambda: slots_in_redis(redis, "fleet") == 0, 5, what="every slot given back")
    released = sum(metric(a, "spoa_ratelimit_concurrency_released_total") for a in agents)
    assert released == statuses[200], (released, statuses)
    assert sum(metric(a, "spoa_ratelimit_concurrency_release_lost_total")
               for a in agents) == 0
    # the denials by rule and client: the key on /top under its concurrency limit
    status, body = agents[0].http("/top")
    assert status == 200, body
    rules = {r["rule"]: r for r in json.loads(body)["rules"]}
    assert rules["inflight"]["denied"] > 0 and rules["inflight"]["distinct_clients"] == 1, rules
    assert [e["client"] for e in rules["inflight"]["top"]][0].startswith("fp:"), rules


@pytest.mark.haproxy
def test_one_slot_taken_and_given_back_request_after_request(redis, agent, procs, tmp, app):
    """concurrency = 1: requests one after the other all pass (each gives its slot
    back), a second one in flight is refused, and the policy tells the client so."""
    a = agent(redis=redis, metrics=True, **dict(CFG, limits={
        "inflight": {"concurrency": 1, "max_duration": "10s"},
        "rate": {"rate": 100000, "period": "1s"}}))
    g = HAProxy(procs, tmp, a.address, app.address)
    for _ in range(10):
        r = g.request("/hold?k=one&ms=1", api_key="one")
        assert r.status == 200, r
        assert '"inflight";q=1;qu="concurrent-requests"' in r.h("RateLimit-Policy"), r
    # the slots held before (the test agent's readiness probe holds one for its lease)
    time.sleep(1.2)
    base = metric(a, "spoa_ratelimit_concurrency_slots_held")
    assert base in (0, 1), base
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=g.request("/hold?k=one&ms=1500", api_key="one", timeout=10)))
    t.start()
    wait_until(lambda: app.now.get("one", 0) == 1, 5, what="the long request held")
    r = g.request("/hold?k=one&ms=1", api_key="one")
    assert r.status == 429, r
    assert r.h("Retry-After") == "1", r
    # the quota route: no slot left, said by the concurrency limit
    q = json.loads(g.request("/rate_limit", api_key="one").body)
    assert q["rule"] == "inflight" and q["remaining"] == 0 and q["limit"] == 1, q
    assert '"inflight";q=1;qu="concurrent-requests"' in q["policy"], q
    # the slot held, on /metrics and the status page
    wait_until(lambda: metric(a, "spoa_ratelimit_concurrency_slots_held") == base + 1, 5,
               what="one slot more held in the metrics")
    time.sleep(0.3)  # the page is rendered at most every 0.25 s
    status, body = a.http("/status.json")
    assert status == 200
    assert json.loads(body)["denials"]["concurrency_held"] == base + 1, body[:2000]
    t.join(10)
    assert result["r"].status == 200
    wait_until(lambda: g.request("/hold?k=one&ms=1", api_key="one").status == 200, 3,
               what="the slot given back with the long response")
    assert app.most["one"] == 1
    q = json.loads(g.request("/rate_limit", api_key="one").body)
    assert q["remaining"] == 1, q
    wait_until(lambda: metric(a, "spoa_ratelimit_concurrency_slots_held") == base, 5,
               what="the long request's slot no longer held in the metrics")


@pytest.mark.haproxy
def test_slots_of_a_dead_gateway_end_with_their_lease(redis, agent, procs, tmp, app):
    """A gateway and its agent killed (SIGKILL) with the key's slots held: nothing gives
    them back, their leases (max_duration = 2 s) do; the key's full concurrency is back
    within max_duration + 1 s, and not before the leases end."""
    a = agent(redis=redis, name="doomed", **CFG)
    g = HAProxy(procs, tmp, a.address, app.address, name="doomed-haproxy")
    threads = hold_requests(g, "dead", 8000, 5)
    wait_until(lambda: app.now.get("dead", 0) == 5, 5, what="5 requests held")
    t_held = time.monotonic()
    g.proc.kill()
    a.proc.kill()
    b = agent(redis=redis, name="survivor", **CFG)
    h = HAProxy(procs, tmp, b.address, app.address, name="survivor-haproxy")
    assert h.request("/hold?k=dead&ms=1", api_key="dead").status == 429
    while h.request("/hold?k=dead&ms=1", api_key="dead").status != 200:
        assert time.monotonic() - t_held < 2.0 + 1.0 + 0.5, "slots never freed"
        time.sleep(0.02)
    recovered = time.monotonic() - t_held
    # all 5 free again: 5 requests in flight at once pass
    results = []
    ts = [threading.Thread(target=lambda: results.append(
        h.request("/hold?k=dead&ms=500", api_key="dead", timeout=10).status))
        for _ in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    print("slots of a dead gateway free again %.3f s after they were all held "
          "(max_duration 2 s)" % recovered)
    assert 1.5 <= recovered <= 3.0, recovered
    assert results == [200] * 5, results
    for t in threads:
        t.join(10)


@pytest.mark.haproxy
def test_a_client_that_disconnects_loses_no_slot_beyond_its_lease(redis, agent, procs, tmp,
                                                                   app):
    """Clients that close their connection mid-request: their slots are back within
    max_duration + 1 s (the response, or else the lease, gives them back)."""
    a = agent(redis=redis, **CFG)
    g = HAProxy(procs, tmp, a.address, app.address)
    socks = []
    for _ in range(5):
        s = socket.create_connection(g.front, timeout=5)
        s.sendall(b"GET /hold?k=gone&ms=6000 HTTP/1.1\r\nHost: x\r\nX-Api-Key: gone\r\n\r\n")
        socks.append(s)
    wait_until(lambda: app.now.get("gone", 0) == 5, 5, what="5 requests held")
    t_gone = time.monotonic()
    for s in socks:
        s.close()
    assert g.request("/hold?k=gone&ms=1", api_key="gone").status == 429
    wait_until(lambda: g.request("/hold?k=gone&ms=1", api_key="gone").status == 200, 4,
               interval=0.02, what="a slot back after its lease")
    recovered = time.monotonic() - t_gone
    print("slots of disconnected clients free again after %.3f s (max_duration 2 s)"
          % recovered)
    assert recovered <= 3.0, recovered


@pytest.mark.haproxy
def test_redis_down_local_count_holds_each_gateway(redis, agent, procs, tmp, app):
    """Redis stopped under load: no failed request, and the local count (the fallback's
    concurrency divided by the gateways: fallback.gateways = 2 here) holds this gateway
    to its share, 3 of 5; each response gives its local slot back."""
    a = agent(redis=redis, metrics=True, fallback={"gateways": 2}, **CFG)
    g = HAProxy(procs, tmp, a.address, app.address)
    assert g.request("/hold?k=down&ms=1", api_key="down").status == 200
    redis.stop()
    statuses, _ = hammer([g], "down", 150, 3.0, 10)
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.get(200, 0) >= 10 and statuses.get(429, 0) > 0, statuses
    assert app.most["down"] <= 3, app.most
    for _ in range(5):  # one after the other: each gives its local slot back
        assert g.request("/hold?k=down&ms=1", api_key="down").status == 200
    assert metric(a, "spoa_ratelimit_concurrency_released_total") >= statuses[200]


@pytest.mark.parametrize("body,message", [
    ('inflight = { concurrency = 5; rate = 10; period = "1s"; };',
     "'rate' is for rate limits"),
    ('inflight = { concurrency = 5; algorithm = "gcra"; };', "'algorithm' is for rate limits"),
    ('inflight = { concurrency = 5; max_duration = "10ms"; };', "'max_duration' must be"),
    ('inflight = { concurrency = 0; };', "'concurrency' must be between 1"),
    ('inflight = { rate = 5; period = "1s"; max_duration = "1s"; };',
     "'max_duration' is a concurrency limit's"),
    ('inflight = { algorithm = "concurrency"; rate = 5; period = "1s"; };',
     "unknown algorithm 'concurrency'"),
])
def test_check_refuses_bad_concurrency_limits(tmp, agent_bin, body, message):
    cfg = tmp / "bad.conf"
    cfg.write_text('listen = "127.0.0.1:1"; store = "memory";\nlimits = { %s };\n'
                   'tiers = { free = { limits = ["inflight"]; }; };\n'
                   'anonymous = { limits = ["inflight"]; };\n' % body)
    out = subprocess.run([agent_bin, "-c", "-f", str(cfg)], capture_output=True, text=True,
                         timeout=10)
    assert out.returncode != 0, out
    assert message in out.stderr + out.stdout, out


def cand_slots(redis, key, limit="inflight"):
    """The slots API key <key> holds in a candidate limit's sorted set."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return int(redis.cmd("ZCARD", "rl:{k:%s}:c:%s" % (digest, limit)))


@pytest.mark.haproxy
def test_a_candidate_concurrency_limit_counts_and_gives_back(redis, agent, procs, tmp, app):
    """A candidate policy with a concurrency limit (2) next to an enforced rate limit: 4
    requests held at once all pass (the candidate is never enforced), it would have
    denied 2 (counted under its limit), and its slots are given back by the responses;
    a request the enforced policy denies gives the candidate's slot back at once."""
    cfg = dict(CFG, limits={"rate": {"rate": 5, "period": "1h"}},
               tiers={"free": {"limits": ["rate"]}}, anonymous={"limits": ["rate"]},
               candidate={"limits": {"inflight": {"concurrency": 2, "max_duration": "30s"},
                                     "per_ep": {"concurrency": 10, "max_duration": "30s"}},
                          "tiers": {"free": {"limits": ["inflight"]}},
                          "anonymous": {"limits": ["inflight"]},
                          "endpoints": LcList([{"name": "held", "path_prefix": "/hold",
                                                "limits": ["per_ep"]}])})
    a = agent(redis=redis, metrics=True, **cfg)
    g = HAProxy(procs, tmp, a.address, app.address)
    out = []
    ts = [threading.Thread(target=lambda: out.append(g.request(
        "/hold?k=cand&ms=800", api_key="cand", timeout=10).status)) for _ in range(4)]
    for t in ts:
        t.start()
    wait_until(lambda: app.now.get("cand", 0) == 4, 5, what="4 requests held")
    assert cand_slots(redis, "cand") == 2
    assert cand_slots(redis, "cand", "per_ep@held") == 2  # the 2 the candidate admitted
    for t in ts:
        t.join(10)
    assert out == [200] * 4, out
    wait_until(lambda: cand_slots(redis, "cand") == 0, 5,
               what="the candidate's slots given back by the responses")
    # its endpoint's per-client limit (keys ...:c:per_ep@held): given back too, the
    # response message naming the candidate's endpoint (cendpoint)
    wait_until(lambda: cand_slots(redis, "cand", "per_ep@held") == 0, 5,
               what="the candidate endpoint's slots given back by the responses")
    assert metric(a, "spoa_ratelimit_candidate_decisions_total", tier="free",
                  rule="inflight", result="would_deny") == 2
    # the enforced policy's 5/h is spent (4 + 1): the 6th is denied, the candidate
    # admitted it and gives its slot back at once (no response comes through the agent)
    assert g.request("/hold?k=cand&ms=1", api_key="cand").status == 200
    r = g.request("/hold?k=cand&ms=1", api_key="cand")
    assert r.status == 429, r
    wait_until(lambda: cand_slots(redis, "cand") == 0, 5,
               what="the candidate's slot of a denied request given back")


@pytest.mark.haproxy
def test_a_clean_stop_gives_back_the_slots_still_held(redis, agent, procs, tmp, app):
    """An agent stopped cleanly (SIGTERM) while its requests hold the key's slots gives
    them back before it exits: the key's concurrency is free again at once, long before
    the leases (max_duration = 30 s) would end."""
    cfg = dict(CFG, limits={"inflight": {"concurrency": 3, "max_duration": "30s"},
                            "all": {"concurrency": 100, "max_duration": "30s"},
                            "rate": {"rate": 100000, "period": "1s"}},
               endpoints=LcList([{"name": "hold", "path_prefix": "/hold",
                                  "global_limits": ["all"]}]))
    a = agent(redis=redis, name="stopping", **cfg)
    g = HAProxy(procs, tmp, a.address, app.address, name="stopping-haproxy")

    threads = hold_requests(g, "stop", 4000, 3)
    wait_until(lambda: app.now.get("stop", 0) == 3, 5, what="3 requests held")
    assert slots_in_redis(redis, "stop") == 3
    assert int(redis.cmd("ZCARD", "rl:{g:hold}:all")) == 3  # the endpoint's, another tag
    t0 = time.monotonic()
    a.proc.signal(15)
    wait_until(lambda: not a.proc.alive(), 10, what="the agent gone")
    assert slots_in_redis(redis, "stop") == 0, "the slots were not given back at the stop"
    assert int(redis.cmd("ZCARD", "rl:{g:hold}:all")) == 0, "nor the endpoint's"
    print("slots given back by a clean stop: %.3f s after SIGTERM" % (time.monotonic() - t0))
    # the 3, and the slots of the readiness probes the test agent is started with (one, or
    # two when the first met Redis not yet connected: a slight start, an ASan build)
    m = re.search(r"drain: gave back (\d+) concurrency slots", a.proc.log_text())
    assert m and 3 <= int(m.group(1)) <= 5, a.proc.log_tail()
    for t in threads:
        t.join(10)


@pytest.mark.haproxy
def test_a_limit_override_changes_the_slots_of_one_client(redis, agent, procs, tmp, app):
    """`ctl limit KEY --rate inflight=N`: that client may hold N requests in flight, the
    others keep the configured 2; the policy says the slots in force."""
    cfg = dict(CFG, limits={"inflight": {"concurrency": 2, "max_duration": "30s"},
                            "rate": {"rate": 100000, "period": "1s"}},
               overrides={"enabled": True})
    a = agent(redis=redis, metrics=True, **cfg)
    g = HAProxy(procs, tmp, a.address, app.address)
    r = subprocess.run([str(SPOA_BIN), "ctl", "-f",
                        str(a.conf_path), "limit", "key:big", "--for", "10m", "--rate",
                        "inflight=4"], capture_output=True, text=True, timeout=20,
                       env=agent_env())
    assert r.returncode == 0, r
    wait_until(lambda: metric(a, "spoa_ratelimit_override_entries") == 1, 5,
               what="the override loaded")

    def held(key, n):
        """<n> requests of <key> held at once: the statuses."""
        out = []
        ts = [threading.Thread(target=lambda: out.append(g.request(
            "/hold?k=%s&ms=700" % key, api_key=key, timeout=10))) for _ in range(n)]
        for t in ts:
            t.start()
            time.sleep(0.05)
        for t in ts:
            t.join(10)
        return sorted(r.status for r in out), out

    st, out = held("big", 5)
    assert st == [200] * 4 + [429], st
    pol = [r for r in out if r.status == 429][0].h("RateLimit-Policy")
    assert '"inflight";q=4;qu="concurrent-requests"' in pol, pol
    st, _ = held("small", 4)
    assert st == [200] * 2 + [429] * 2, st
    assert app.most["big"] == 4 and app.most["small"] == 2, app.most


@pytest.mark.haproxy
def test_redis_down_under_the_fleets_load_each_gateway_holds_its_share(redis, agent, procs,
                                                                        tmp, app):
    """4 gateways (fallback.gateways "auto": the heartbeats count 4), one key with
    concurrency = 5, 40 clients; Redis stopped: no failed request, and each gateway's local
    count holds it to its share, 5 / 4 rounded up = 2 in flight."""
    agents = [agent(redis=redis, metrics=True, name="agent%d" % i, **CFG) for i in range(4)]
    gws = [HAProxy(procs, tmp, a.address, app.address, name="haproxy%d" % i)
           for i, a in enumerate(agents)]
    wait_until(lambda: all(metric(a, "spoa_ratelimit_gateways") == 4 for a in agents), 10,
               what="every agent counting 4 gateways")
    redis.stop()
    statuses, lock = {}, threading.Lock()
    stop = time.monotonic() + 3.0

    def run(i):
        g = gws[i % 4]
        while time.monotonic() < stop:
            # one API key for all; the application counts each gateway's apart
            r = g.request("/hold?k=down-g%d&ms=150" % (i % 4), api_key="down", timeout=10)
            with lock:
                statuses[r.status] = statuses.get(r.status, 0) + 1
            if r.status == 429:
                time.sleep(0.005)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert set(statuses) <= {200, 429}, statuses
    most = {g: app.most.get("down-g%d" % g, 0) for g in range(4)}
    served = {g: app.served.get("down-g%d" % g, 0) for g in range(4)}
    print("Redis down: in flight at most %r per gateway, served %r, statuses %r"
          % (most, served, statuses))
    assert all(m <= 2 for m in most.values()), most
    assert all(n > 0 for n in served.values()), served
    for a in agents:
        assert metric(a, "spoa_ratelimit_fallback_gateways") == 4


def test_memory_store_anonymous_and_shadow_concurrency(agent):
    """Over SPOP, the memory store: an anonymous client's concurrency limit (1) refuses a
    second request in flight and admits one again once the response message gave the slot
    back; a shadow concurrency limit never refuses, and names itself when it would have."""
    import spop_client as sc
    a = agent(store="memory", limits={
        "anon_inflight": {"concurrency": 1, "max_duration": "30s"},
        "watch": {"concurrency": 1, "max_duration": "30s", "shadow": True},
        "rate": {"rate": 100000, "period": "1s"}},
        tiers={"free": {"limits": ["watch", "rate"]}}, default_tier="free",
        unknown_keys="default_tier", anonymous={"limits": ["anon_inflight"]})
    with sc.SpopClient(a.addr, timeout=5) as c:
        c.hello()
        first = c.request(1, 1, [sc.rl_message(ip="192.0.2.7")])
        assert first["allow"] == 1 and first["slot"] > 0, first
        second = c.request(3, 1, [sc.rl_message(ip="192.0.2.7")])
        assert second["allow"] == 0 and second["rule"] == "anon_inflight", second
        assert second["retry_after"] == 1 and "slot" not in second, second
        assert c.request(5, 1, [sc.rl_message(ip="192.0.2.8")])["allow"] == 1  # another client
        c.request(7, 1, [("rl-res", [("ip", sc.ipaddress.ip_address("192.0.2.7")),
                                      ("slot", first["slot"])])])
        assert c.request(9, 1, [sc.rl_message(ip="192.0.2.7")])["allow"] == 1
        k1 = c.request(11, 1, [sc.rl_message(key="watched")])
        k2 = c.request(13, 1, [sc.rl_message(key="watched")])
        assert k1["allow"] == 1 and "shadow" not in k1, k1
        assert k2["allow"] == 1 and k2["shadow"] == "watch", k2


def test_a_response_reaching_another_agent_gives_the_slot_back(redis, agent):
    """The response message of a request one agent admitted reaches another (a worker
    restarted, HAProxy's other connection): that agent keeps nothing of the slot, so it
    builds the request's keys again from the message (the principal, the endpoint its ACK
    named, the candidate's endpoint in `cendpoint`) and gives the slot back in each."""
    import spop_client as sc
    cfg = dict(CFG, limits={"inflight": {"concurrency": 2, "max_duration": "30s"},
                            "rate": {"rate": 100000, "period": "1s"}},
               endpoints=LcList([{"name": "hold", "path_prefix": "/hold",
                                  "global_limits": ["inflight"]}]),
               candidate={"limits": {"c_ep": {"concurrency": 5, "max_duration": "30s"}},
                          "tiers": {"free": {"limits": ["c_ep"]}},
                          "anonymous": {"limits": ["c_ep"]},
                          "endpoints": LcList([{"name": "c_hold", "path_prefix": "/hold",
                                                "limits": ["c_ep"]}])})
    a1 = agent(redis=redis, name="admits", **cfg)
    a2 = agent(redis=redis, name="releases", **cfg)
    digest = hashlib.sha256(b"moved").hexdigest()[:32]
    keys = ["rl:{k:%s}:inflight" % digest, "rl:{g:hold}:inflight",
            "rl:{k:%s}:c:c_ep" % digest, "rl:{k:%s}:c:c_ep@c_hold" % digest]
    with sc.SpopClient(a1.addr, timeout=5) as c1, sc.SpopClient(a2.addr, timeout=5) as c2:
        c1.hello()
        c2.hello()
        v = c1.request(1, 1, [sc.rl_message(key="moved", path="/hold/x")])
        assert v["allow"] == 1 and v["endpoint"] == "hold" and v["cendpoint"] == "c_hold", v
        assert [int(redis.cmd("ZCARD", k)) for k in keys] == [1, 1, 1, 1]
        c2.request(1, 1, [("rl-res", [("key", "moved"), ("tier", None),
                                      ("ip", sc.ipaddress.ip_address("127.0.0.1")),
                                      ("endpoint", v["endpoint"]), ("slot", v["slot"]),
                                      ("cendpoint", v["cendpoint"])])])
        wait_until(lambda: [int(redis.cmd("ZCARD", k)) for k in keys] == [0, 0, 0, 0], 5,
                   what="every key's slot given back by the other agent")
