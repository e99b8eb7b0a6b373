"""haproxy/*.cfg checked on the installed HAProxy, with a scripted Python agent
(fake_agent.py) in place of the C agent: what HAProxy sends, how it turns the agent's
variables into a 429 and headers, and that every failure of the agent lets requests pass."""

import ipaddress
import json
import os
import subprocess

import pytest

import spop_client as sc
from conftest import (HAPROXY_BIN, HAPROXY_DIR, HAPROXY_VERSION, agent_errors, free_port,
                      http_request, parse_sf_list, wait_port, wait_until)
from fake_agent import FakeAgent, txn_vars

DENY = txn_vars(allow=0, retry_after=7, rule="key_rpm",
                ratelimit='"key_rpm";r=0;t=7',
                policy='"key_rpm";q=5;w=60, "key_day";q=1000;w=86400',
                limit=5, remaining=0, reset=7)
ALLOW = txn_vars(allow=1, rule="key_rpm", ratelimit='"key_rpm";r=4;t=12',
                 policy='"key_rpm";q=5;w=60', limit=5, remaining=4, reset=12)


@pytest.fixture
def fake(request):
    agents = []

    def start(decide):
        a = FakeAgent(decide)
        agents.append(a)
        return a
    yield start
    for a in agents:
        a.close()


def check_env(**over):
    env = dict(os.environ)
    env.update(RL_SPOE_CONF=str(HAPROXY_DIR / "spoe-ratelimit.conf"),
               RL_TIER_MAP=str(HAPROXY_DIR / "tiers.map"))
    env.update(over)
    return env


def haproxy_check(cfg, env, cwd=None):
    return subprocess.run([HAPROXY_BIN, "-c", "-f", str(cfg)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=30)


def test_configs_valid():
    r = haproxy_check(HAPROXY_DIR / "haproxy.cfg", check_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = haproxy_check(HAPROXY_DIR / "upstream.cfg", check_env())
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("cfg", ["haproxy.cfg", "upstream.cfg"])
def test_defaults_work_from_repo_root(cfg):
    """With no RL_* variable at all, the presetenv defaults are enough from the repo root,
    on every HAProxy of the matrix: 3.3 and later expand `${...}` on the lines of an `.if`
    block whose condition is false, and an empty argument is fatal there, so every
    variable such a block names has a default-value form (`${RL_USER-haproxy}`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_")}
    r = haproxy_check("haproxy/" + cfg, env, cwd=str(HAPROXY_DIR.parent))
    assert r.returncode == 0, (HAPROXY_VERSION, r.stdout + r.stderr)
    assert "WARNING" not in r.stdout + r.stderr, (HAPROXY_VERSION, r.stdout + r.stderr)


def test_spoe_file_expands_env():
    """RL_SPOE_TIMEOUT reaches `timeout processing` in the SPOE file (a bogus value is
    rejected, so the variable was expanded there)."""
    r = haproxy_check(HAPROXY_DIR / "haproxy.cfg", check_env(RL_SPOE_TIMEOUT="bogus"))
    assert r.returncode != 0
    assert "spoe-ratelimit.conf" in r.stdout + r.stderr


def test_notify_content_and_deny(fake, haproxy):
    agent = fake(lambda msgs: (DENY, 0))
    gw = haproxy(agent.addr_str, tiers={"k-pro": "pro"})
    r = gw.request("/v1/items?x=1", api_key="k-pro", method="POST")
    assert r.status == 429, r
    assert r.h("Retry-After") == "7"
    assert r.h("Content-Type").startswith("application/problem+json")
    body = json.loads(r.body)
    assert body == {"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
                    "title": "Too Many Requests", "status": 429,
                    "violated-policies": ["key_rpm"], "retry_after": 7}
    # structured fields survive HAProxy's log-format untouched
    assert r.h("RateLimit") == '"key_rpm";r=0;t=7'
    assert parse_sf_list(r.h("RateLimit-Policy")) == [
        ("key_rpm", {"q": 5, "w": 60}), ("key_day", {"q": 1000, "w": 86400})]
    assert (r.h("RateLimit-Limit"), r.h("RateLimit-Remaining"), r.h("RateLimit-Reset")) == \
        ("5", "0", "7")
    assert r.h("X-RateLimit-Agent-Error") is None
    assert r.h("X-RateLimit-Degraded") is None

    assert len(agent.notifies) == 1
    msgs = agent.notifies[0]
    assert [m[0] for m in msgs] == ["rl-req"]
    args = {n: (t.type, t.value) for n, t in msgs[0][1]}
    assert args == {
        "key": (sc.D_STRING, "k-pro"),
        "tier": (sc.D_STRING, "pro"),
        "ip": (sc.D_IPV4, ipaddress.ip_address("127.0.0.1")),
        "method": (sc.D_STRING, "POST"),
        "path": (sc.D_STRING, "/v1/items"),
        "route": (sc.D_NULL, None),     # txn.rl_route not set by the sample
        "cost": (sc.D_NULL, None),      # txn.rl_cost not set by the sample
    }


def test_anonymous_and_unknown_key_args(fake, haproxy):
    agent = fake(lambda msgs: (ALLOW, 0))
    gw = haproxy(agent.addr_str, tiers={"k-pro": "pro"})
    r = gw.request("/", source="127.0.0.5")
    assert r.status == 200 and r.body == b"ok"
    r = gw.request("/", api_key="k-unknown")
    assert r.status == 200
    r = gw.request("/", headers={"X-API-Key": ""})
    assert r.status == 200
    a0 = {n: (t.type, t.value) for n, t in agent.notifies[0][0][1]}
    assert a0["key"] == (sc.D_NULL, None) and a0["tier"] == (sc.D_NULL, None)
    assert a0["ip"] == (sc.D_IPV4, ipaddress.ip_address("127.0.0.5"))
    a1 = {n: (t.type, t.value) for n, t in agent.notifies[1][0][1]}
    assert a1["key"] == (sc.D_STRING, "k-unknown") and a1["tier"] == (sc.D_NULL, None)
    a2 = {n: (t.type, t.value) for n, t in agent.notifies[2][0][1]}
    assert a2["key"] == (sc.D_NULL, None)


def test_allow_sets_headers_on_upstream_response(fake, haproxy):
    agent = fake(lambda msgs: (ALLOW, 0))
    gw = haproxy(agent.addr_str)
    r = gw.request("/", api_key="k1")
    assert r.status == 200 and r.body == b"ok"
    assert r.h("RateLimit") == '"key_rpm";r=4;t=12'
    assert r.h("RateLimit-Policy") == '"key_rpm";q=5;w=60'
    assert r.h("RateLimit-Remaining") == "4"
    assert r.h("Retry-After") is None


def test_degraded_header(fake, haproxy):
    agent = fake(lambda msgs: (txn_vars(allow=1, degraded=1), 0))
    gw = haproxy(agent.addr_str)
    r = gw.request("/", api_key="k1")
    assert r.status == 200
    assert r.h("X-RateLimit-Degraded") == "1"
    assert r.h("RateLimit") is None


def test_slow_agent_fails_open(fake, haproxy):
    """A deny that arrives after `timeout processing` is ignored: the request passes and
    set-on-error says 1."""
    agent = fake(lambda msgs: (DENY, 1.0))
    gw = haproxy(agent.addr_str, spoe_timeout="100ms")
    r = gw.request("/", api_key="k1")
    assert r.status == 200, r
    assert r.h("X-RateLimit-Agent-Error") == "1"
    assert r.h("RateLimit") is None and r.h("Retry-After") is None
    assert r.elapsed < 0.9


def test_agent_down_fails_open(haproxy, procs):
    """Nothing listens on the agent address: requests pass with an agent error."""
    from conftest import free_port
    gw = haproxy("127.0.0.1:%d" % free_port(), spoe_timeout="100ms")
    for _ in range(3):
        r = gw.request("/", api_key="k1")
        assert r.status == 200, r
        assert r.h("X-RateLimit-Agent-Error") in agent_errors(1, 2), r
    # after the health checks mark the agent DOWN, SPOE fails at once (2 on 2.6, 257 on 3.x)
    def fast_error():
        r = gw.request("/", api_key="k1")
        return r.status == 200 and r.h("X-RateLimit-Agent-Error") in agent_errors(2) and r
    wait_until(fast_error, 10, 0.2, "agent marked DOWN (err %s)" % agent_errors(2))
    assert "rl_err=" in procs.procs[-1].log_text()


def test_partial_answer_without_allow_passes(fake, haproxy):
    """An ACK that does not carry allow=0 never denies (e.g. only a rule name)."""
    agent = fake(lambda msgs: (txn_vars(rule="x"), 0))
    gw = haproxy(agent.addr_str)
    r = gw.request("/", api_key="k1")
    assert r.status == 200


def test_log_line_has_verdict(fake, haproxy, procs):
    agent = fake(lambda msgs: (DENY, 0))
    gw = haproxy(agent.addr_str)
    gw.request("/", api_key="k1")
    log = wait_until(lambda: "rl_allow=0" in gw.proc.log_text() and gw.proc.log_text(), 5,
                     what="log line")
    line = [l for l in log.splitlines() if "rl_allow=0" in l][0]
    assert " 429 " in line and "rl_rule=key_rpm" in line and "rl_err=-" in line
    assert "k1" not in line


def test_bench_copies_valid(tmp_path):
    """`make bench` runs copies of haproxy.cfg without logging, and one without SPOE too:
    both must still be accepted as they are, and the no-SPOE copy must not reach the agents,
    so that the benchmark measures this configuration and not a broken one."""
    import bench

    text = (HAPROXY_DIR / "haproxy.cfg").read_text()
    for spoe in (True, False):
        cfg = tmp_path / ("bench-%s.cfg" % ("spoe" if spoe else "plain"))
        cfg.write_text(bench.derive_cfg(text, spoe))
        r = haproxy_check(cfg, check_env(RL_STATS_SOCKET=str(tmp_path / "stats.sock")))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
        live = [l for l in cfg.read_text().splitlines()
                if l.strip() and not l.strip().startswith("#")]
        assert not any(l.strip().startswith("log") for l in live)
        assert any("filter spoe" in l for l in live) == spoe
        assert any("send-spoe-group" in l for l in live) == spoe


def _unix_paths_of(pid):
    """Paths of the UNIX sockets process <pid> holds (bound ones have a path)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    paths = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            cols = line.split()
            if len(cols) >= 8 and cols[6] in inodes:
                paths.append(cols[7])
    return paths


def _start_sample(procs, tmp_path, fake, **env_over):
    """haproxy.cfg as shipped, on a free port, from a directory that is not the
    repository, with only the variables a by-hand run sets."""
    agent = fake(lambda msgs: (ALLOW, 0))
    port = free_port()
    env = {k: v for k, v in check_env().items() if k not in ("RL_STATS_SOCKET", "RL_USER")}
    env.update(RL_FRONT_ADDR="127.0.0.1:%d" % port, RL_AGENT_ADDR=agent.addr_str, **env_over)
    p = procs.spawn("sample", [HAPROXY_BIN, "-db", "-f", str(HAPROXY_DIR / "haproxy.cfg")],
                    env=env, cwd=str(tmp_path))
    wait_port("127.0.0.1", port, 15, p)
    return p


def test_stats_socket_only_where_asked(procs, tmp_path, fake):
    """No RL_STATS_SOCKET: no runtime API socket at all (no fixed path that two gateways
    would share or that would be left behind). With it: the socket at that path, and the
    runtime API answers there."""
    p = _start_sample(procs, tmp_path, fake)
    assert _unix_paths_of(p.pid) == [], _unix_paths_of(p.pid)
    sock = tmp_path / "gw.sock"
    p2 = _start_sample(procs, tmp_path, fake, RL_STATS_SOCKET=str(sock))
    # HAProxy binds "<path>.<pid>.tmp" and renames it to <path>; /proc keeps the first name.
    # Its listeners may answer before the unix socket is bound and renamed: wait for it.
    wait_until(lambda: sock.is_socket() and _unix_paths_of(p2.pid), 10, 0.05,
               "the stats socket bound")
    paths = _unix_paths_of(p2.pid)
    assert len(paths) == 1 and paths[0].startswith(str(sock)), paths
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(b"show map\n")
        out = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
    assert b"tiers.map" in out, out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching user needs root")
def test_rl_user_drops_root(procs, tmp_path, fake):
    """Started as root with RL_USER=haproxy (the user Debian's package creates), the
    gateway and the stand-in upstream run as that user and group once bound."""
    import pwd
    try:
        pw = pwd.getpwnam("haproxy")
    except KeyError:
        pytest.skip("no user haproxy")
    p = _start_sample(procs, tmp_path, fake, RL_USER="haproxy",
                      RL_STATS_SOCKET=str(tmp_path / "gw.sock"))
    port = free_port()
    up = procs.spawn("upstream-sample",
                     [HAPROXY_BIN, "-db", "-f", str(HAPROXY_DIR / "upstream.cfg")],
                     env=dict(os.environ, RL_USER="haproxy",
                              RL_UPSTREAM_ADDR="127.0.0.1:%d" % port), cwd=str(tmp_path))
    wait_port("127.0.0.1", port, 15, up)
    for proc in (p, up):
        status = open("/proc/%d/status" % proc.pid).read()
        uid = [l.split()[1:] for l in status.splitlines() if l.startswith("Uid:")][0]
        gid = [l.split()[1:] for l in status.splitlines() if l.startswith("Gid:")][0]
        assert set(uid) == {str(pw.pw_uid)}, status
        assert set(gid) == {str(pw.pw_gid)}, status
