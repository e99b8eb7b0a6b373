"""The agent's command line: -V, -c (check config), SIGTERM, listen address forms."""

import os
import re
import signal
import subprocess

import pytest

import spop_client as sc
from conftest import REPO, agent_config, agent_env, free_port, to_libconfig


def run(agent_bin, *args, timeout=20):
    return subprocess.run([str(agent_bin)] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=agent_env())


def test_version(agent_bin):
    r = run(agent_bin, "-V")
    assert r.returncode == 0, r
    assert re.search(r"\d+\.\d+", r.stdout + r.stderr), r


def test_check_good_config(agent_bin, tmp):
    p = tmp / "good.conf"
    p.write_text(to_libconfig(agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379")))
    r = run(agent_bin, "-c", "-f", p)
    assert r.returncode == 0, r


def test_check_contrib_sample(agent_bin):
    sample = REPO / "contrib" / "spoa-ratelimit.conf"
    if not sample.exists():
        pytest.skip("no contrib sample")
    r = run(agent_bin, "-c", "-f", sample)
    assert r.returncode == 0, r


@pytest.mark.parametrize("spoe, cmd, says", [
    ("10ms", None, "decisions 8 ms after their NOTIFY arrived (80% of spoe_timeout), other "
                   "commands 8 ms after they are sent (command_timeout_ms, derived from "
                   "spoe_timeout)"),
    ("10ms", 5, "decisions 8 ms after their NOTIFY arrived (80% of spoe_timeout), other "
                "commands 5 ms after they are sent (command_timeout_ms, set)"),
    ("1s", 3000, "decisions 800 ms after their NOTIFY arrived (80% of spoe_timeout), other "
                 "commands 3000 ms after they are sent (command_timeout_ms, set)"),
    (None, None, "commands 5 ms after they are sent (command_timeout_ms, derived: no "
                 "spoe_timeout)"),
    (None, 40, "commands 40 ms after they are sent (command_timeout_ms, set)"),
])
def test_check_says_the_redis_deadlines(agent_bin, tmp, spoe, cmd, says):
    """-c prints the deadlines in force: with spoe_timeout a decision's is HAProxy's budget
    whatever command_timeout_ms says; command_timeout_ms, derived unless set, for the rest."""
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379", spoe_timeout=spoe)
    if cmd is None:
        del cfg["redis"]["command_timeout_ms"]
    else:
        cfg["redis"]["command_timeout_ms"] = cmd
    p = tmp / "deadlines.conf"
    p.write_text(to_libconfig(cfg))
    r = run(agent_bin, "-c", "-f", p)
    assert r.returncode == 0, r
    assert "%s: redis deadlines: %s\n" % (p, says) in r.stdout, r.stdout


@pytest.mark.parametrize("spoe, cmd, wait, says", [
    (None, None, 2500, None),
    (None, None, 2501, "at most 2500, half of the 5 ms a decision is given for its reply "
                       "(redis.command_timeout_ms)"),
    (None, 10, 5000, None),
    ("5ms", 10, 2001, "at most 2000, half of the 4 ms a decision is given for its reply "
                      "(spoe_timeout's share)"),
])
def test_check_batch_wait_within_the_deadline(agent_bin, tmp, spoe, cmd, wait, says):
    """redis.batch_wait_us counts in the deadline of the decisions that wait: more than
    half of what a decision is given for its reply is refused, with the bound and why."""
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379", spoe_timeout=spoe)
    if cmd is None:
        del cfg["redis"]["command_timeout_ms"]
    else:
        cfg["redis"]["command_timeout_ms"] = cmd
    cfg["redis"]["batch_wait_us"] = wait
    p = tmp / "batch_wait.conf"
    p.write_text(to_libconfig(cfg))
    r = run(agent_bin, "-c", "-f", p)
    if says is None:
        assert r.returncode == 0, r
    else:
        assert r.returncode == 1, r
        assert re.search(re.escape(str(p)) + r":\d+: redis.batch_wait_us = %d: %s" % (
            wait, re.escape(says)), r.stderr), r.stderr


BAD = '''listen = "127.0.0.1:1";
store = "redis";
redis = { address = "127.0.0.1:6379"; };
limits = {
  a = { rate = 0; period = "1m"; };
  b = { rate = 5; period = "7x"; };
};
tiers = { free = { limits = [ "a", "nope" ]; }; };
default_tier = "free";
anonymous = { limits = [ "b" ]; };
'''


def test_check_bad_config(agent_bin, tmp):
    p = tmp / "bad.conf"
    p.write_text(BAD)
    r = run(agent_bin, "-c", "-f", p)
    assert r.returncode == 1, r
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    errs = [l for l in lines if l.startswith(str(p) + ":")]
    assert errs, r.stderr
    for l in errs:
        assert re.match(re.escape(str(p)) + r":\d+: \S", l), l
    # every error is reported in one run, at its line
    assert any(l.startswith("%s:5:" % p) for l in errs), r.stderr
    assert any(l.startswith("%s:6:" % p) for l in errs), r.stderr
    assert any("nope" in l for l in errs), r.stderr


@pytest.mark.parametrize("text,line", [
    ('listen = "127.0.0.1:1"\nstore = ;\n', 2),
    ('log_level = "info";\nlisten "127.0.0.1:1";\n', 2),     # missing '=' before a string
])
def test_check_syntax_error(agent_bin, tmp, text, line):
    p = tmp / "syntax.conf"
    p.write_text(text)
    r = run(agent_bin, "-c", "-f", p)
    assert r.returncode == 1, r
    assert re.search(re.escape(str(p)) + r":%d: " % line, r.stderr), r.stderr
    assert "Sanitizer" not in r.stderr, r.stderr


def test_missing_config_file(agent_bin, tmp):
    r = run(agent_bin, "-c", "-f", tmp / "does-not-exist.conf")
    assert r.returncode == 1, r
    assert "does-not-exist.conf" in r.stderr


def test_sigterm_exits_zero(agent, redis):
    a = agent(redis=redis)
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="term")])["allow"] == 1
        rc = a.stop()       # with a connection still open
    assert rc == 0


@pytest.mark.parametrize("form", ["ipv6", "unix"])
def test_listen_forms(agent, redis, tmp, form):
    if form == "ipv6":
        listen = "[::1]:%d" % free_port("::1") if _has_ipv6() else pytest.skip("no ::1")
    else:
        listen = "unix:%s" % (tmp / "agent.sock")
    a = agent(redis=redis, listen=listen, redis_cfg={"address": redis.unix_address})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert c.request(1, 1, [sc.rl_message(key="form-" + form)])["allow"] == 1


def test_gateway_to_unix_agent(agent, redis, haproxy, tmp):
    """RL_AGENT_ADDR=unix@/path works with the shipped haproxy.cfg."""
    a = agent(redis=redis, listen="unix:%s" % (tmp / "gw-agent.sock"))
    gw = haproxy(a.address)
    statuses = [gw.request("/", api_key="unix-gw").status for _ in range(6)]
    assert statuses == [200] * 5 + [429]


def _has_ipv6():
    import socket
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
