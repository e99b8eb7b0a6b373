"""Least privilege: the one `ACL SETUSER` line of doc/configuration.md (*The Redis user the
agent needs*), read from the document itself and applied to a real Redis, is enough for
everything the agent and `ctl` do: exact decisions, the gateway heartbeat, overrides written
by `ctl` and applied by the agent, `ctl list`, and the same through Sentinel (ROLE). Nothing
is refused (Redis's ACL LOG stays empty); a user without one of its permissions is told
what is missing."""

import shlex
from pathlib import Path

import spop_client as sc
from conftest import Agent, Redis, agent_config, free_port, redis_cmd, wait_until
from test_overrides import ctl_ok
from test_redis_health import status_json
from test_secrets import secret_file
from test_sentinel import LIMITS, MASTER, TIERS, Cluster

DOC = Path(__file__).resolve().parents[2] / "doc" / "configuration.md"
PW = "acl-pw-7c1e"


def acl_line():
    lines = [ln for ln in DOC.read_text().splitlines() if ln.startswith("ACL SETUSER spoa ")]
    assert len(lines) == 1, lines
    return lines[0]


def apply_acl(port, line=None):
    """The documented line, with the test's password, on the Redis at <port>."""
    args = shlex.split((line or acl_line()).replace(">PASSWORD", ">" + PW))
    assert redis_cmd(port, *args) == "OK"
    assert redis_cmd(port, "ACL", "LOG", "RESET") == "OK"


def acl_refusals(port):
    return redis_cmd(port, "ACL", "LOG")


def decide(a, key, n, sid0=1):
    with sc.SpopClient(a.addr) as c:
        c.hello()
        return [c.request(sid0 + 2 * i, 1, [sc.rl_message(key=key)]) for i in range(n)]


def check_works(a, port):
    """Decisions, heartbeat, overrides and ctl through the ACL user of <a>."""
    vs = decide(a, "acl-exact", 6)
    assert [v["allow"] for v in vs] == [1] * 5 + [0] and not any(v.get("degraded") for v in vs)
    # the same client in another tier: one entry of its key written, the others kept (the
    # script reads what the key has left: PTTL)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        v = c.request(51, 1, [sc.rl_message(key="acl-exact", tier="pro")])
    assert v["allow"] == 1 and not v.get("degraded"), v
    # the gateway heartbeat (its own script) counted this agent
    wait_until(lambda: redis_cmd(port, "ZCARD", "rl:{gw}:gateways") >= 1, 10, 0.1,
               "the heartbeat written")
    # ctl writes an override with its scripts; the agent polls and applies it
    ctl_ok(a, "block", "key:acl-blocked", "--for", "10m")
    assert "block" in ctl_ok(a, "list")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        wait_until(lambda: c.request(101, 1, [sc.rl_message(key="acl-blocked")])["allow"] == 0,
                   5, 0.1, "the block applied")
    ctl_ok(a, "unblock", "key:acl-blocked")
    assert "NOPERM" not in a.proc.log_text(), a.proc.log_text()
    assert acl_refusals(port) == [], acl_refusals(port)


def test_documented_acl_is_enough(agent, procs, tmp):
    r = Redis(procs, tmp)
    apply_acl(r.port)
    pw = secret_file(tmp / "redis-password", PW + "\n")
    a = agent(redis=r, metrics=True, redis_cfg={"user": "spoa", "password_file": str(pw)})
    check_works(a, r.port)
    assert status_json(a)["state"] == "ok"
    # the keys it wrote are all under the prefix
    assert all(k.startswith("rl:") for k in redis_cmd(r.port, "KEYS", "*"))


def test_documented_acl_is_enough_under_sentinel(procs, tmp, agent_bin):
    cl = Cluster(procs, tmp)
    for port in (cl.master_port, cl.replica_port):
        apply_acl(port)
    pw = secret_file(tmp / "redis-password", PW + "\n")
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:1", limits=LIMITS, tiers=TIERS)
    cfg["redis"].pop("address")
    cfg["redis"].update({"sentinel": {"addresses": cl.addresses(dead_first=False),
                                      "master": MASTER},
                         "connect_timeout_ms": 300, "user": "spoa",
                         "password_file": str(pw)})
    a = Agent(procs, tmp, cfg)
    vs = decide(a, "acl-sn", 3)
    assert all(v["allow"] == 1 and not v.get("degraded") for v in vs), vs
    assert "redis master %s connected (127.0.0.1:%d)" % (MASTER, cl.master_port) \
        in a.proc.log_text()
    ctl_ok(a, "block", "key:acl-sn-blocked", "--for", "10m")
    with sc.SpopClient(a.addr) as c:
        c.hello()
        wait_until(lambda: c.request(101, 1,
                                     [sc.rl_message(key="acl-sn-blocked")])["allow"] == 0,
                   5, 0.1, "the block applied")
    assert "NOPERM" not in a.proc.log_text(), a.proc.log_text()
    assert acl_refusals(cl.master_port) == []


def test_a_missing_permission_is_told(agent, procs, tmp):
    """The line without SCRIPT LOAD: the node is down, and the status says why and where
    the ACL is documented."""
    r = Redis(procs, tmp)
    apply_acl(r.port, acl_line().replace(" +script|load", ""))
    pw = secret_file(tmp / "redis-password", PW + "\n")
    a = agent(redis=r, metrics=True, wait_redis=False,
              redis_cfg={"user": "spoa", "password_file": str(pw)})
    want = "%s: SCRIPT LOAD refused to redis.user (NOPERM" % r.address
    wait_until(lambda: want in (status_json(a)["redis"]["health"] or ""), 10, 0.05, want)
    assert "The Redis user the agent needs" in status_json(a)["redis"]["health"]
