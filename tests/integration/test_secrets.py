"""Secrets out of the main file (src/core/secret.c): `redis.password_file` against a Redis that
requires a password (and an ACL user), the file's checks (mode, size, content) at -c and at
start, names resolved in $CREDENTIALS_DIRECTORY or next to the configuration, a reload that
re-reads the file, the -c warning for a password written in the main file, `ctl`."""

import os
import re
import signal
import subprocess

import pytest

import spop_client as sc
from conftest import SPOA_BIN, Redis, agent_config, agent_env, free_port, to_libconfig, wait_until
from test_cluster import resp
from test_overrides import ctl

PW = "s3cret pw/with spaces"


class AuthRedis(Redis):
    """A redis-server started with --requirepass; cmd() authenticates first."""

    def __init__(self, procs, tmp, password):
        self.password = password
        super().__init__(procs, tmp)

    def argv(self):
        return super().argv() + ["--requirepass", self.password]

    def cmd(self, *args, timeout=2.0):
        return resp(self.port, *args, password=self.password, timeout=timeout)


def secret_file(path, content, mode=0o600):
    """Writes <content> (str or bytes) to <path> with <mode>; returns the path."""
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    os.chmod(path, mode)
    return path


def conf_file(tmp, name="agent.conf", **redis_cfg):
    """A configuration file for Redis at 127.0.0.1:6379 with <redis_cfg>: its path."""
    cfg = agent_config("127.0.0.1:%d" % free_port(), "127.0.0.1:6379")
    cfg["redis"].update(redis_cfg)
    p = tmp / name
    p.write_text(to_libconfig(cfg))
    return p


def run(*args, env=None):
    """The agent binary with <args> (exits at once on a bad file): CompletedProcess."""
    e = agent_env()
    e.pop("CREDENTIALS_DIRECTORY", None)
    e.update(env or {})
    return subprocess.run([str(SPOA_BIN)] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=20, env=e)


def line_of(conf, key):
    """The line of <conf> that sets <key>."""
    for i, line in enumerate(conf.read_text().splitlines(), 1):
        if re.search(r"\b%s\s*=" % key, line):
            return i
    raise AssertionError("%s not in %s" % (key, conf))


def decide(c, key, n, sid0=1):
    """<n> decisions of <key>: the list of allow values; none may be degraded."""
    out = []
    for i in range(n):
        v = c.request(sid0 + 2 * i, 1, [sc.rl_message(key=key)])
        assert "degraded" not in v, v
        out.append(v["allow"])
    return out


def test_password_file_decisions_exact(agent_bin, procs, tmp, agent):
    """A password file (final newline dropped, spaces kept) against a Redis that requires
    it: every decision made by Redis, exactly 5 of 6 admitted; the key is in Redis."""
    r = AuthRedis(procs, tmp, PW)
    pw = secret_file(tmp / "redis-password", PW + "\n")
    a = agent(redis=r, redis_cfg={"password_file": str(pw)})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert decide(c, "pf-a", 6) == [1, 1, 1, 1, 1, 0]
    assert r.cmd("DBSIZE") >= 1
    log = a.proc.log_text()
    assert "AUTH" not in log and PW not in log, log[-2000:]
    assert "password is written in the configuration" not in log


def test_password_file_with_acl_user(agent_bin, procs, tmp, agent):
    """An ACL user's password in a group-readable file (0640, as the package's files) with
    a CRLF line ending: AUTH user password, decisions exact."""
    r = AuthRedis(procs, tmp, "default-pw")
    r.cmd("ACL", "SETUSER", "rl", "on", ">acl-pw", "~*", "+@all")
    pw = secret_file(tmp / "acl-password", "acl-pw\r\n", 0o640)
    a = agent(redis=r, redis_cfg={"user": "rl", "password_file": str(pw)})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert decide(c, "acl-a", 6) == [1, 1, 1, 1, 1, 0]
    names = [e for e in r.cmd("CLIENT", "LIST").splitlines() if " user=rl " in e]
    assert names, "no connection of user rl"


@pytest.mark.parametrize("mode,what", [(0o644, "readable"), (0o604, "readable"),
                                       (0o602, "writable"), (0o666, "readable")])
def test_file_others_can_use_is_refused(agent_bin, tmp, mode, what):
    """Readable or writable by others: refused by -c and at start, with the mode to set."""
    pw = secret_file(tmp / "pw", "x", mode)
    conf = conf_file(tmp, password_file=str(pw))
    msg = "%s:%d: redis.password_file '%s': is %s by others (mode %04o): set mode 0600, " \
          "or 0640" % (conf, line_of(conf, "password_file"), pw, what, mode)
    for args in (("-c", "-f", conf), ("-f", conf)):
        r = run(*args)
        assert r.returncode == 1 and msg in r.stderr, (args, r)
    os.chmod(pw, 0o640)
    assert run("-c", "-f", conf).returncode == 0


@pytest.mark.parametrize("content,what", [
    (b"", "is empty"),
    (b"\n", "is empty"),
    (b"a\x00b", "holds a NUL byte or a line break inside"),
    (b"first\nsecond\n", "holds a NUL byte or a line break inside"),
    (b"first\rsecond", "holds a NUL byte or a line break inside"),
    (b"x" * 4097, "is larger than 4096 bytes"),
])
def test_unusable_content_is_an_error(agent_bin, tmp, content, what):
    pw = secret_file(tmp / "pw", content)
    conf = conf_file(tmp, password_file=str(pw))
    r = run("-c", "-f", conf)
    assert r.returncode == 1, r
    assert "redis.password_file '%s': %s" % (pw, what) in r.stderr, r.stderr
    assert "x" * 100 not in r.stderr and "second" not in r.stderr  # never the content


def test_missing_file_or_not_a_file(agent_bin, tmp):
    conf = conf_file(tmp, password_file=str(tmp / "nope"))
    for args in (("-c", "-f", conf), ("-f", conf)):
        r = run(*args)
        assert r.returncode == 1, r
        assert "%s:%d: redis.password_file '%s': cannot open: No such file or directory" % (
            conf, line_of(conf, "password_file"), tmp / "nope") in r.stderr, r.stderr
    os.mkfifo(tmp / "fifo", 0o600)          # opened without blocking, then refused
    conf = conf_file(tmp, "fifo.conf", password_file=str(tmp / "fifo"))
    r = run("-c", "-f", conf)
    assert r.returncode == 1 and "is not a regular file" in r.stderr, r


def test_symlink_checked_on_what_it_points_to(agent_bin, tmp):
    """The checks are those of the file read: a link (as Kubernetes mounts secrets) to a
    private file is fine, a link to a world-readable one is refused."""
    secret_file(tmp / "private", "pw")
    secret_file(tmp / "public", "pw", 0o644)
    os.symlink(tmp / "private", tmp / "to-private")
    os.symlink(tmp / "public", tmp / "to-public")
    assert run("-c", "-f", conf_file(tmp, password_file=str(tmp / "to-private"))).returncode == 0
    r = run("-c", "-f", conf_file(tmp, "b.conf", password_file=str(tmp / "to-public")))
    assert r.returncode == 1 and "is readable by others (mode 0644)" in r.stderr, r


def test_password_and_password_file_together(agent_bin, tmp):
    pw = secret_file(tmp / "pw", "x")
    conf = conf_file(tmp, password="inline", password_file=str(pw))
    r = run("-c", "-f", conf)
    assert r.returncode == 1, r
    assert "%s:%d: redis: 'password' and 'password_file' together" % (
        conf, line_of(conf, "password_file")) in r.stderr, r.stderr
    conf = conf_file(tmp, "empty.conf", password_file="")
    r = run("-c", "-f", conf)
    assert r.returncode == 1 and "redis.password_file is empty" in r.stderr, r


def test_relative_name_credentials_directory_or_next_to_config(agent_bin, procs, tmp, agent,
                                                             monkeypatch):
    """A relative name: in $CREDENTIALS_DIRECTORY when set (systemd's LoadCredential=,
    files 0400), else next to the configuration file."""
    creds = tmp / "credentials"
    creds.mkdir()
    secret_file(creds / "redis-password", PW, 0o400)
    conf = conf_file(tmp, password_file="redis-password")
    r = run("-c", "-f", conf)
    assert r.returncode == 1 and "redis.password_file '%s'" % (tmp / "redis-password") \
        in r.stderr, r
    r = run("-c", "-f", conf, env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert r.returncode == 0, r
    # a configuration named relatively: the file next to it, relative to the same directory
    secret_file(tmp / "redis-password", PW)
    r = subprocess.run([str(SPOA_BIN), "-c", "-f", "agent.conf"], capture_output=True,
                       text=True, timeout=20, cwd=str(tmp),
                       env={k: v for k, v in agent_env().items() if k != "CREDENTIALS_DIRECTORY"})
    assert r.returncode == 0, r
    # the agent with a credential: decisions exact
    os.unlink(tmp / "redis-password")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    red = AuthRedis(procs, tmp, PW)
    a = agent(redis=red, redis_cfg={"password_file": "redis-password"})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert decide(c, "cred-a", 6) == [1, 1, 1, 1, 1, 0]


def test_reload_rereads_the_file(agent_bin, procs, tmp, agent):
    """The password is rotated: Redis takes the new one, the file gets it, SIGHUP. Open
    connections stay authenticated; the next connection (after CLIENT KILL) uses the new
    password: decisions exact again. A file that became unusable fails the reload and the
    running configuration stays."""
    r = AuthRedis(procs, tmp, "old-pw")
    pw = secret_file(tmp / "redis-password", "old-pw\n")
    a = agent(redis=r, redis_cfg={"password_file": str(pw)})
    with sc.SpopClient(a.addr) as c:
        c.hello()
        assert decide(c, "rot-a", 2) == [1, 1]
        r.cmd("CONFIG", "SET", "requirepass", "new-pw")
        r.password = "new-pw"
        secret_file(pw, "new-pw\n")
        a.proc.signal(signal.SIGHUP)
        wait_until(lambda: "reload: Redis credentials changed, used from the next connection"
                   in a.proc.log_text(), 10, 0.05, "credentials reloaded")
        assert decide(c, "rot-a", 1, 101) == [1]       # the connection still open
        r.cmd("CLIENT", "KILL", "TYPE", "normal")       # the agent's, not this one (SKIPME)
        a.wait_store()
        assert decide(c, "rot-a", 3, 201) == [1, 1, 0]
        # an unusable file: the reload fails, the rules and credentials stay
        os.chmod(pw, 0o644)
        a.proc.signal(signal.SIGHUP)
        wait_until(lambda: "reload (SIGHUP) failed" in a.proc.log_text(), 10, 0.05,
                   "failed reload")
        assert "redis.password_file '%s': is readable by others" % pw in a.proc.log_text()
        r.cmd("CLIENT", "KILL", "TYPE", "normal")
        a.wait_store()
        assert decide(c, "rot-b", 1, 301) == [1]
    log = a.proc.log_text()
    assert "ignored until restart" not in log and "new-pw" not in log, log[-3000:]


def test_inline_password_warned_by_check_and_once_at_start(agent_bin, procs, tmp, agent):
    """-c warns (file:line, exit 0) of a password written in the main file; the agent
    logs the same once at start, with workers too, and not again on reload."""
    conf = conf_file(tmp, password="inline-pw")
    r = run("-c", "-f", conf)
    warning = "%s:%d: warning: the Redis password is written in the configuration file: " \
              "put it in a file of its own" % (conf, line_of(conf, "password"))
    assert r.returncode == 0 and warning in r.stderr, r
    assert "redis.password_file" in r.stderr and "inline-pw" not in r.stderr + r.stdout
    red = AuthRedis(procs, tmp, "inline-pw")
    a = agent(redis=red, redis_cfg={"password": "inline-pw"}, args=("-w", 2))
    a.reload()
    wait_until(lambda: a.proc.log_text().count("reload (SIGHUP) ok") == 2, 10, 0.05,
               "both workers reloaded")
    assert a.proc.log_text().count("warning: the Redis password is written") == 1
    assert run("-c", "-f", conf_file(tmp, "none.conf")).stderr == ""


def test_ctl_with_password_file(agent_bin, procs, tmp, agent):
    """`spoa-ratelimit ctl` reads the configuration's password file too."""
    r = AuthRedis(procs, tmp, PW)
    pw = secret_file(tmp / "redis-password", PW + "\n")
    a = agent(redis=r, redis_cfg={"password_file": str(pw)})
    rc, out, err = ctl(a, "block", "ip:10.9.9.9", "--for", "1m")
    assert rc == 0, (rc, out, err)
    rc, out, err = ctl(a, "list")
    assert rc == 0 and "10.9.9.9" in out, (rc, out, err)
    secret_file(pw, "wrong-pw")
    rc, out, err = ctl(a, "list")
    assert rc == 1 and "AUTH" in err, (rc, out, err)
    os.chmod(pw, 0o644)
    rc, out, err = ctl(a, "list")
    assert rc == 1 and "is readable by others" in err, (rc, out, err)
