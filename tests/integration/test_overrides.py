"""Live overrides (src/policy/overrides.c, src/ctl/ctl.c): blocks and limit changes written to Redis by
`spoa-ratelimit ctl`, applied by every agent without a reload, through real HAProxy and Redis."""

import hashlib
import json
import statistics
import subprocess
import time

import spop_client as sc
from conftest import SPOA_BIN, agent_env, parse_sf_list, wait_until
from fake_redis import FakeRedis, resp_array
from test_ops import fingerprint, scrape, top_json
from test_quota import script_calls

HASH = "rl:{ovr}:overrides"

# A budget no test exhausts, so that only overrides deny.
BIG = {"limits": {"big": {"rate": 100000, "period": "1m"}, "anon_rpm": {"rate": 100000,
                                                                      "period": "1m"}},
       "tiers": {"free": {"limits": ["big"]}}, "default_tier": "free"}


def ctl(agent, *args, stdin=None):
    """Runs `spoa-ratelimit ctl -f <agent's config> args...`: (exit status, stdout, stderr)."""
    r = subprocess.run([str(SPOA_BIN), "ctl", "-f", str(agent.conf_path)] + [str(a) for a in args],
                       input=stdin, capture_output=True, text=True, timeout=20, env=agent_env())
    return r.returncode, r.stdout, r.stderr


def ctl_ok(agent, *args, **kw):
    rc, out, err = ctl(agent, *args, **kw)
    assert rc == 0, (args, rc, out, err)
    return out


def digest_hex(key):
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def blocked(r):
    return r.status == 429 and b'"violated-policies":["blocked"]' in r.body


def ask(c, sid, **msg):
    """One decision straight over SPOP: the ACK's variables."""
    return c.request(sid, 1, [sc.rl_message(**msg)])


def gateways(redis, agent, haproxy, n=2, **over):
    cfg = dict(BIG, **over)
    out = []
    for _ in range(n):
        a = agent(redis=redis, metrics=True, **cfg)
        out.append((a, haproxy(a.address)))
    return out


def test_block_reaches_every_gateway_and_costs_redis_nothing(redis, agent, haproxy):
    gws = gateways(redis, agent, haproxy)
    for _, gw in gws:
        assert gw.request("/", api_key="victim").status == 200
    # block and lift three times; each time, how long until both gateways apply it
    # (the design bound is one poll period, 250 ms, plus two Redis round trips)
    took = []
    for _ in range(3):
        t0 = time.monotonic()
        out = ctl_ok(gws[0][0], "block", "key:victim", "--for", "5m", "--reason",
                     "credential stuffing", "--by", "oncall")
        # shown by its keyed fingerprint, stored by its digest (unchanged by a rotation)
        assert "block:%s" % fingerprint("victim") in out, out
        assert digest_hex("victim")[:8] not in out, out
        assert redis.cmd("HEXISTS", HASH, "block:k:%s" % digest_hex("victim")) == 1
        for _, gw in gws:
            wait_until(lambda: blocked(gw.request("/", api_key="victim")), 5,
                       interval=0.01, what="the block applied")
        took.append(time.monotonic() - t0)
        ctl_ok(gws[0][0], "unblock", "key:victim")
        for _, gw in gws:
            wait_until(lambda: gw.request("/", api_key="victim").status == 200, 5,
                       interval=0.01, what="the block lifted")
    print("block propagation to both gateways (s): %s, median %.3f"
          % (" ".join("%.3f" % t for t in took), statistics.median(took)))
    ctl_ok(gws[0][0], "block", "key:victim", "--for", "5m", "--reason", "stuffing")
    for _, gw in gws:
        wait_until(lambda: blocked(gw.request("/", api_key="victim")), 5, interval=0.01,
                   what="the block applied")
    # a blocked client costs Redis no script call; Retry-After is the time the block has left
    calls = script_calls(redis)
    for _, gw in gws:
        for _ in range(10):
            r = gw.request("/", api_key="victim")
            assert blocked(r), r
            assert 290 <= int(r.h("Retry-After")) <= 300, r
            assert r.h("X-RateLimit-Degraded") is None, r
    assert script_calls(redis) == calls
    # other clients are not concerned
    assert gws[1][1].request("/", api_key="bystander").status == 200
    # every agent wrote an audit line, and counts the blocks apart from limit denials
    for a, _ in gws:
        log = a.proc.log_text()
        assert "override applied: block on %s" % fingerprint("victim") in log, log
        assert 'by oncall, reason "credential stuffing"' in log, log
        assert "override lifted: block on %s" % fingerprint("victim") in log, log
        assert digest_hex("victim")[:8] not in log
        m = scrape(a)
        assert m.get("spoa_ratelimit_decisions_total", rule="blocked", result="denied") >= 10
        assert m.get("spoa_ratelimit_override_blocked_total") >= 10
        assert m.get("spoa_ratelimit_override_entries") == 1
        assert m.get("spoa_ratelimit_decisions_total", rule="big", result="denied") == 0
        assert top_json(a)["blocked"]["top"][0]["client"] == fingerprint("victim")
        status, body = a.http("/overrides")
        ent = json.loads(body)["entries"]
        assert status == 200 and len(ent) == 1 and ent[0]["reason"] == "stuffing", body


def test_block_by_fingerprint_address_and_prefix(redis, agent):
    a = agent(redis=redis, metrics=True, **BIG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        # the fingerprint /top shows (fp: and 16 hex digits)
        assert ask(c, 1, key="fp-key")["allow"] == 1
        ctl_ok(a, "block", fingerprint("fp-key"), "--for", "1m", "--status", "403")
        v = wait_until(lambda: (lambda v: v if v["allow"] == 0 else None)(
            ask(c, 3, key="fp-key")), 5, interval=0.01, what="fingerprint block")
        assert v["status"] == 403 and v["rule"] == "blocked" and 1 <= v["retry_after"] <= 60, v
        # an IPv6 prefix: every address inside, keyed or not; nothing outside
        ctl_ok(a, "block", "2001:db8:aa00::/40", "--for", "1m")
        wait_until(lambda: ask(c, 5, ip="2001:db8:aaff::1")["allow"] == 0, 5, interval=0.01,
                   what="IPv6 prefix block")
        v = ask(c, 7, ip="2001:db8:aa12:3::9", key="some-key")
        assert v["allow"] == 0 and v["status"] == 429 and v["rule"] == "blocked", v
        assert ask(c, 9, ip="2001:db8:ab00::1")["allow"] == 1
        # one IPv4 address, also when HAProxy sends it IPv4-mapped
        ctl_ok(a, "block", "ip:192.0.2.7", "--for", "1m")
        wait_until(lambda: ask(c, 11, ip="192.0.2.7")["allow"] == 0, 5, interval=0.01,
                   what="IPv4 block")
        assert ask(c, 13, ip="::ffff:192.0.2.7")["allow"] == 0
        assert ask(c, 15, ip="192.0.2.8")["allow"] == 1
        # an IPv4 prefix given with host bits is stored as the prefix
        out = ctl_ok(a, "block", "198.51.100.77/24", "--for", "1m")
        assert "block:ip:198.51.100.0/24" in out, out
        wait_until(lambda: ask(c, 17, ip="198.51.100.1")["allow"] == 0, 5, interval=0.01,
                   what="IPv4 prefix block")
        # `remove` lifts every override of a target, however it was spelled
        ctl_ok(a, "remove", "ip:198.51.100.0/24")
        wait_until(lambda: ask(c, 19, ip="198.51.100.1")["allow"] == 1, 5, interval=0.01,
                   what="prefix block lifted")
    out = ctl_ok(a, "list")
    assert "ip:2001:db8:aa00::/40" in out and "ip:192.0.2.7/32" in out, out
    assert "198.51.100" not in out, out


def test_block_expires_by_itself(redis, agent, haproxy):
    a, gw = gateways(redis, agent, haproxy, n=1)[0]
    ctl_ok(a, "block", "key:brief", "--for", "2s", "--reason", "short")
    r = wait_until(lambda: (lambda r: r if blocked(r) else None)(
        gw.request("/", api_key="brief")), 5, interval=0.01, what="the block applied")
    assert 1 <= int(r.h("Retry-After")) <= 2, r
    wait_until(lambda: gw.request("/", api_key="brief").status == 200, 6, interval=0.05,
               what="the block expired")
    wait_until(lambda: "override expired: block on %s" % fingerprint("brief")
               in a.proc.log_text(), 3, what="the expiry logged")
    # the next write drops expired entries from Redis
    ctl_ok(a, "block", "key:other", "--for", "1m")
    assert redis.cmd("HEXISTS", HASH, "block:k:%s" % digest_hex("brief")) == 0


def test_limit_override_factor_and_explicit_rates(redis, agent, haproxy):
    # the default tier `free`: key_rpm 5/min and key_day 1000/day
    a = agent(redis=redis, metrics=True)
    gw = haproxy(a.address)
    ctl_ok(a, "limit", "key:raised", "--for", "10m", "--factor", "10", "--reason", "big customer")
    ctl_ok(a, "limit", "key:pinned", "--for", "10m", "--rate", "key_rpm=7")
    ctl_ok(a, "limit", "key:lowered", "--for", "10m", "--factor", "0.4")
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_entries") == 3, 5,
               interval=0.02, what="three overrides loaded")

    def admitted(key, n):
        rs = [gw.request("/", api_key=key) for _ in range(n)]
        ok = [r.status for r in rs].count(200)
        assert [r.status for r in rs] == [200] * ok + [429] * (n - ok), rs
        return ok, rs

    ok, rs = admitted("raised", 55)
    assert ok == 50
    assert dict(parse_sf_list(rs[0].h("RateLimit-Policy")))["key_rpm"]["q"] == 50, rs[0]
    assert dict(parse_sf_list(rs[0].h("RateLimit-Policy")))["key_day"]["q"] == 10000, rs[0]
    assert rs[0].h("RateLimit-Limit") == "50", rs[0]
    assert admitted("pinned", 10)[0] == 7
    assert admitted("lowered", 5)[0] == 2
    assert admitted("plain", 8)[0] == 5
    # the anonymous clients of one address (3/min), raised x2
    ctl_ok(a, "limit", "ip:127.0.0.5", "--for", "10m", "--factor", "2")
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_entries") == 4, 5,
               interval=0.02, what="the address override loaded")
    sts = [gw.request("/", source="127.0.0.5").status for _ in range(8)]
    assert sts == [200] * 6 + [429] * 2, sts
    sts = [gw.request("/", source="127.0.0.6").status for _ in range(4)]
    assert sts == [200] * 3 + [429], sts
    # lifted: back to the configured limit, the bucket's state kept
    ctl_ok(a, "unlimit", "key:pinned")
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_entries") == 3, 5,
               interval=0.02, what="the override lifted")
    assert gw.request("/", api_key="pinned").status == 429
    assert scrape(a).get("spoa_ratelimit_override_limited_total") >= 50 + 7 + 2 + 6


def test_bad_entries_are_skipped(redis, agent):
    a = agent(redis=redis, metrics=True, overrides={"max_entries": 3}, **BIG)
    good = "until=%d by=tester reason=fine" % (time.time() + 600)
    bad = {
        "block:junk": good,                                 # no such target
        "block:k:zz12ab34": good,                           # not hex
        "block:k:1234567": good,                            # too short a fingerprint
        "block:ip:10.0.0.0/33": good,                       # no such prefix
        "frobnicate:k:12345678": good,                      # no such kind
        "block:k:12345678": "until=soon",                   # not a time
        "block:k:22345678": "reason=no until",
        "block:k:32345678": "until=%d colour=red" % (time.time() + 600),   # unknown setting
        "limit:k:42345678": "until=%d" % (time.time() + 600),  # a limit without a change
        "limit:k:52345678": "until=%d factor=1e9" % (time.time() + 600),
        "block:k:62345678": "until=%d reason=bell\x07" % (time.time() + 600),
        "block:k:72345678": "until=%d reason=%s" % (time.time() + 600, "x" * 3000),
    }
    loads = scrape(a).get("spoa_ratelimit_override_loads_total")
    for f, v in bad.items():
        redis.cmd("HSET", HASH, f, v)
    redis.cmd("HSET", HASH, "block:ip:10.9.8.7", good)
    redis.cmd("HINCRBY", HASH, "version", 1)
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_loads_total") == loads + 1, 5,
               interval=0.02, what="a load")
    m = scrape(a)
    assert m.get("spoa_ratelimit_override_entries") == 1
    assert m.get("spoa_ratelimit_override_skipped_total") == len(bad)
    log = a.proc.log_text()
    for f in bad:
        assert "entry '%s' skipped" % f in log, (f, log)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert ask(c, 1, ip="10.9.8.7")["allow"] == 0
        assert ask(c, 3, ip="10.9.8.8")["allow"] == 1
    # beyond overrides.max_entries (3): the agent keeps 3, ctl refuses a 4th
    for i in range(4):
        redis.cmd("HSET", HASH, "block:ip:10.0.0.%d" % (i + 1), good)
    redis.cmd("HDEL", HASH, *bad)
    redis.cmd("HINCRBY", HASH, "version", 1)
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_loads_total") == loads + 2, 5,
               interval=0.02, what="a second load")
    assert scrape(a).get("spoa_ratelimit_override_entries") == 3
    assert "entries skipped beyond overrides.max_entries = 3" in a.proc.log_text()
    rc, out, err = ctl(a, "block", "ip:10.1.1.1", "--for", "1m")
    assert rc == 1 and "max_entries reached" in err, (rc, out, err)
    # the hash replaced by a string: each check fails, the agent keeps its table and works
    kept = json.loads(a.http("/overrides")[1])["entries"][0]["target"]
    redis.cmd("DEL", HASH)
    redis.cmd("SET", HASH, "garbage")
    wait_until(lambda: scrape(a).get("spoa_ratelimit_override_poll_errors_total") >= 1, 5,
               interval=0.05, what="poll errors")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert ask(c, 1, ip=kept[3:].split("/")[0])["allow"] == 0
        for i in range(3):
            v = ask(c, 3 + 2 * i, key="any")
            assert v["allow"] == 1 and "degraded" not in v, v
            time.sleep(1)
    assert "overrides: version check failed" in a.proc.log_text()
    assert a.alive()
    rc, out, err = ctl(a, "list")
    assert rc == 1 and "WRONGTYPE" in err, (rc, out, err)


def test_restart_keeps_the_blocks(redis, agent, haproxy):
    a, gw = gateways(redis, agent, haproxy, n=1)[0]
    ctl_ok(a, "block", "key:persistent", "--for", "10m")
    wait_until(lambda: blocked(gw.request("/", api_key="persistent")), 5, interval=0.01,
               what="the block applied")
    a.kill()
    a.restart()
    # the table is only in memory: reloaded from Redis at start (and decisions wait for
    # it, see test_first_decisions_wait_for_the_overrides)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = ask(c, 1, key="persistent")
        assert v["allow"] == 0 and v["rule"] == "blocked", v
    assert "override applied: block on %s" % fingerprint("persistent") in a.proc.log_text()


def test_ctl_refuses_bad_input(redis, agent):
    a = agent(redis=redis)
    for args, why in [
        (("block", "k:xyz", "--for", "1m"), "8 to 32 hex digits"),
        (("block", "k:12345678zz", "--for", "1m"), "not a hex digit"),
        (("block", "not-an-address", "--for", "1m"), "not an IPv4 or IPv6 address"),
        (("block", "ip:10.0.0.0/40", "--for", "1m"), "at most 32 bits"),
        (("block", "key:x"), "--for DURATION or --until"),
        (("block", "key:x", "--for", "0s"), "a duration from 1s"),
        (("block", "key:x", "--until", "1000"), "in the past"),
        (("block", "key:x", "--for", "1m", "--status", "200"), "from 400 to 599"),
        (("block", "key:x", "--for", "1m", "--reason", "tab\there"), "not printable ASCII"),
        (("limit", "key:x", "--for", "1m"), "--factor X and/or --rate"),
        (("limit", "key:x", "--for", "1m", "--rate", "nope=5"), "no limit 'nope'"),
        (("limit", "key:x", "--for", "1m", "--factor", "5000"), "from 0.001 to 1000"),
        (("frob",), "unknown command"),
    ]:
        rc, out, err = ctl(a, *args)
        assert rc in (1, 2) and why in err, (args, rc, out, err)
    assert redis.cmd("EXISTS", HASH) == 0
    # a raw key from standard input (not on the command line)
    out = ctl_ok(a, "block", "key:-", "--for", "1m", stdin="secret-key\n")
    # without the fleet's secret ctl shows no fingerprint, and never the digest
    assert "block:key:*:" in out and digest_hex("secret-key")[:8] not in out, out
    assert redis.cmd("HEXISTS", HASH, "block:k:%s" % digest_hex("secret-key")) == 1


def test_first_decisions_wait_for_the_overrides(agent):
    """Right after start, a decision that arrives while the first load is in flight waits
    for it (a Redis slow to answer the version check here): the blocked key never passes,
    and the others are decided by Redis, not degraded."""
    until = int(time.time()) + 600
    entry = b"until=%d reason=restart" % until

    class Slow(FakeRedis):
        def _answer(self, argv):
            name = argv[0].upper()
            if name == b"HGET" and argv[1] == HASH.encode():
                time.sleep(0.1)                 # below the agent's 150 ms command timeout
                return b"$1\r\n1\r\n"
            if name == b"HGETALL":
                field = b"block:k:" + digest_hex("early").encode()
                return resp_array([b"$%d\r\n%s\r\n" % (len(x), x) for x in (field, entry)])
            return super()._answer(argv)

    fr = Slow()
    try:
        a = agent(redis=fr, metrics=True, wait_redis=False, **BIG)
        wait_until(lambda: "single Redis" in a.proc.log_text(), 10, 0.005, "store ready")
        with sc.SpopClient(a.addr) as c:
            c.hello()
            v = ask(c, 1, key="early")
            assert v["allow"] == 0 and v["rule"] == "blocked", v
            v = ask(c, 3, key="someone-else")
            assert v["allow"] == 1 and "degraded" not in v, v
        m = scrape(a)
        assert m.get("spoa_ratelimit_degraded_total") == 0, m.samples
        assert fr.count("HGETALL") >= 1
    finally:
        fr.close()


def test_an_address_block_is_counted_against_the_address(redis, agent):
    """Random keys from one blocked address (a credential-stuffing bot rotating keys): /top
    counts the denials against the address, one client, not one client per key (every key
    used to be credited with the address's block: 200 keys, 200 "clients"). A blocked key
    is still counted against the key."""
    a = agent(redis=redis, metrics=True, **BIG)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        ctl_ok(a, "block", "ip:192.0.2.66", "--for", "1m")
        wait_until(lambda: ask(c, 1, ip="192.0.2.66")["allow"] == 0, 5, interval=0.01,
                   what="the address block")
        for i in range(200):
            v = ask(c, 3 + 2 * i, ip="192.0.2.66", key="rotating-%d" % i)
            assert v["allow"] == 0 and v["rule"] == "blocked", v
        ctl_ok(a, "block", "key:stolen-key", "--for", "1m")
        wait_until(lambda: ask(c, 501, key="stolen-key", ip="198.51.100.9")["allow"] == 0, 5,
                   interval=0.01, what="the key block")
    top = wait_until(lambda: (lambda t: t if t.get("blocked", {}).get("denied", 0) >= 202
                              else None)(top_json(a)), 5, 0.3, "the denials published")
    clients = {e["client"] for e in top["blocked"]["top"]}
    assert "192.0.2.66/32" in clients, top["blocked"]
    assert fingerprint("stolen-key") in clients, top["blocked"]
    assert not any(fingerprint("rotating-%d" % i) in clients for i in range(200)), clients
    assert top["blocked"]["distinct_clients"] <= 3, top["blocked"]
