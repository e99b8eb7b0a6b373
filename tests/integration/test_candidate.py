"""Candidate policies (section `candidate`): a second policy evaluated on live traffic next
to the enforced one, in the same script call, never denying and never changing an answer.

The central check: on identical traffic, the clients and counts a candidate reports as
would-be denials are exactly those that a second run enforcing it denies (compared through
real HAProxy, real Redis, each run with its own key prefix)."""
import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor

import spop_client as sc
import pytest

from conftest import SPOA_BIN, LcList, Stack, key_principal, limit_state, to_libconfig, wait_until
from test_cluster import redis_cluster  # noqa: F401 (the fixture)
from test_ops import pipeline, scrape

# today: generous limits that deny nobody in these tests
TODAY_LIMITS = {"key_hour": {"rate": 100, "period": "1h"},
                "anon_hour": {"rate": 100, "period": "1h"}}
# the candidate: the same names, lower rates (a bucket of 5 per key, 3 per address)
CAND_LIMITS = {"key_hour": {"rate": 5, "period": "1h"},
               "anon_hour": {"rate": 3, "period": "1h"}}
TIERS = {"free": {"limits": ["key_hour"]}}
ANON = {"limits": ["anon_hour"]}
CANDIDATE = {"limits": CAND_LIMITS, "tiers": TIERS, "default_tier": "free",
             "anonymous": ANON}

# requests per client: API keys and anonymous source addresses
KEYS = {"cand-k1": 8, "cand-k2": 5, "cand-k3": 12, "cand-k4": 2}
SOURCES = {"127.0.0.2": 6, "127.0.0.3": 2}


def traffic():
    """The requests of a run, interleaved: (api_key, source) pairs."""
    reqs = [(k, None) for k, n in KEYS.items() for _ in range(n)]
    reqs += [(None, s) for s, n in SOURCES.items() for _ in range(n)]
    random.Random(11).shuffle(reqs)     # a fixed interleaving, the same in every run
    return reqs


def run(s, reqs):
    """Sends <reqs> through the gateway, 4 at a time; returns the responses in order."""
    def one(r):
        return s.get("/api/v1/thing", api_key=r[0], source=r[1])
    with ThreadPoolExecutor(4) as ex:
        return list(ex.map(one, reqs))


def top(a, section):
    """/top of agent <a>: {rule: (denied, distinct, {client: count})} for "rules" (the
    enforced policy) or "candidate"."""
    status, body = a.http("/top")
    assert status == 200, body
    doc = json.loads(body)
    return {r["rule"]: (r["denied"], r["distinct_clients"],
                        {e["client"]: e["count"] for e in r["top"]})
            for r in doc[section]}


@pytest.fixture
def gateway(redis, agent, haproxy):
    """Factory: gateway(**agent config) -> Stack (redis, agent with metrics, HAProxy); the
    agent's `tiers` are given here (stack() takes HAProxy's tier map)."""
    def start(**cfg):
        a = agent(redis=redis, metrics=True, **cfg)
        return Stack(redis, a, haproxy(a.address))
    return start


def published(a, pred, what):
    """The agent publishes its counters 4 times a second: waits until <pred>(scrape)."""
    return wait_until(lambda: pred(scrape(a)), 5, 0.1, what)


def test_candidate_reports_exactly_what_enforcing_it_denies(gateway, redis):
    """Run 1 enforces today's limits with a lower candidate: nothing is denied, no header
    names the candidate, and the candidate reports would-be denials. Run 2 enforces the
    candidate on the same traffic: its denials, client by client, are the ones run 1
    reported."""
    reqs = traffic()
    s1 = gateway(limits=TODAY_LIMITS, tiers=TIERS, anonymous=ANON,
               candidate=CANDIDATE)
    # the harness' readiness probes were decided too (or not, while Redis was not ready)
    m0 = scrape(s1.agent)
    allow0 = m0.get("spoa_ratelimit_candidate_decisions_total", result="would_allow")
    unev0 = m0.get("spoa_ratelimit_candidate_unevaluated_total")
    r1 = run(s1, reqs)
    assert [r.status for r in r1] == [200] * len(reqs), [r.status for r in r1]
    for r in r1:
        # the answer is today's: the candidate changes no header
        assert "q=100" in r.h("RateLimit-Policy"), r
        assert r.h("RateLimit-Limit") == "100", r
        assert r.h("X-RateLimit-Degraded") is None, r
    # its own states, next to today's (entry "c:key_hour" of the principal's key)
    assert limit_state(redis.cmd, key_principal("cand-k1"), "c:key_hour") is not None

    def cand_counts(m):
        got = {(x["tier"], x["rule"]): v for n, x, v in m.samples
               if n == "spoa_ratelimit_candidate_decisions_total"
               and x["result"] == "would_deny"}
        allowed = m.get("spoa_ratelimit_candidate_decisions_total",
                        result="would_allow") - allow0
        return (got, allowed, m) if sum(got.values()) + allowed == len(reqs) else None
    would, would_allow, m1 = published(s1.agent, cand_counts, "candidate counters")
    exp_keys = sum(max(0, n - 5) for n in KEYS.values())
    exp_anon = sum(max(0, n - 3) for n in SOURCES.values())
    assert would == {("free", "key_hour"): exp_keys, ("anonymous", "anon_hour"): exp_anon}
    assert would_allow == len(reqs) - exp_keys - exp_anon
    # every would-be denial is a new one: today allows all of them
    changes = {(x["tier"], x["rule"], x["change"]): v for n, x, v in m1.samples
               if n == "spoa_ratelimit_candidate_changes_total"}
    assert changes == {("free", "key_hour", "new_denial"): exp_keys,
                       ("anonymous", "anon_hour", "new_denial"): exp_anon}
    assert m1.get("spoa_ratelimit_candidate_unevaluated_total") == unev0
    # today's rules deny nobody
    assert top(s1.agent, "rules") == {}
    cand_top = top(s1.agent, "candidate")

    # run 2: the candidate enforced, same traffic, a fresh key space
    s2 = gateway(limits=CAND_LIMITS, tiers=TIERS, anonymous=ANON,
               redis_cfg={"key_prefix": "rl2"})
    r2 = run(s2, reqs)
    denied = {}
    for (key, src), r in zip(reqs, r2):
        assert r.status in (200, 429), r
        if r.status == 429:
            denied[key or src] = denied.get(key or src, 0) + 1
    assert denied == {c: n - lim for c, n, lim in
                      [(k, n, 5) for k, n in KEYS.items()] +
                      [(a, n, 3) for a, n in SOURCES.items()] if n > lim}
    published(s2.agent, lambda m: sum(
        v for n, x, v in m.samples if n == "spoa_ratelimit_decisions_total"
        and x["result"] == "denied") == exp_keys + exp_anon, "run 2 counters")
    real_top = top(s2.agent, "rules")
    # the same clients (fingerprints), the same counts, the same distinct clients
    assert cand_top == real_top, (cand_top, real_top)
    assert cand_top["key_hour"][0] == exp_keys and cand_top["key_hour"][1] == 2
    assert cand_top["anon_hour"][2] == {"127.0.0.2/32": 3}
    # and the Prometheus view says the same
    m2 = scrape(s2.agent)
    assert sorted((x["rule"], x["client"], v) for n, x, v in m1.samples
                  if n == "spoa_ratelimit_candidate_top_denied") == \
        sorted((x["rule"], x["client"], v) for n, x, v in m2.samples
               if n == "spoa_ratelimit_top_denied")


def test_lifted_denials_are_counted(gateway):
    """A candidate more generous than today: the requests today denies and it would allow
    are counted against today's rule; the answers stay today's (429)."""
    today = {"key_hour": {"rate": 3, "period": "1h"}, "anon_hour": {"rate": 3, "period": "1h"}}
    s = gateway(limits=today, tiers=TIERS, anonymous=ANON,
              candidate=dict(CANDIDATE, limits={
                  "key_hour": {"rate": 100, "period": "1h"},
                  "anon_hour": {"rate": 100, "period": "1h"}}))
    allow0 = scrape(s.agent).get("spoa_ratelimit_candidate_decisions_total", result="would_allow")
    statuses = [s.get("/", api_key="lift-1").status for _ in range(5)]
    assert statuses == [200] * 3 + [429] * 2

    def lifted(m):
        got = {(x["tier"], x["rule"], x["change"]): v for n, x, v in m.samples
               if n == "spoa_ratelimit_candidate_changes_total"}
        return got if got else None
    assert published(s.agent, lifted, "lifted denials") == \
        {("free", "key_hour", "lifted_denial"): 2}
    m = scrape(s.agent)
    assert m.get("spoa_ratelimit_candidate_decisions_total", tier="free", rule="-",
                 result="would_allow") - allow0 == 5
    assert top(s.agent, "candidate") == {}


def test_candidate_in_the_multi_form(agent, redis):
    """Pipelined decisions go to Redis several per script call; each query's candidate is
    a second decision of the same call. 120 requests of one key against a candidate of 50
    and a global endpoint limit only the candidate has: would-deny exactly 70, charged
    only for what the candidate admitted, no call more than the decisions."""
    cand = {"limits": {"c50": {"rate": 50, "period": "1h"}, "g80": {"rate": 80, "period": "1h"},
                       "a5": {"rate": 5, "period": "1h"}},
            "tiers": {"t": {"limits": ["c50"]}}, "default_tier": "t",
            "anonymous": {"limits": ["a5"]},
            "endpoints": LcList(
                [{"name": "all", "path_prefix": "/x", "global_limits": ["g80"]}])}
    a = agent(redis=redis, metrics=True,
              limits={"b500": {"rate": 500, "period": "1h"}, "anon5": {"rate": 5, "period": "1h"}},
              tiers={"t": {"limits": ["b500"]}}, default_tier="t",
              anonymous={"limits": ["anon5"]}, candidate=cand)
    allow0 = scrape(a).get("spoa_ratelimit_candidate_decisions_total", result="would_allow")
    msgs = [sc.rl_message(key="mf-hot", tier="t", path="/x") for _ in range(120)]
    vs = pipeline(a.addr, msgs, conns=4, window=64)
    assert all(v["allow"] == 1 and v.get("degraded") is None for v in vs)

    def counts(m):
        d = {x["result"]: v for n, x, v in m.samples
             if n == "spoa_ratelimit_candidate_decisions_total"}
        d["would_allow"] -= allow0
        return d if sum(d.values()) == 120 else None
    assert published(a, counts, "candidate counters") == {"would_allow": 50, "would_deny": 70}
    m = scrape(a)
    assert m.get("spoa_ratelimit_redis_batch_calls_total") > 0
    # the global bucket was charged 50 times (what the candidate admitted), not 120
    g = limit_state(redis.cmd, "g:all", "c:g80")
    assert g is not None
    # 80 per hour: 50 charged leave 30, one every 45 s; its TAT is ~50 x 45 s ahead
    t = redis.cmd("TIME")
    ahead_s = (int(g.split(":")[0]) - int(t[0]) * 1000000 - int(t[1])) / 1e6
    assert 50 * 45 - 60 < ahead_s <= 50 * 45, ahead_s


def test_promotion_keeps_unchanged_buckets(gateway, redis):
    """Promotion is a reload with the candidate's sections at the top level: a limit the
    candidate kept unchanged keeps its bucket (the same state: its entry in the principal's
    key, key layout 2), a new limit starts full, the candidate's own buckets ("c:" entries)
    are left to expire."""
    today = {"key_hour": {"rate": 5, "period": "1h"}, "anon_hour": {"rate": 3, "period": "1h"}}
    cand_limits = dict(today, key_burst={"rate": 3, "period": "1h"})
    cand_tiers = {"free": {"limits": ["key_hour", "key_burst"]}}
    s = gateway(limits=today, tiers=TIERS, anonymous=ANON,
              candidate={"limits": cand_limits, "tiers": cand_tiers, "default_tier": "free",
                         "anonymous": ANON})
    for i in range(3):
        r = s.get("/", api_key="promo-1")
        assert r.status == 200 and r.h("RateLimit-Remaining") == str(4 - i), r
    gen = scrape(s.agent).get("spoa_ratelimit_config_generation")
    cfg = dict(s.agent.cfg, limits=cand_limits, tiers=cand_tiers)
    del cfg["candidate"]
    s.agent.cfg = cfg
    s.agent.reload(text=to_libconfig(cfg))
    wait_until(lambda: scrape(s.agent).get("spoa_ratelimit_config_generation") == gen + 1,
               5, 0.1, "the reload")
    # key_hour has 2 left (carried over); key_burst is new and full (3): 2 more, then
    # key_hour denies
    got = [s.get("/", api_key="promo-1") for _ in range(3)]
    assert [r.status for r in got] == [200, 200, 429], got
    assert json.loads(got[2].body)["violated-policies"] == ["key_hour"]
    # the candidate's bucket of key_burst (3 charged) is not the new policy's
    assert limit_state(redis.cmd, key_principal("promo-1"), "c:key_burst") is not None


def check(tmp, text):
    p = tmp / "cand.conf"
    p.write_text(text)
    return subprocess.run([str(SPOA_BIN), "-c", "-f", str(p)], capture_output=True,
                          text=True, timeout=10)


BASE = """
store = "memory";
limits = { a = { rate = 5; period = "1m"; }; };
tiers = { free = { limits = [ "a" ]; }; };
anonymous = { limits = [ "a" ]; };
"""


def test_candidate_config_errors(tmp):
    """Bad candidate sections are errors with their line: unknown settings and limits,
    address grouping (the enforced policy's), more limits than one call decides."""
    r = check(tmp, BASE + 'candidate = { limits = { b = { rate = 1; period = "1m"; }; };\n'
              'tiers = { free = { limits = [ "b", "zz" ]; }; };\n'
              'anonymous = { limits = [ "b" ]; ipv4_prefix = 24; }; bogus = 1; };\n')
    assert r.returncode != 0
    assert "unknown setting 'bogus' in candidate" in r.stderr, r.stderr
    assert "refers to unknown limit 'zz'" in r.stderr, r.stderr
    assert "anonymous.ipv4_prefix is the enforced policy's" in r.stderr, r.stderr
    many = "".join('l%d = { rate = 1; period = "1m"; };' % i for i in range(16))
    names = ", ".join('"l%d"' % i for i in range(16))
    r = check(tmp, BASE + "candidate = { limits = { %s }; tiers = { free = { limits = [ %s ]; "
              "}; }; anonymous = { limits = [ \"l0\" ]; }; };\n" % (many, names))
    assert r.returncode != 0 and "at most 16 limits of both together" in r.stderr, r.stderr
    r = check(tmp, BASE + 'candidate = { limits = { b = { rate = 1; period = "1m"; }; };\n'
              'tiers = { free = { limits = [ "b" ]; }; }; anonymous = { limits = [ "b" ]; }; };\n')
    assert r.returncode == 0, r.stderr
    assert "candidate policy (1 tiers, 1 limits, 0 endpoints)" in r.stdout, r.stdout


def test_candidate_with_the_memory_store(agent):
    """The memory store decides a candidate the same way (one gateway, development)."""
    a = agent(metrics=True, store="memory", limits=TODAY_LIMITS, tiers=TIERS, anonymous=ANON,
              candidate=CANDIDATE)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="mem-1")]) for i in range(7)]
    assert all(v["allow"] == 1 for v in vs)
    assert published(a, lambda m: m.get("spoa_ratelimit_candidate_decisions_total", tier="free",
                                         rule="key_hour", result="would_deny") == 2 or None,
                     "candidate counters")


def test_candidate_global_denial_takes_back_the_principal_charge(agent, redis):
    """The candidate's endpoint global limit (2/h) denies after the principal's limit
    admitted: the charge of the principal's bucket is taken back, as when enforced. 5
    requests leave the candidate's principal bucket (3600/h, one token a second) charged
    twice, not five times."""
    cand = {"limits": {"c3600": {"rate": 3600, "period": "1h"}, "g2": {"rate": 2, "period": "1h"},
                       "a5": {"rate": 5, "period": "1h"}},
            "tiers": {"t": {"limits": ["c3600"]}}, "default_tier": "t",
            "anonymous": {"limits": ["a5"]},
            "endpoints": LcList(
                [{"name": "heavy", "path_prefix": "/x", "global_limits": ["g2"]}])}
    a = agent(redis=redis, metrics=True,
              limits={"b500": {"rate": 500, "period": "1h"}, "anon5": {"rate": 5, "period": "1h"}},
              tiers={"t": {"limits": ["b500"]}}, default_tier="t",
              anonymous={"limits": ["anon5"]}, candidate=cand)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="gl-1", tier="t", path="/x")])
              for i in range(5)]
    assert all(v["allow"] == 1 for v in vs)
    assert published(a, lambda m: m.get("spoa_ratelimit_candidate_decisions_total",
                                        rule="g2", result="would_deny") == 3 or None,
                     "candidate counters")
    # the refunds are sent after the answers: wait for the bucket to settle at 2 tokens
    p = key_principal("gl-1")

    def ahead():
        v, t = limit_state(redis.cmd, p, "c:c3600"), redis.cmd("TIME")
        s = (int(v.split(":")[0]) - int(t[0]) * 1000000 - int(t[1])) / 1e6
        return s if s < 2.5 else None
    assert 1.0 < wait_until(ahead, 3, 0.05, "the refunds") <= 2.0


def test_candidate_global_limits_of_another_endpoint_in_a_cluster(agent, redis_cluster):
    """In a Redis Cluster, a request whose endpoint has global limits in both policies under
    two names has two hash tags ({g:ea}, {g:eb}): one script call holding both would be
    refused (CROSSSLOT), the enforced answer degraded and the node's breaker opened. The
    candidate's go in a call of their own: nothing degraded, and the candidate's global
    limit (2/h) still decides: 2 would-be allowed, 3 would-be denied."""
    cl = redis_cluster(replicas=0)
    cand = {"limits": {"c": {"rate": 100, "period": "1h"}, "gb": {"rate": 2, "period": "1h"},
                       "a": {"rate": 100, "period": "1h"}},
            "tiers": {"t": {"limits": ["c"]}}, "default_tier": "t",
            "anonymous": {"limits": ["a"]},
            "endpoints": LcList(
                [{"name": "eb", "path_prefix": "/x", "global_limits": ["gb"]}])}
    a = agent(redis=cl.masters()[0], metrics=True,
              limits={"b": {"rate": 100, "period": "1h"}, "ga": {"rate": 100, "period": "1h"},
                      "an": {"rate": 100, "period": "1h"}},
              tiers={"t": {"limits": ["b"]}}, default_tier="t", anonymous={"limits": ["an"]},
              endpoints=LcList(
                  [{"name": "ea", "path_prefix": "/x", "global_limits": ["ga"]}]),
              candidate=cand)
    allow0 = scrape(a).get("spoa_ratelimit_candidate_decisions_total", result="would_allow")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="cx-%d" % i, tier="t", path="/x")])
              for i in range(5)]
    assert all(v["allow"] == 1 and v.get("degraded") is None for v in vs), vs

    def counts(m):
        d = {(x["rule"], x["result"]): v for n, x, v in m.samples
             if n == "spoa_ratelimit_candidate_decisions_total"}
        d[("-", "would_allow")] -= allow0
        return d if sum(d.values()) == 5 else None
    assert published(a, counts, "candidate counters") == \
        {("-", "would_allow"): 2, ("gb", "would_deny"): 3}
    assert "CROSSSLOT" not in a.proc.log_text()


def test_candidate_top_offenders_keep_a_long_rule_name(agent):
    """A limit name may have 64 characters: the candidate's top offenders and distinct
    clients are reported under the whole name, as the enforced ones are."""
    name = "candidate_limit_with_the_longest_name_a_limit_may_have_64_chars"
    name += "x" * (64 - len(name))
    a = agent(metrics=True, store="memory", limits=TODAY_LIMITS, tiers=TIERS, anonymous=ANON,
              candidate=dict(CANDIDATE, limits={name: {"rate": 1, "period": "1h"},
                                                "anon_hour": {"rate": 3, "period": "1h"}},
                             tiers={"free": {"limits": [name]}}))
    with sc.SpopClient(a.addr) as c:
        c.hello()
        vs = [c.request(2 * i + 1, 1, [sc.rl_message(key="long-1")]) for i in range(3)]
    assert all(v["allow"] == 1 for v in vs)
    published(a, lambda m: m.get("spoa_ratelimit_candidate_decisions_total", tier="free",
                                 rule=name, result="would_deny") == 2 or None,
              "candidate counters")
    got = wait_until(lambda: top(a, "candidate") or None, 5, 0.1, "candidate /top")
    assert list(got) == [name], got
    assert got[name][0] == 2
    m = scrape(a)
    assert m.get("spoa_ratelimit_candidate_denied_clients", rule=name) == 1


def test_candidate_rules_leave_room_for_the_enforced_top_offenders(agent):
    """Top offenders are kept for 64 rules per agent: a candidate with more rules that
    deny than that takes at most half of them, so the rules in force still show theirs in
    /top (a candidate used to be able to fill them all, hiding an incident's offenders)."""
    n = 70
    tiers = {"t%d" % i: {"limits": ["key_hour"]} for i in range(n)}
    tiers["tight"] = {"limits": ["tight_hour"]}
    limits = dict(TODAY_LIMITS, tight_hour={"rate": 1, "period": "1h"})
    cand_limits = {"c%d" % i: {"rate": 1, "period": "1h"} for i in range(n)}
    cand_limits["anon_hour"] = {"rate": 3, "period": "1h"}
    cand_tiers = {"t%d" % i: {"limits": ["c%d" % i]} for i in range(n)}
    a = agent(metrics=True, store="memory", limits=limits, tiers=tiers, anonymous=ANON,
              default_tier="t0",
              candidate={"limits": cand_limits, "tiers": cand_tiers, "default_tier": "t0",
                         "anonymous": ANON})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        sid = 1
        for i in range(n):
            for _ in range(2):
                v = c.request(sid, 1, [sc.rl_message(key="room-%d" % i, tier="t%d" % i)])
                assert v["allow"] == 1, v
                sid += 2
        vs = []
        for _ in range(2):
            vs.append(c.request(sid, 1, [sc.rl_message(key="room-victim", tier="tight")]))
            sid += 2
    assert [v["allow"] for v in vs] == [1, 0], vs
    got = wait_until(lambda: top(a, "rules") or None, 5, 0.1, "enforced /top")
    assert "tight_hour" in got and got["tight_hour"][0] == 1, got
    cand = top(a, "candidate")
    assert 0 < len(cand) <= 32, sorted(cand)


# ---------------------------------------------------------------------------------------
# Sampled mode: a candidate beside local quotas

def script_calls(redis):
    """Decision script calls so far (EVALSHA; the heartbeats are EVALs of their own)."""
    for line in redis.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_sampled_candidate_keeps_local_quotas_and_is_exact_for_its_clients(agent, redis):
    """candidate.mode = "sampled", sample = 0.5, beside an enforced limit with an
    accuracy_budget (local quotas). The same traffic (40 keys, 2 to 9 requests each, one
    after the other) through an exact candidate costs a script call per decision; through
    the sampled one, the clients out of the sample are decided locally (pre-checks), fewer
    calls. The sampled clients are those with candidate buckets in Redis, about half; their
    would-be denials are exactly what an exact run counts for them (a bucket of 5 per
    hour: a client of n requests, n - 5 of them), and the others have none."""
    big = {"rate": 1000000, "period": "1h", "accuracy_budget": 0.2}
    cand = {"limits": {"c5": {"rate": 5, "period": "1h"}, "a5": {"rate": 5, "period": "1h"}},
            "tiers": {"t": {"limits": ["c5"]}}, "default_tier": "t",
            "anonymous": {"limits": ["a5"]}}
    sends = {"smp-%d" % i: 2 + i % 8 for i in range(40)}
    msgs = [sc.rl_message(key=k, tier="t") for k, n in sends.items() for _ in range(n)]

    def one_run(prefix, mode):
        a = agent(redis=redis, metrics=True, limits={"big": big},
                  tiers={"t": {"limits": ["big"]}}, default_tier="t",
                  anonymous={"limits": ["big"]}, local_quota={"leases": False},
                  redis_cfg={"key_prefix": prefix}, candidate=dict(cand, **mode))
        wait_until(lambda: scrape(a).get("spoa_ratelimit_gateways") == 1, 5,
                   what="the gateway counted (local quotas on)")
        m0 = scrape(a)
        calls0 = script_calls(redis)
        with sc.SpopClient(a.addr) as c:
            c.hello()
            vs = [c.request(2 * i + 1, 1, [m]) for i, m in enumerate(msgs)]
        assert all(v["allow"] == 1 and v.get("degraded") is None for v in vs), vs
        calls = script_calls(redis) - calls0

        def would(m):
            return {r: m.get("spoa_ratelimit_candidate_decisions_total", tier="t", rule=r2,
                             result=r) - m0.get("spoa_ratelimit_candidate_decisions_total",
                                                tier="t", rule=r2, result=r)
                    for r, r2 in (("would_allow", "-"), ("would_deny", "c5"))}
        sampled = [k for k in sends
                   if limit_state(redis.cmd, key_principal(k), "c:c5", prefix) is not None]
        want = {"would_allow": sum(min(sends[k], 5) for k in sampled),
                "would_deny": sum(max(0, sends[k] - 5) for k in sampled)}
        published(a, lambda m: would(m) == want or None, "candidate counts %r" % want)
        a.stop()
        return calls, sampled

    exact_calls, exact_sampled = one_run("rlx", {})
    assert exact_sampled == list(sends)
    assert exact_calls >= len(msgs)
    calls, sampled = one_run("rls", {"mode": "sampled", "sample": 0.5})
    assert 5 <= len(sampled) <= 35, sampled
    assert calls < exact_calls, (calls, exact_calls)
    # every request of a sampled client went to Redis
    assert calls >= sum(sends[k] for k in sampled), (calls, sampled)


def test_sampled_candidate_config(tmp):
    """mode and sample are checked; -c says which mode."""
    cand = ('candidate = { limits = { b = { rate = 1; period = "1m"; }; }; '
            'tiers = { free = { limits = [ "b" ]; }; }; anonymous = { limits = [ "b" ]; };\n')
    r = check(tmp, BASE + cand + 'mode = "sampled"; sample = 0.25; };\n')
    assert r.returncode == 0, r.stderr
    assert "candidate policy (1 tiers, 1 limits, 0 endpoints), sampled: 25% of the clients" \
        in r.stdout, r.stdout
    r = check(tmp, BASE + cand + 'mode = "sampled"; };\n')
    assert "sampled: 10% of the clients" in r.stdout, r.stdout
    r = check(tmp, BASE + cand + '};\n')
    assert "candidate policy (1 tiers, 1 limits, 0 endpoints), exact" in r.stdout, r.stdout
    for bad, msg in (('mode = "sometimes";', "candidate: mode 'sometimes': use \"exact\" or "
                      "\"sampled\""),
                     ('sample = 0.5;', "candidate: 'sample' is for mode = \"sampled\""),
                     ('mode = "sampled"; sample = 0.0;', "'sample' must be a fraction above 0"),
                     ('mode = "sampled"; sample = 1.5;', "'sample' must be a fraction above 0"),
                     ('mode = "sampled"; sample = "half";', "'sample' must be a fraction")):
        r = check(tmp, BASE + cand + bad + ' };\n')
        assert r.returncode != 0 and msg in r.stderr, (bad, r.stderr)


def test_sampled_candidate_scales_its_global_limits(agent, redis):
    """A sampled candidate's endpoint global limit (shared by every client) sees only the
    sampled clients' requests: its rate and burst are scaled by the sample. At 0.5, a global
    limit of 10 an hour would deny a sampled client's 6th request, not its 11th."""
    cand = {"limits": {"c100": {"rate": 100, "period": "1h"}, "g10": {"rate": 10, "period": "1h"},
                       "a5": {"rate": 5, "period": "1h"}},
            "tiers": {"t": {"limits": ["c100"]}}, "default_tier": "t",
            "anonymous": {"limits": ["a5"]}, "mode": "sampled", "sample": 0.5,
            "endpoints": LcList(
                [{"name": "all", "path_prefix": "/x", "global_limits": ["g10"]}])}
    a = agent(redis=redis, metrics=True,
              limits={"b500": {"rate": 500, "period": "1h"}, "anon5": {"rate": 5, "period": "1h"}},
              tiers={"t": {"limits": ["b500"]}}, default_tier="t",
              anonymous={"limits": ["anon5"]}, candidate=cand)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        # a client in the sample: the first whose request leaves a candidate bucket
        sid = 1
        for i in range(64):
            key = "gs-%d" % i
            c.request(sid, 1, [sc.rl_message(key=key, tier="t", path="/y")])
            sid += 2
            if limit_state(redis.cmd, key_principal(key), "c:c100") is not None:
                break
        else:
            pytest.fail("no sampled client among 64 at sample 0.5")
        m0 = scrape(a)
        for _ in range(8):
            v = c.request(sid, 1, [sc.rl_message(key=key, tier="t", path="/x")])
            sid += 2
            assert v["allow"] == 1 and v.get("degraded") is None, v

    def counts(m):
        d = {r: m.get("spoa_ratelimit_candidate_decisions_total", tier="t", rule=rule,
                      result=r) - m0.get("spoa_ratelimit_candidate_decisions_total", tier="t",
                                         rule=rule, result=r)
             for r, rule in (("would_allow", "-"), ("would_deny", "g10"))}
        return d if sum(d.values()) == 8 else None
    assert published(a, counts, "candidate counters") == {"would_allow": 5, "would_deny": 3}
