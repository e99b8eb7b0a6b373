"""The status page (src/observe/status.c): /status and /status.json on the metrics listener, with the
counts a test drove; the overrides shown beside the offenders; `spoa-ratelimit ctl status`;
and the page in a real headless browser (Debian's chromium), with traffic flowing and then with
Redis stopped, a screenshot of each kept beside the test's logs."""
import base64
import hashlib
import html.parser
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

import spop_client as sc
from conftest import (SPOA_BIN, agent_config, agent_env, check_config, free_port, http_request,
                      to_libconfig, wait_until)
from test_ops import fingerprint, pipeline
from test_overrides import ctl, ctl_ok

LIMITS = {"key_rpm": {"rate": 5, "period": "1h", "on_failure": "open"},
          "anon_rpm": {"rate": 3, "period": "1h", "on_failure": "open"}}
TIERS = {"free": {"limits": ["key_rpm"]}}
STEP_S = 5                      # MET_HIST_STEP_S

# /status.json, schema 1: every panel's fields (name: JSON types allowed) and tables
# (name: columns). Exact: a field or column added or removed must be added here too.
NUM, INT, STR, BOOL, NULL = (float, int), (int,), (str,), (bool,), (type(None),)
SCHEMA = {
    "decisions": ({"allowed": NUM, "denied": NUM, "shadow_denied": NUM, "degraded": NUM,
                   "local": NUM, "total": INT, "step_s": INT, "latency_p50_ms": NUM + NULL,
                   "latency_p99_ms": NUM + NULL},
                  {"series": ["t", "allowed", "denied", "shadow_denied", "degraded", "local"],
                   "rules": ["tier", "rule", "allowed", "denied", "shadow_denied", "degraded",
                             "local"]}),
    "redis": ({"health": STR + NULL, "oldest_ms": INT, "down": INT, "breaker_open": INT,
               "breaker_opened": INT, "concurrency_limit": INT, "pending": INT, "queued": INT,
               "shed": INT, "late": INT, "commands": INT},
              {"nodes": ["name", "state", "oldest_ms", "breaker_open", "limit", "in_flight",
                         "queued", "p50_ms", "p90_ms", "p99_ms", "replies", "errors",
                         "down_since", "trouble"],
               "errors": ["class", "count"]}),
    "degraded": ({"total": INT, "rate": NUM, "fallback": STR},
                 {"reasons": ["reason", "count"], "ladder": ["answer", "count"]}),
    "denials": ({"denied_share": NUM, "recent_share": NUM, "baseline_share": NUM + NULL,
                 "red_from": NUM + NULL, "blocked": INT, "concurrency_held": INT,
                 "concurrency_released": INT, "concurrency_release_lost": INT},
                {"rules": ["rule", "denied", "distinct_clients"],
                 "offenders": ["rule", "rank", "client", "denied", "error", "override"]}),
    "quotas": ({"enabled": BOOL, "keys": INT, "lease_grants": INT,
                "lease_calls_per_decision": NUM, "outstanding": INT, "unreported": INT,
                "report_lost": INT, "untracked": INT, "gateways": INT}, {}),
    "candidate": ({"configured": BOOL, "enforced_denied": INT, "would_deny": INT,
                   "new_denials": INT, "lifted": INT, "unevaluated": INT},
                  {"rules": ["tier", "rule", "would_deny", "new_denials"],
                   "lifted_rules": ["tier", "rule", "lifted"],
                   "candidate_clients": ["rule", "denied", "distinct_clients"],
                   "candidate_offenders": ["rule", "rank", "client", "denied", "error"]}),
    "overrides": ({"enabled": BOOL, "entries": INT, "blocked": INT, "limited": INT,
                   "poll_errors": INT, "skipped": INT}, {}),
    "agent": ({"state": STR, "version": STR, "now": INT, "uptime_s": INT, "workers": INT,
               "generation": INT, "reloads_ok": INT, "reloads_failed": INT,
               "last_reload": STR + NULL, "last_reload_ok": BOOL + NULL, "store": STR,
               "ready": BOOL, "spop_connections": INT}, {}),
}
# the node states (doc/operations.md, The status page)
NODE_STATES = ("ready", "not answering", "handshake", "connecting", "disconnected")
CELL_TYPES = (int, float, str, bool, type(None))


CACHE_S = 0.25                  # STATUS_CACHE_S: a page is rendered at most this often


def status_json(a):
    """/status.json as it is now: asked once the page rendered before this call is stale."""
    time.sleep(CACHE_S + 0.05)
    status, body = a.http("/status.json")
    assert status == 200, body
    return json.loads(body)


def check_schema(j):
    """<j> is exactly /status.json schema 1: the keys, their order of panels, the types."""
    assert list(j) == ["schema", "state", "causes", "alerts"] + list(SCHEMA)
    assert j["schema"] == 1 and j["state"] in ("ok", "degraded", "not ready")
    assert set(j["alerts"]) == set(SCHEMA) and all(type(v) is bool for v in j["alerts"].values())
    # every red panel says why at the top, and every cause names a red panel
    for c in j["causes"]:
        assert list(c) == ["panel", "what", "since"] and type(c["what"]) is str and c["what"]
        assert c["since"] is None or type(c["since"]) is int, c
    assert {c["panel"] for c in j["causes"]} == {k for k, v in j["alerts"].items() if v}, j
    assert all(n["state"] in NODE_STATES for n in j["redis"]["nodes"])
    for name, (fields, tables) in SCHEMA.items():
        panel = j[name]
        assert list(panel) == list(fields) + list(tables), name
        for k, types in fields.items():
            v = panel[k]
            assert type(v) in types, (name, k, v)
        for k, cols in tables.items():
            assert isinstance(panel[k], list), (name, k)
            for row in panel[k]:
                assert list(row) == cols, (name, k, row)
                assert all(type(v) in CELL_TYPES for v in row.values()), (name, k, row)


def rows(j, panel, table, **match):
    return [r for r in j[panel][table] if all(r[k] == v for k, v in match.items())]


def status_agent(agent, redis, **over):
    cfg = dict(limits=LIMITS, tiers=TIERS, default_tier="free",
               redis_cfg={"command_timeout_ms": 2000})
    cfg.update(over)
    return agent(redis=redis, metrics=True, **cfg)


def series_sum(j, key):
    """The decisions of result <key> the history counts (its rates times the step)."""
    return round(sum(p[key] for p in j["decisions"]["series"]) * STEP_S)


def test_status_json_schema_and_what_the_test_drove(agent, redis):
    """The counts on the page are the decisions the test sent: 25 denials of one key by
    key_rpm, 2 of an anonymous address by anon_rpm; the offender by its fingerprint, never its
    key; the Redis node the agent talks to; the history adds up to the same denials."""
    a = status_agent(agent, redis)
    # two points of history before the traffic, so that it all falls in its steps
    wait_until(lambda: len(status_json(a)["decisions"]["series"]) >= 1, 3 * STEP_S, 0.2,
               "the history's first step")
    base = status_json(a)
    msgs = [sc.rl_message(key="status-heavy")] * 30
    msgs += [sc.rl_message(key="status-light-%d" % i) for i in range(20)]
    msgs += [sc.rl_message(ip="10.1.2.3")] * 5
    acks = pipeline(a.addr, msgs)
    assert not any(v.get("degraded") for v in acks)
    assert sum(v["allow"] == 0 for v in acks) == 27

    j = status_json(a)
    check_schema(j)
    assert j["state"] == "ok" and j["agent"]["ready"] is True
    assert j["agent"]["generation"] == 1 and j["agent"]["workers"] == 1
    assert j["agent"]["store"] == "redis" and j["agent"]["version"]
    [key_row] = rows(j, "decisions", "rules", tier="free", rule="key_rpm")
    assert key_row["denied"] == 25
    assert key_row["allowed"] - rows(base, "decisions", "rules", tier="free",
                                     rule="key_rpm")[0]["allowed"] == 25
    [anon_row] = rows(j, "decisions", "rules", rule="anon_rpm")
    assert anon_row["denied"] == 2 and anon_row["allowed"] == 3
    assert rows(j, "denials", "rules", rule="key_rpm") == [
        {"rule": "key_rpm", "denied": 25, "distinct_clients": 1}]
    assert rows(j, "denials", "offenders", rule="key_rpm") == [
        {"rule": "key_rpm", "rank": 1, "client": fingerprint("status-heavy"), "denied": 25,
         "error": 0, "override": None}]
    [anon_top] = rows(j, "denials", "offenders", rule="anon_rpm")
    assert anon_top["client"] == "10.1.2.3/32" and anon_top["denied"] == 2
    [node] = j["redis"]["nodes"]
    assert node["name"] == redis.address and node["state"] == "ready"
    assert node["breaker_open"] is False and node["replies"] > 0 and node["errors"] == 0
    assert node["p50_ms"] is not None and node["p50_ms"] <= node["p99_ms"]
    assert j["redis"]["health"] is None and j["redis"]["breaker_open"] == 0
    # the harness's first probes may have met a Redis not connected yet: count from the base
    assert j["degraded"]["total"] == base["degraded"]["total"]
    assert j["candidate"]["configured"] is False and j["quotas"]["enabled"] is False
    body = json.dumps(j) + a.http("/status")[1]
    assert "status-heavy" not in body and "status-light" not in body
    # the history: every decision since the base falls in its steps
    got = wait_until(lambda: (lambda s: s if series_sum(s, "denied") - series_sum(base, "denied")
                              >= 27 else None)(status_json(a)), 3 * STEP_S, 0.2,
                     "the denials in the history")
    assert series_sum(got, "denied") - series_sum(base, "denied") == 27
    assert series_sum(got, "allowed") - series_sum(base, "allowed") == 28


class Page(html.parser.HTMLParser):
    """What a page shows: the text of each element with a data-k, each table's body rows
    by data-t, each section's classes, the text of #state and #live, the scripts."""

    def __init__(self, text):
        super().__init__()
        self.values, self.tables, self.sections, self.ids = {}, {}, {}, {}
        self.scripts, self.styles, self._stack = [], [], []
        self._table = self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._stack.append((tag, a.get("data-k"), a.get("id"), []))
        if tag == "section":
            self.sections[a.get("id")] = (a.get("class") or "").split()
        elif tag == "table":
            self._table = self.tables.setdefault(a.get("data-t"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag == "script":
            self.scripts.append(a)

    def handle_endtag(self, tag):
        while self._stack:
            t, k, ident, text = self._stack.pop()
            s = "".join(text)
            if self._stack:
                self._stack[-1][3].append(s)
            if k:
                self.values[k] = s
            if ident:
                self.ids[ident] = s
            if t == "td" and self._row is not None:
                self._row.append(s)
            if t == "tr" and self._row is not None:
                if self._row:
                    self._table.append(self._row)
                self._row = None
            if t == "table":
                self._table = None
            if t == tag:
                break

    def handle_data(self, data):
        if self._stack:
            self._stack[-1][3].append(data)


def csp_hash(text):
    return "'sha256-%s'" % base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_status_page_headers_snapshot_and_hostile_clients(agent, redis, tmp):
    """/status without a script is the whole snapshot; its CSP allows its own inline script
    and style by hash and nothing else; raw API keys, even made of markup, never appear."""
    a = status_agent(agent, redis)
    hostile = ['<script>alert(1)</script>', '"><img src=x onerror=alert(2)>', "k:&amp;"]
    msgs = [sc.rl_message(key=k) for k in hostile for _ in range(7)]
    pipeline(a.addr, msgs)
    r = http_request(a.metrics_addr, "/status")
    assert r.status == 200
    assert r.h("content-type") == "text/html; charset=utf-8"
    assert r.h("x-content-type-options") == "nosniff"
    assert r.h("referrer-policy") == "no-referrer"
    body = r.body.decode()
    script = body.split("<script>", 1)[1].split("</script>", 1)[0]
    style = body.split("<style>", 1)[1].split("</style>", 1)[0]
    assert r.h("content-security-policy") == (
        "default-src 'none'; script-src %s; style-src %s; img-src data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        % (csp_hash(script), csp_hash(style)))
    assert body.count("<script") == 1 and body.count("<style") == 1
    for k in hostile:
        assert k not in body and k.replace("<", "&lt;") not in body
    p = Page(body)
    offenders = p.tables["denials.offenders"]
    assert sorted((row[2], row[3]) for row in offenders) == sorted(
        (fingerprint(k), "2") for k in hostile)
    assert p.tables["denials.rules"] == [["key_rpm", "6", "3"]]
    assert p.values["agent.generation"] == "1" and p.values["state"] == "ok"
    assert p.ids["live"] == "snapshot"           # no script ran: the server's first paint
    head = http_request(a.metrics_addr, "/status", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert head.h("content-security-policy") == r.h("content-security-policy")
    j = http_request(a.metrics_addr, "/status.json")
    assert j.h("content-type") == "application/json" and "<" not in j.body.decode()
    # a rule's name is from the configuration, which keeps it to a safe alphabet
    cfg = agent_config("127.0.0.1:1", limits={"<b>x</b>": {"rate": 1, "period": "1m"}},
                       tiers={"free": {"limits": ["<b>x</b>"]}}, default_tier="free",
                       anonymous={"limits": ["<b>x</b>"]})
    assert check_config(tmp, cfg).returncode != 0


def test_status_shows_the_override_of_each_offender(agent, redis):
    """A blocked key, a key under a limit override and an address inside a blocked prefix:
    each offender's row names the override that applies, with its author and reason."""
    a = status_agent(agent, redis)
    ctl_ok(a, "block", "key:ovr-blocked", "--for", "10m", "--reason", "stuffing", "--by", "oncall")
    ctl_ok(a, "limit", "key:ovr-limited", "--for", "10m", "--rate", "key_rpm=2", "--by", "sre")
    ctl_ok(a, "block", "ip:10.9.0.0/16", "--for", "10m", "--reason", "scanner", "--by", "oncall")
    # the three in force (a poll between two ctl calls may load the first ones only)
    wait_until(lambda: status_json(a)["overrides"]["entries"] == 3, 5, 0.05,
               "the overrides loaded")
    msgs = [sc.rl_message(key="ovr-blocked")] * 3 + [sc.rl_message(key="ovr-limited")] * 6
    msgs += [sc.rl_message(ip="10.9.1.2")] * 4 + [sc.rl_message(key="ovr-none")] * 7
    pipeline(a.addr, msgs)
    j = status_json(a)
    check_schema(j)
    by_client = {r["client"]: r for r in j["denials"]["offenders"]}
    blocked = by_client[fingerprint("ovr-blocked")]
    assert blocked["rule"] == "blocked"
    assert blocked["override"].startswith("block until ")
    assert blocked["override"].endswith(" by oncall: stuffing")
    limited = by_client[fingerprint("ovr-limited")]
    assert limited["rule"] == "key_rpm" and limited["denied"] == 4
    assert limited["override"].startswith("limit key_rpm=2 until ")
    assert limited["override"].endswith(" by sre")
    scanner = by_client["10.9.1.2/32"]
    assert scanner["rule"] == "blocked" and scanner["denied"] == 4
    assert scanner["override"].endswith(" by oncall: scanner")
    assert by_client[fingerprint("ovr-none")]["override"] is None
    assert j["overrides"]["entries"] == 3 and j["denials"]["blocked"] >= 7
    p = Page(a.http("/status")[1])
    assert any(row[2] == "10.9.1.2/32" and row[5].endswith("by oncall: scanner")
               for row in p.tables["denials.offenders"])


def test_ctl_status_once_and_watching(agent, redis, tmp):
    a = status_agent(agent, redis)
    pipeline(a.addr, [sc.rl_message(key="ctl-status-heavy")] * 9)
    rc, out, err = ctl(a, "status")
    assert rc == 0, err
    host, port = a.metrics_addr
    assert out.startswith("spoa-ratelimit ") and " at %s:%d: ok\n" % (host, port) in out
    for panel in SCHEMA:
        assert "\n== %s" % panel in out
    line = [ln for ln in out.splitlines() if fingerprint("ctl-status-heavy") in ln]
    assert len(line) == 1 and line[0].split()[:5] == [
        "key_rpm", "1", fingerprint("ctl-status-heavy"), "4", "0"]
    assert "ctl-status-heavy" not in out
    rc, out, err = ctl(a, "status", "--watch", "0.2", "-n", "3")
    assert rc == 0 and out.count("\n== agent") == 3, (out, err)
    assert "\033[2J" not in out                   # not a terminal: no screen clearing
    rc, out, err = ctl(a, "status", "--watch", "0.1")
    assert rc == 2 and "--watch" in err
    # --address needs no configuration file: none is read without -f (one that cannot
    # be read is no obstacle), and the exit status tells fine (0) from no answer (3)
    addr = "%s:%d" % (host, port)
    r = subprocess.run([str(SPOA_BIN), "ctl", "status", "--address", addr],
                       capture_output=True, text=True, timeout=20, env=agent_env())
    assert r.returncode == 0 and " at %s: ok\n" % addr in r.stdout, (r.returncode, r.stderr)
    a.stop()
    rc, out, err = ctl(a, "status")
    assert rc == 3 and "Connection refused" in err and out == ""
    # watching an agent that does not answer: said, with since when, and asked again
    rc, out, err = ctl(a, "status", "--watch", "0.2", "-n", "3")
    assert rc == 3 and out.count("agent at %s not answering since " % addr) == 3, (out, err)
    cfg = dict(a.cfg)
    cfg.pop("metrics")
    a.conf_path.write_text(to_libconfig(cfg))
    rc, out, err = ctl(a, "status")
    assert rc == 2 and "metrics.listen is not set" in err
    a.conf_path.write_text("this is { not a configuration")
    rc, out, err = ctl(a, "status")
    assert rc == 2, (rc, err)


def test_ctl_status_exits_1_when_the_agent_says_something_is_wrong(agent, tmp):
    """Redis unreachable from the start (nobody on its port): the agent answers, its state
    is not ok: 1."""
    a = agent(redis=None, metrics=True, wait_redis=False, store="redis",
              redis_cfg={"address": "127.0.0.1:%d" % free_port()})
    wait_until(lambda: ctl(a, "status")[0] == 1, 10, 0.2, "state not ok")
    rc, out, err = ctl(a, "status")
    assert rc == 1 and ": ok\n" not in out.splitlines()[0] + "\n", out


# ---------------------------------------------------------------------------------------
# The page in a real browser

CHROMIUM = shutil.which("chromium")


def run_browser(argv, env, timeout=90):
    """Runs chromium in a session of its own: on a timeout, it and the helpers it started
    (its process group, whose id is its pid) are killed. (status, stdout, stderr)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return p.returncode, out, err


def browse(tmp, url, name):
    """Loads <url> in headless chromium with a virtual time budget (the page's script runs,
    fetches /status.json once and rewrites the page): the DOM as it then is, and a
    screenshot <tmp>/<name>.png. Fails on any Content-Security-Policy violation."""
    prof = tmp / ("chromium-" + name)
    prof.mkdir()
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions", "--disable-sync", "--hide-scrollbars",
            "--enable-logging=stderr", "--user-data-dir=%s" % prof,
            "--virtual-time-budget=4000", "--window-size=1280,1700"]
    env = dict(os.environ, HOME=str(prof))
    rc, dom, err = run_browser(argv + ["--dump-dom", url], env)
    assert rc == 0, err[-3000:]
    # chromium logs what the page's console says: a CSP refusal would be there
    assert "Content Security Policy" not in err, err[-3000:]
    shot = tmp / (name + ".png")
    rc, _, err = run_browser(argv + ["--screenshot=%s" % shot, url], env)
    assert rc == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", err[-3000:]
    print("screenshot: %s" % shot)
    return Page(dom)


class Traffic(threading.Thread):
    """Decisions at a steady pace on one SPOP connection until stopped (bounded)."""

    def __init__(self, addr, keys, limit=6000):
        super().__init__(daemon=True)
        self.addr, self.keys, self.limit = addr, keys, limit
        self.stopping = threading.Event()
        self.sent = 0

    def run(self):
        with sc.SpopClient(self.addr, timeout=5) as c:
            c.hello()
            while not self.stopping.is_set() and self.sent < self.limit:
                key = self.keys[self.sent % len(self.keys)]
                c.request(2 * self.sent + 1, 1, [sc.rl_message(key=key)])
                self.sent += 1
                self.stopping.wait(0.01)

    def stop(self):
        self.stopping.set()
        self.join(15)


@pytest.mark.skipif(CHROMIUM is None,
                    reason="chromium is not installed (Debian package chromium: make deps)")
def test_status_page_in_a_browser_traffic_then_redis_stopped(agent, redis, tmp):
    """The page in chromium: its script runs under its own CSP, fetches /status.json and shows
    the denials of the rule the test drives; then Redis is frozen (SIGSTOP): the breaker
    opens, the Redis and degraded panels turn red, degraded answers are counted by reason and by
    what the failure ladder answered."""
    a = status_agent(agent, redis, redis_cfg={"command_timeout_ms": 300,
                                              "breaker_cooldown_ms": 600000})
    url = "http://%s:%d/status" % a.metrics_addr
    traffic = Traffic(a.addr, ["browser-heavy"] * 3 + ["browser-light-%d" % i for i in range(50)])
    traffic.start()
    try:
        # a step with denials and no degraded answer (the harness's first probes may have
        # met a Redis not connected yet)
        wait_until(lambda: (lambda s: s and s[-1]["denied"] > 0 and s[-1]["degraded"] == 0)(
                   status_json(a)["decisions"]["series"]), 6 * STEP_S, 0.2,
                   "denials in the history")
        p = browse(tmp, url, "status-traffic")
    finally:
        traffic.stop()
    assert p.ids["live"].startswith("live, "), p.ids     # the script ran and fetched the JSON
    assert p.values["state"] == "ok"
    heavy = [row for row in p.tables["denials.offenders"]
             if row[0] == "key_rpm" and row[2] == fingerprint("browser-heavy")]
    assert len(heavy) == 1 and int(heavy[0][3]) > 0
    assert [row for row in p.tables["denials.rules"] if row[0] == "key_rpm"]
    assert "red" not in p.sections["redis"] and "red" not in p.sections["degraded"]
    [node] = p.tables["redis.nodes"]
    assert node[0] == redis.address and node[1] == "ready" and node[3] == "no"

    redis.proc.signal(signal.SIGSTOP)
    try:
        traffic = Traffic(a.addr, ["browser-heavy", "browser-after"])
        traffic.start()
        try:
            j = wait_until(lambda: (lambda s: s if s["alerts"]["redis"] and
                                    s["alerts"]["degraded"] and
                                    s["redis"]["breaker_open"] == 1 else None)(status_json(a)),
                           4 * STEP_S, 0.2, "the breaker open, the Redis and degraded panels red")
            p = browse(tmp, url, "status-redis-stopped")
        finally:
            traffic.stop()
        assert p.ids["live"].startswith("live, ")
        assert p.values["state"] in ("degraded", "not ready")
        assert "red" in p.sections["redis"] and "red" in p.sections["degraded"]
        assert p.values["redis.breaker_open"] == "1"
        assert p.values["redis.health"] != "-"
        reasons = {row[0]: int(row[1]) for row in p.tables["degraded.reasons"]}
        # the first ones time out; then the stall drops the connection and the breaker is open
        assert reasons["timeout"] > 0 and reasons["down"] + reasons["breaker"] > 0, reasons
        ladder = {row[0]: int(row[1]) for row in p.tables["degraded.ladder"]}
        assert ladder["open (allowed, no verdict)"] > 0, ladder
        [node] = p.tables["redis.nodes"]
        assert node[3] == "yes" and node[1] in ("not answering", "disconnected")
    finally:
        redis.proc.signal(signal.SIGCONT)


def test_the_page_is_rendered_at_most_every_quarter_second(agent, redis):
    """A flood of /status.json gets the page rendered once per STATUS_CACHE_S and copied
    meanwhile (a render costs the loop ~0.1-0.7 ms, a copy microseconds): denials driven
    right after a request do not show in a request within the same quarter second, and do
    once it has passed."""
    a = status_agent(agent, redis)

    def denied():
        j = json.loads(a.http("/status.json")[1])
        r = rows(j, "denials", "rules", rule="key_rpm")
        return r[0]["denied"] if r else 0

    for attempt in range(5):            # a slow machine may take the quarter second itself
        time.sleep(CACHE_S + 0.05)
        t0 = time.monotonic()
        before = denied()
        pipeline(a.addr, [sc.rl_message(key="cache-heavy-%d" % attempt)] * 6)  # 1 denied
        during = denied()
        if time.monotonic() - t0 < CACHE_S * 0.8:
            break
    assert during == before, (before, during)
    time.sleep(CACHE_S + 0.05)
    assert denied() == before + 1


# ---------------------------------------------------------------------------------------
# The first screen, measured in the browser over the DevTools protocol (cdp.py)

# STATUS_SCREENSHOTS=DIR: the screenshots of doc/operations.md are written there (make
# screenshots); otherwise beside the test's logs
SHOTS = os.environ.get("STATUS_SCREENSHOTS")


def shot(b, tmp, name):
    from pathlib import Path
    path = (Path(SHOTS) if SHOTS else tmp) / ("status-%s.png" % name)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = b.screenshot(path, colors=128 if SHOTS else None)   # the documentation's: small
    print("screenshot: %s (%d bytes)" % (path, n))


def cause_rect(b, words):
    """The box of the first cause at the top of the page whose text holds <words>."""
    return b.eval("(function(){var l=[].slice.call(document.querySelectorAll('#causelist li'))"
                  ".filter(function(e){return e.textContent.indexOf(%s)>=0;})[0];if(!l)return null;"
                  "var r=l.getBoundingClientRect();return {x:r.left+scrollX,y:r.top+scrollY,"
                  "w:r.width,h:r.height,text:l.textContent};})()" % json.dumps(words))


def no_overflow(b):
    return b.eval("[document.documentElement.scrollWidth, innerWidth]")


def prom_value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.skipif(CHROMIUM is None,
                    reason="chromium is not installed (Debian package chromium: make deps)")
def test_status_first_screen_names_a_frozen_redis(agent, redis, tmp):
    """Traffic, then Redis frozen (SIGSTOP): at 1280x800 the cause naming Redis is at the top
    of the page, within the first 800 px, with its state "not answering" and the age of its
    oldest command unanswered (also in /status.json and /metrics, growing past a second
    while the replies' p99 sees nothing); what answers meanwhile is said; nothing is wider
    than the screen; at 390 px (a phone) the cause is on the first screen too. Redis back:
    the causes and the degraded panel go."""
    import cdp
    a = status_agent(agent, redis, redis_cfg={"command_timeout_ms": 300,
                                              "breaker_cooldown_ms": 600000})
    url = "http://%s:%d/status" % a.metrics_addr
    traffic = Traffic(a.addr, ["first-heavy"] * 3 + ["first-light-%d" % i for i in range(50)])
    traffic.start()
    with cdp.Browser(tmp, "first") as b:
        try:
            # (the documentation's pictures: a few steps of history for the chart)
            wait_until(lambda: (lambda s: len(s) >= (4 if SHOTS else 1) and s[-1]["denied"] > 0)(
                       status_json(a)["decisions"]["series"]), 8 * STEP_S, 0.2,
                       "denials in the history")
            b.viewport(1280, 800)
            b.goto(url)
            b.wait("document.getElementById('live').textContent.indexOf('live, ')==0")
            assert b.eval("document.getElementById('verdict').textContent") == \
                "Nothing wrong: every panel is green"
            width, inner = no_overflow(b)
            assert width <= 1280 and inner == 1280, (width, inner)
            shot(b, tmp, "normal")
            redis.proc.signal(signal.SIGSTOP)
            try:
                j = wait_until(lambda: (lambda s: s if any(
                    n["state"] == "not answering" and n["oldest_ms"] >= 1000
                    for n in s["redis"]["nodes"]) else None)(status_json(a)),
                    6 * STEP_S, 0.2, "the node not answering for a second")
                check_schema(j)
                assert j["alerts"]["redis"] and j["alerts"]["degraded"]
                assert j["redis"]["oldest_ms"] >= 1000
                assert j["causes"][0]["panel"] == "redis", j["causes"]
                assert "Redis %s not answering" % redis.address in j["causes"][0]["what"]
                [deg] = [c for c in j["causes"] if c["panel"] == "degraded"]
                assert "meanwhile the failure ladder answers: " in deg["what"], deg
                # /metrics says the same (a later sample: at least as old)
                oldest = prom_value(a.http("/metrics")[1],
                                    "spoa_ratelimit_redis_oldest_unanswered_ms")
                assert oldest is not None and oldest >= 1000, oldest
                # ctl status says the causes too, and exits 1
                rc, out, err = ctl(a, "status")
                assert rc == 1 and "  ! Redis %s not answering" % redis.address in out, (
                    rc, out, err)
                assert "(#redis, since " in out and " UTC)\n" in out, out
                b.wait("document.getElementById('causelist').textContent.indexOf(%s)>=0"
                       % json.dumps("Redis %s not answering" % redis.address))
                r = cause_rect(b, "Redis %s" % redis.address)
                assert r and r["y"] >= 0 and r["y"] + r["h"] <= 800, r
                assert "oldest command unanswered for" in r["text"], r
                assert b.rect("#causes a")["y"] < 800
                assert b.eval("document.querySelector('#causes a').getAttribute('href')") == \
                    "#redis"
                assert b.eval("document.getElementById('state').className") == "state bad"
                width, _ = no_overflow(b)
                assert width <= 1280, width
                shot(b, tmp, "redis-frozen")
                # a phone: the cause is on its first screen, nothing wider than it
                b.viewport(390, 844, mobile=True)
                b.goto(url)
                b.wait("document.getElementById('live').textContent.indexOf('live, ')==0")
                r = cause_rect(b, "Redis %s" % redis.address)
                assert r and 0 <= r["y"] and r["y"] + 20 <= 844 and r["x"] >= 0, r
                assert r["x"] + r["w"] <= 390, r
                width, inner = no_overflow(b)
                assert width <= inner, (width, inner)
                shot(b, tmp, "phone")
            finally:
                redis.proc.signal(signal.SIGCONT)
            # back: the node answers, its causes go, the degraded panel follows
            b.viewport(1280, 800)
            wait_until(lambda: not status_json(a)["causes"], 12 * STEP_S, 0.2,
                       "no cause once Redis answers again")
            b.wait("document.getElementById('verdict').textContent.indexOf('Nothing')==0",
                   timeout=15)
            assert b.eval("document.getElementById('degraded').classList.contains('red')") \
                is False
            assert not b.csp_violations(), b.log
        finally:
            traffic.stop()


@pytest.mark.skipif(CHROMIUM is None,
                    reason="chromium is not installed (Debian package chromium: make deps)")
def test_status_page_says_the_agent_is_not_answering(agent, redis, tmp):
    """The agent stopped (SIGSTOP): the page's fetch gives up after 2 s and the page says
    "Agent not answering since HH:MM:SS UTC" within 5 s, the pill turns red ("not
    answering"), the panels are greyed (class stale); resumed, the page is live again; the
    agent gone (stopped for good), the same, at once."""
    import cdp
    a = status_agent(agent, redis)
    url = "http://%s:%d/status" % a.metrics_addr
    pipeline(a.addr, [sc.rl_message(key="gone-%d" % i) for i in range(10)])
    with cdp.Browser(tmp, "gone") as b:
        b.viewport(1280, 800)
        b.goto(url)
        b.wait("document.getElementById('live').textContent.indexOf('live, ')==0")
        assert b.eval("document.getElementById('gone').hidden") is True
        a.proc.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            b.wait("!document.getElementById('gone').hidden", timeout=10, every=0.05)
            took = time.monotonic() - t0
            assert took <= 5, took
            text = b.eval("document.getElementById('gone').textContent")
            assert text.startswith("Agent not answering since ") and " UTC (" in text, text
            assert "no answer within 2 s" in text and "its last answer, at " in text, text
            assert b.eval("document.getElementById('state').textContent") == "not answering"
            assert "bad" in b.eval("document.getElementById('state').className")
            assert b.eval("document.querySelectorAll('section[data-a]:not(.stale)').length") \
                == 0
            assert "stale" in b.eval("document.getElementById('causes').className")
            assert b.rect("#gone")["y"] < 800
            shot(b, tmp, "agent-gone")
        finally:
            a.proc.signal(signal.SIGCONT)
        b.wait("document.getElementById('gone').hidden", timeout=15)
        assert b.eval("document.querySelectorAll('section.stale').length") == 0
        assert b.eval("document.getElementById('state').textContent") == "ok"
        a.stop()
        b.wait("!document.getElementById('gone').hidden", timeout=10, every=0.05)
        assert b.eval("document.getElementById('state').textContent") == "not answering"
        assert not b.csp_violations(), b.log
