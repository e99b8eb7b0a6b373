"""Key fingerprints shown to people are keyed with the fleet's secret (metrics.
fingerprint_secret_file, src/core/digest.c fp_*()): "fp:" and 16 hex digits of HMAC-SHA256(secret,
the key's digest), the same on /top, /status.json, /overrides, the audit log and `ctl list`.
Real agents, real Redis, real sockets: a guessed key cannot be confirmed from a fingerprint
without the secret, a block by fingerprint taken from one agent's /top is enforced by every
agent of the fleet, a rotation changes what is shown and leaves blocks by raw key working."""

import json
import re
import time

import spop_client as sc
from conftest import (FP_SECRET, agent_config, check_config, fingerprint, fp_secret_file,
                      key_principal, limit_state, unkeyed_prefix, wait_until)
from test_overrides import HASH, ctl, ctl_ok, digest_hex

# one request a day per key: the second is denied, and lands in /top
TIGHT = {"limits": {"tight": {"rate": 1, "period": "1d"},
                    "anon_rpm": {"rate": 100000, "period": "1m"}},
         "tiers": {"free": {"limits": ["tight"]}}, "default_tier": "free"}
OTHER_SECRET = "another-fleet-another-secret-0123456789"
FP_RE = re.compile(r"^fp:[0-9a-f]{16}$")


def ask(c, sid, **msg):
    return c.request(sid, 1, [sc.rl_message(**msg)])


def deny(a, *keys):
    """Two decisions per key on agent <a>: the second is denied (TIGHT)."""
    with sc.SpopClient(a.addr) as c:
        c.hello()
        sid = 1
        for k in keys:
            for _ in range(2):
                ask(c, sid, key=k)
                sid += 2


def blocked(c, sid, key):
    """Whether the decision for <key> is a block (not the tight limit's denial)."""
    v = ask(c, sid, key=key)
    return v["allow"] == 0 and v["rule"] == "blocked"


def wait_blocked(a, key, what="the block applied"):
    with sc.SpopClient(a.addr) as c:
        c.hello()
        wait_until(lambda: blocked(c, 1, key), 5, interval=0.02, what=what)


def top_clients(a, rule="tight", want=()):
    """The clients /top shows for <rule>, once every one of <want> is there."""
    def get():
        status, body = a.http("/top")
        assert status == 200, body
        rows = {r["rule"]: r for r in json.loads(body)["rules"]}
        got = [e["client"] for e in rows.get(rule, {}).get("top", [])]
        return got if got and all(w in got for w in want) else None
    return wait_until(get, 5, 0.1, "%s in /top" % (want,))


def secret_agent(agent, redis, tmp, secret=FP_SECRET, name="fingerprint.secret", **over):
    path = fp_secret_file(tmp, secret, name=name)
    cfg = dict(TIGHT, **over)
    return agent(redis=redis, metrics={"fingerprint_secret_file": str(path)}, **cfg)


def test_same_secret_same_fingerprint_another_secret_another(agent, redis, tmp):
    """Two agents of one fleet (one secret file) show one fingerprint for a key; it is not the
    key's unkeyed SHA-256 prefix (what earlier versions showed) nor contains it; an agent
    with another secret shows another."""
    a1 = secret_agent(agent, redis, tmp)
    a2 = secret_agent(agent, redis, tmp)
    a3 = secret_agent(agent, redis, tmp, secret=OTHER_SECRET, name="other.secret")
    deny(a1, "guessable-key")
    deny(a2, "guessable-key")
    deny(a3, "guessable-key")
    fp = fingerprint("guessable-key")
    assert FP_RE.match(fp)
    # (the harness's probe key may be there too: the agents share its budget)
    assert fp in top_clients(a1, want=[fp])
    assert fp in top_clients(a2, want=[fp])
    other = fingerprint("guessable-key", OTHER_SECRET)
    assert fp not in top_clients(a3, want=[other]) and other != fp
    for shown in (fp, other):
        assert unkeyed_prefix("guessable-key", 8) not in shown
        assert shown[3:] != unkeyed_prefix("guessable-key")
    # the Redis key names do not depend on the secret: one shared budget for the key
    assert limit_state(redis.cmd, key_principal("guessable-key"), "tight") is not None, \
        redis.cmd("KEYS", "*")


def test_block_by_fingerprint_from_one_agents_top_is_enforced_by_another(agent, redis, tmp):
    """The fingerprint /top of agent 1 shows, blocked with `ctl` run from agent 2's
    configuration: both agents deny that key, and only it."""
    a1 = secret_agent(agent, redis, tmp)
    a2 = secret_agent(agent, redis, tmp)
    deny(a1, "stuffing-key")
    shown = top_clients(a1, want=[fingerprint("stuffing-key")])[0]
    out = ctl_ok(a2, "block", shown, "--for", "5m", "--reason", "from a1's /top")
    assert "block:%s:" % shown in out, out
    assert redis.cmd("HEXISTS", HASH, "block:%s" % shown) == 1
    for a in (a1, a2):
        wait_blocked(a, "stuffing-key", "the fingerprint block")
        with sc.SpopClient(a.addr) as c:
            c.hello()
            assert not blocked(c, 1, "a-bystander")
    # lifted by the same name
    ctl_ok(a1, "unblock", shown)
    assert redis.cmd("HEXISTS", HASH, "block:%s" % shown) == 0


def test_one_fingerprint_length_on_every_surface(agent, redis, tmp):
    """/top, /status.json, /overrides (a block by raw key: its whole digest is stored, its
    fingerprint shown), the audit log and `ctl list` show one string for one key: fp: and
    16 hex digits; none shows the digest."""
    a = secret_agent(agent, redis, tmp)
    deny(a, "every-surface")
    fp = fingerprint("every-surface")
    top_clients(a, want=[fp])
    ctl_ok(a, "block", "key:every-surface", "--for", "5m", "--reason", "surfaces")
    wait_blocked(a, "every-surface")            # counted under "blocked" as well, by fingerprint
    top_clients(a, rule="blocked", want=[fp])

    def status_offenders():
        time.sleep(0.3)                 # a fresh render
        status, body = a.http("/status.json")
        rows = json.loads(body)["denials"]["offenders"]
        return rows if any(r["client"] == fp and r["override"] for r in rows) else None
    rows = wait_until(status_offenders, 5, 0.1, "the offender and its block on /status.json")
    status, body = a.http("/overrides")
    ent = json.loads(body)["entries"]
    assert [e["target"] for e in ent] == [fp], body
    wait_until(lambda: "override applied: block on %s" % fp in a.proc.log_text(), 5,
               what="the audit line")
    rc, out, err = ctl(a, "list")
    assert rc == 0 and re.search(r"^block\s+%s\s" % re.escape(fp), out, re.M), (out, err)
    digest = digest_hex("every-surface")
    texts = {"/top": a.http("/top")[1], "/status.json": json.dumps(rows), "/overrides": body,
             "log": a.proc.log_text(), "ctl list": out, "/status": a.http("/status")[1]}
    for what, text in texts.items():
        assert digest[:8] not in text, what
        for shown in re.findall(r"fp:[0-9a-f]+", text):
            assert FP_RE.match(shown), (what, shown)


def test_rotation_changes_what_is_shown_and_keeps_blocks_by_raw_key(agent, redis, tmp):
    """The secret file rewritten and the agent reloaded: new denials show the new
    fingerprint, /overrides shows a block by raw key under the new one and it still denies;
    a block by the old fingerprint no longer matches (re-issue it under the new one)."""
    a = secret_agent(agent, redis, tmp)
    deny(a, "rotated-key")
    top_clients(a, want=[fingerprint("rotated-key")])
    ctl_ok(a, "block", "key:raw-blocked", "--for", "5m")
    ctl_ok(a, "block", fingerprint("fp-blocked"), "--for", "5m")
    wait_blocked(a, "raw-blocked")
    wait_blocked(a, "fp-blocked")
    fp_secret_file(tmp, OTHER_SECRET)   # the same file, another secret
    a.reload()
    wait_until(lambda: "fingerprint secret changed" in a.proc.log_text(), 5,
               what="the reload logged")
    deny(a, "rotated-key-2")
    new = fingerprint("rotated-key-2", OTHER_SECRET)
    assert top_clients(a, want=[new])
    assert fingerprint("rotated-key-2") not in top_clients(a)
    status, body = a.http("/overrides")
    targets = {e["target"] for e in json.loads(body)["entries"]}
    assert fingerprint("raw-blocked", OTHER_SECRET) in targets, body
    assert fingerprint("raw-blocked") not in targets, body
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert blocked(c, 1, "raw-blocked")             # by raw key: survives
        assert not blocked(c, 3, "fp-blocked")          # by the old fingerprint: not
    # re-issued under the new secret, it matches again
    ctl_ok(a, "block", fingerprint("fp-blocked", OTHER_SECRET), "--for", "5m")
    wait_blocked(a, "fp-blocked", "the re-issued block")


def test_without_a_secret_check_warns_and_each_agent_has_its_own(agent, redis, tmp):
    """No metrics.fingerprint_secret_file: `-c` warns that fingerprints then differ between
    gateways; two such agents show two fingerprints for one key, neither unkeyed."""
    cfg = agent_config("127.0.0.1:1", metrics={"listen": "127.0.0.1:9"})
    r = check_config(tmp, cfg)
    assert r.returncode == 0, r.stderr
    assert "no metrics.fingerprint_secret_file" in r.stderr, r.stderr
    assert "differ between gateways" in r.stderr, r.stderr
    cfg["metrics"]["fingerprint_secret_file"] = str(fp_secret_file(tmp))
    r = check_config(tmp, cfg)
    assert r.returncode == 0 and "fingerprint_secret_file" not in r.stderr, r.stderr
    shown = []
    for i in range(2):
        # a budget of its own each (key_prefix): only lonely-key is denied
        a = agent(redis=redis, metrics={"fingerprint_secret_file": None},
                  redis_cfg={"key_prefix": "rl%d" % i}, **TIGHT)
        deny(a, "lonely-key")
        got = top_clients(a)
        assert len(got) == 1 and FP_RE.match(got[0]), got
        assert got[0][3:] != unkeyed_prefix("lonely-key")
        shown.append(got[0])
        assert "no metrics.fingerprint_secret_file" in a.proc.log_text()
    assert shown[0] != shown[1]


def test_a_bad_secret_file_is_a_clear_error(tmp):
    """Missing, empty, too short, readable by others: the file named and what to do."""
    short = fp_secret_file(tmp, "short", name="short.secret")
    empty = tmp / "empty.secret"
    empty.write_text("")
    empty.chmod(0o600)
    loose = fp_secret_file(tmp, FP_SECRET, name="loose.secret", mode=0o644)
    for path, why in [(tmp / "missing.secret", "cannot open: No such file"),
                      (empty, "is empty"),
                      (short, "shorter than 16 characters"),
                      (loose, "readable by others")]:
        cfg = agent_config("127.0.0.1:1", metrics={"listen": "127.0.0.1:9",
                                                   "fingerprint_secret_file": str(path)})
        r = check_config(tmp, cfg)
        assert r.returncode != 0, (path, r.stdout, r.stderr)
        assert "metrics.fingerprint_secret_file '%s': " % path in r.stderr, r.stderr
        assert why in r.stderr, (path, r.stderr)
    cfg = agent_config("127.0.0.1:1", metrics={"fingerprint_secret_file": ""})
    r = check_config(tmp, cfg)
    assert r.returncode != 0 and "is empty: name the file" in r.stderr, r.stderr


def test_entries_of_earlier_versions_still_match(agent, redis, tmp):
    """Upgrade: a block on the unkeyed 8-digit prefix an earlier /top showed (k:HEX, written
    by an earlier ctl) still denies its key and is shown as stored; a limit override by
    fingerprint changes the key's limits on this version."""
    a = secret_agent(agent, redis, tmp)
    until = int(time.time()) + 600
    redis.cmd("HSET", HASH, "block:k:%s" % unkeyed_prefix("old-top-key", 8),
              "until=%d by=old reason=from the old /top" % until)
    redis.cmd("HINCRBY", HASH, "version", 1)
    wait_blocked(a, "old-top-key", "the earlier version's block")
    status, body = a.http("/overrides")
    assert [e["target"] for e in json.loads(body)["entries"]] == \
        ["k:%s" % unkeyed_prefix("old-top-key", 8)], body
    # a limit by fingerprint: 1 a day becomes 50
    ctl_ok(a, "limit", fingerprint("raised-key"), "--for", "5m", "--rate", "tight=50")
    wait_until(lambda: a.http("/overrides")[1].count('"kind":"limit"') == 1, 5, 0.05,
               "the limit loaded")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert all(ask(c, 1 + 2 * i, key="raised-key")["allow"] == 1 for i in range(5))


def test_workers_share_the_random_secret_and_fp_lifts_a_raw_key_block(agent, redis, tmp):
    """Without a secret file, the workers of one agent key with one random secret (drawn by
    the master before they start): one key, one fingerprint on /top whichever worker
    counted it. And `ctl unblock fp:...` (with the fleet's secret) lifts a block made by raw
    key, which ctl shows by that fingerprint."""
    a = agent(redis=redis, metrics={"fingerprint_secret_file": None}, args=("-w", 2),
              **TIGHT)
    assert len(a.worker_pids()) == 2
    for _ in range(8):                  # new connections: both workers get some
        deny(a, "two-workers")
    clients = wait_until(lambda: (lambda t: t if t and sum(e["count"] for e in t) >= 8
                                  else None)(top_entries(a)), 5, 0.2, "the denials published")
    assert len({e["client"] for e in clients}) == 1, clients
    b = secret_agent(agent, redis, tmp)
    ctl_ok(b, "block", "key:lift-me", "--for", "5m")
    wait_blocked(b, "lift-me")
    rc, out, err = ctl(b, "list")
    assert fingerprint("lift-me") in out and digest_hex("lift-me")[:8] not in out, out
    out = ctl_ok(b, "unblock", fingerprint("lift-me"))
    assert "removed 1 entry" in out, out
    assert redis.cmd("HEXISTS", HASH, "block:k:%s" % digest_hex("lift-me")) == 0


def top_entries(a, rule="tight"):
    status, body = a.http("/top")
    rows = {r["rule"]: r for r in json.loads(body)["rules"]}
    return [e for e in rows.get(rule, {}).get("top", [])
            if e["client"] != fingerprint("__harness_probe__")]
