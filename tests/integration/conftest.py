"""Fixtures for the integration tests: real redis-server, real HAProxy, the agent binary.

Everything listens on 127.0.0.1 on ports picked by free_port(); each test gets its own
temporary directory, processes and logs. Processes are stopped with SIGTERM, then SIGKILL
after a deadline; when a test fails, the logs of every process it started are printed.

Environment:
  SPOA_BIN      agent binary (default: <repo>/build/spoa-ratelimit)
  HAPROXY_BIN   haproxy binary (default: haproxy on PATH)
  REDIS_BIN     redis-server binary (default: redis-server on PATH; valkey-server works)
  REDIS_CLI     redis-cli binary for the cluster tests (default: redis-cli on PATH, else
                valkey-cli)

Markers, set at collection (tests/matrix/ selects with them): `haproxy` on every test that
runs a real HAProxy (the haproxy/stack/upstream fixtures, test_haproxy_config.py).
"""

import hashlib
import hmac
import http.client
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))
from rlharness import LcList, redis_cmd, to_libconfig  # noqa: E402,F401  (re-exported)
from rlharness import resp_read as _resp_read  # noqa: E402,F401  (re-exported)

REPO = HERE.parent.parent
HAPROXY_DIR = REPO / "haproxy"
SPOA_BIN = Path(os.environ.get("SPOA_BIN") or REPO / "build" / "spoa-ratelimit")
HAPROXY_BIN = os.environ.get("HAPROXY_BIN") or shutil.which("haproxy") or "/usr/sbin/haproxy"
REDIS_BIN = os.environ.get("REDIS_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = (os.environ.get("REDIS_CLI") or shutil.which("redis-cli") or shutil.which("valkey-cli")
             or "/usr/bin/redis-cli")


def _version_of(argv, pattern):
    """(major, minor) from the first match of <pattern> in <argv>'s output; (0, 0) if the
    binary is missing or says nothing that matches."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    m = re.search(pattern, out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


HAPROXY_VERSION = _version_of([HAPROXY_BIN, "-v"], r"version (\d+)\.(\d+)")
REDIS_VERSION = _version_of([REDIS_BIN, "--version"], r"v=(\d+)\.(\d+)")


def agent_errors(*codes):
    """The txn.rl.err values this HAProxy sets (`option set-on-error`) for the events that
    HAProxy 2.6 reports as <codes>: 1 (timeout, agent unreachable), 2 (no agent server
    UP), 256 + N (SPOP error N; 257 is an I/O error, e.g. the agent killed). HAProxy 3.0
    still runs the SPOE applets of 2.6 and says the same. From 3.1 on (the SPOP
    multiplexer), "no server UP" and an agent's DISCONNECT are 257 too, and an agent
    that cannot be reached is 1 or 257 depending on when the connection fails."""
    out = set()
    new_mux = HAPROXY_VERSION >= (3, 1)
    for c in codes:
        if new_mux and c in (2, 256):
            out.add("257")
        elif new_mux and c == 1:
            out.update(("1", "257"))
        else:
            out.add(str(c))
    return out


HAPROXY_FIXTURES = {"haproxy", "stack", "upstream"}


def pytest_configure(config):
    config.addinivalue_line("markers", "haproxy: the test runs a real HAProxy")


# Modules whose tests (or most of them) run the sample gateway through HAProxy(...) itself.
HAPROXY_MODULES = {"test_haproxy_config", "test_post_charge", "test_quota_route"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HAPROXY_FIXTURES & set(getattr(item, "fixturenames", ())) or \
                item.module.__name__ in HAPROXY_MODULES:
            item.add_marker(pytest.mark.haproxy)

# Sanitizer reports in a process log fail the test (the agent may run as an ASan build).
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer")


# ---------------------------------------------------------------------------------------
# Small helpers

def free_port(host="127.0.0.1"):
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n, host="127.0.0.1"):
    """<n> distinct TCP ports that were free a moment ago (all bound at once, then closed:
    two free_port() calls in a row may return the same port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = [socket.socket(family, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(host, port, timeout=10.0, proc=None):
    """Wait until a TCP connect to host:port succeeds; fail early if <proc> exited."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and not proc.alive():
            raise RuntimeError("%s exited with %s before listening on %s:%d\n%s" % (
                proc.name, proc.returncode(), host, port, proc.log_tail()))
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError("nothing listening on %s:%d after %.1fs" % (host, port, timeout))
        time.sleep(0.05)


class PortTaken(RuntimeError):
    """The port chosen for a server was taken by another process before the server bound it."""


def wait_own_redis(port, proc, timeout=10.0, password=None):
    """Wait until the redis-server (or Sentinel) <proc> answers on <port>, and make sure the
    process answering is <proc> itself (INFO's process_id): a free port is only free a moment,
    and a process of another test run on this machine may bind it first. Then <proc> exits
    ("Address already in use") while a bare connect to the port would still succeed.
    Raises PortTaken in that case, RuntimeError on other failures."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        if not proc.alive():
            tail = proc.log_tail()
            cls = PortTaken if "already in use" in tail else RuntimeError
            raise cls("%s exited with %s before listening on 127.0.0.1:%d\n%s" % (
                proc.name, proc.returncode(), port, tail))
        try:
            if password:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    f = s.makefile("rb")
                    for cmd in (("AUTH", password), ("INFO", "server")):
                        s.sendall(b"*%d\r\n" % len(cmd) + b"".join(
                            b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in cmd))
                        last = _resp_read(f)
            else:
                last = redis_cmd(port, "INFO", "server", timeout=1.0)
            if isinstance(last, bytes):
                last = last.decode(errors="replace")
            m = re.search(r"process_id:(\d+)", last or "")
            if m and int(m.group(1)) == proc.pid:
                return
            if m:
                raise PortTaken("127.0.0.1:%d is answered by process %s, not by %s (pid %d)" % (
                    port, m.group(1), proc.name, proc.pid))
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError("%s does not answer INFO on 127.0.0.1:%d after %.1fs (last: %r)"
                               % (proc.name, port, timeout, last))
        time.sleep(0.05)


def spawn_redis(procs, name, argv_for, attempts=3, password=None):
    """Start a redis-server-like process on a free port: argv_for(port) gives its command
    line. When the port is taken under it (PortTaken), the process is stopped and started
    again on another port. Returns (proc, port)."""
    for attempt in range(attempts):
        port = free_port()
        p = procs.spawn(name, argv_for(port))
        try:
            wait_own_redis(port, p, password=password)
            return p, port
        except PortTaken:
            p.stop()
            if attempt == attempts - 1:
                raise


def vm_rss_kb(pid):
    """The resident memory of process <pid> in kB (/proc/<pid>/status)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def wait_until(pred, timeout, interval=0.1, what="condition", diagnose=None):
    """Poll <pred> until it returns a true value (returned) or the deadline passes;
    <diagnose>(), when given, adds what it returns to the message of a timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s (last: %r)%s" % (
                timeout, what, last, "; " + diagnose() if diagnose else ""))
        time.sleep(interval)


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client that goes away mid-answer (HAProxy closing a connection a test timed
    out) is normal here: say nothing of it; any other handler error is printed."""

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class StubApp:
    """A stand-in application on a free loopback port: an HTTP server answering with
    <handler> (a BaseHTTPRequestHandler subclass) in a thread; close() stops it."""

    def __init__(self, handler):
        self.port = free_port()
        self.srv = _QuietServer(("127.0.0.1", self.port), handler)
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name, argv, log_path, env=None, cwd=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.p = None
        self.expect_exit_zero = True
        self.is_agent = False           # set by Agent: its SIGTERM exit status is checked
        self.start()

    def start(self):
        assert self.p is None or self.p.poll() is not None, "%s already running" % self.name
        logf = open(self.log_path, "ab")
        logf.write(("==== %s: %s\n" % (time.strftime("%H:%M:%S"), " ".join(self.argv))).encode())
        logf.flush()
        self.p = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=logf,
                                  stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        logf.close()

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def returncode(self):
        return self.p.poll() if self.p else None

    def signal(self, sig):
        """Sends <sig>. SIGSTOP and SIGCONT return once they took effect (the process is
        stopped, or running again): a signal is delivered asynchronously, and on a busy
        machine a test's next step could otherwise meet a process still running."""
        if not self.alive():
            return
        self.p.send_signal(sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            want_stopped = sig == signal.SIGSTOP
            wait_until(lambda: (self._state() in ("T", "t")) == want_stopped or not self.alive(),
                       5, 0.001, "%s %s" % (self.name, "stopped" if want_stopped else "resumed"))

    def _state(self):
        """The process state letter from /proc/<pid>/stat ("" if it is gone)."""
        try:
            with open("/proc/%d/stat" % self.p.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return ""

    def kill(self):
        """SIGKILL, as a crash would; the exit status is then not checked."""
        self.expect_exit_zero = False
        if self.alive():
            self.p.kill()
            self.p.wait(10)

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after <timeout>. Returns the exit status."""
        if self.p is None:
            return None
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
                self.log_note("killed with SIGKILL after %.0fs without exiting on SIGTERM"
                              % timeout)
                return "sigkill"
        return self.p.returncode

    def log_note(self, text):
        with open(self.log_path, "ab") as f:
            f.write(("==== %s\n" % text).encode())

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, nbytes=6000):
        t = self.log_text()
        return t[-nbytes:]


class ProcGroup:
    """Every process a test starts; stopped in reverse order at teardown."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def spawn(self, name, argv, env=None, cwd=None):
        n = sum(1 for p in self.procs if p.name.split("#")[0] == name)
        if n:
            name = "%s#%d" % (name, n + 1)
        log = self.tmp / ("%s.log" % name.replace("#", "-"))
        p = Proc(name, argv, log, env=env, cwd=cwd)
        self.procs.append(p)
        return p

    def stop_all(self):
        problems = []
        for p in reversed(self.procs):
            rc = p.stop()
            if p.is_agent and p.expect_exit_zero and rc not in (0, None):
                problems.append("%s exited with %r on SIGTERM (expected 0)" % (p.name, rc))
        for p in self.procs:
            text = p.log_text()
            for m in SANITIZER_MARKERS:
                if m in text:
                    problems.append("%s log contains %r" % (p.name, m))
                    break
        return problems

    def dump_logs(self):
        out = []
        for p in self.procs:
            out.append("\n======== %s (pid %s, exit %s) log %s ========\n%s" % (
                p.name, p.p.pid if p.p else "-", p.returncode(), p.log_path, p.log_tail(20000)))
        return "".join(out)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def tmp(tmp_path):
    """Per-test temporary directory."""
    return tmp_path


@pytest.fixture
def procs(request, tmp):
    group = ProcGroup(tmp)
    yield group
    problems = group.stop_all()
    failed = any(getattr(request.node, "rep_" + w, None) is not None
                 and getattr(request.node, "rep_" + w).failed for w in ("setup", "call"))
    if failed or problems:
        sys.stderr.write(group.dump_logs())
    if problems and not failed:
        pytest.fail("teardown: " + "; ".join(problems), pytrace=False)


# ---------------------------------------------------------------------------------------
# Redis

class Redis:
    """A redis-server owned by the test, with stop/start/restart for outage tests."""

    def __init__(self, procs, tmp):
        self.procs = procs
        self.port = free_port()
        self.dir = tmp / "redis"
        self.dir.mkdir(exist_ok=True)
        self.proc = None
        self.start()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def argv(self):
        return [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
                "--protected-mode", "no", "--unixsocket", str(self.unix_path),
                "--unixsocketperm", "700"]

    @property
    def unix_path(self):
        return self.dir / "redis.sock"

    @property
    def unix_address(self):
        return "unix:%s" % self.unix_path

    def start(self):
        if self.proc is None:
            self.proc = self.procs.spawn("redis", self.argv())
        else:
            self.proc.start()
        wait_port("127.0.0.1", self.port, 10, self.proc)
        wait_until(lambda: self.ping(), 10, what="redis PING")

    def stop(self):
        rc = self.proc.stop()
        # The port must be free for clients to see "connection refused" at once.
        wait_until(lambda: not _can_connect("127.0.0.1", self.port), 5,
                   what="redis port closed")
        return rc

    def restart(self):
        self.stop()
        self.start()

    def alive(self):
        return self.proc is not None and self.proc.alive()

    def cmd(self, *args, timeout=2.0):
        """Run one command with a minimal RESP client; return the decoded reply."""
        return redis_cmd(self.port, *args, timeout=timeout)

    def ping(self):
        try:
            return self.cmd("PING") == "PONG"
        except OSError:
            return False


def _can_connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


@pytest.fixture
def redis(procs, tmp):
    return Redis(procs, tmp)


# ---------------------------------------------------------------------------------------
# Agent

# Limits used by default: periods of a minute or more, so that a slow machine does not
# refill a token in the middle of a test.
DEFAULT_LIMITS = {
    "key_rpm": {"rate": 5, "period": "1m"},
    "key_day": {"rate": 1000, "period": "1d"},
    "pro_rpm": {"rate": 10, "period": "1m"},
    "anon_rpm": {"rate": 3, "period": "1m"},
}
DEFAULT_TIERS = {
    "free": {"limits": ["key_rpm", "key_day"]},
    "pro": {"limits": ["pro_rpm"]},
}


def agent_config(listen, redis_address=None, **over):
    """The agent's config as a dict; keyword arguments replace top-level entries
    (a value of None removes the entry)."""
    cfg = {
        "listen": listen,
        "log_level": "info",
        "store": "redis" if redis_address else "allow",
        "redis": {
            "address": redis_address or "127.0.0.1:1",
            "connect_timeout_ms": 200,
            "command_timeout_ms": 150,
            "key_prefix": "rl",
            # the agents of these tests keep their limits' states in key layout 2 (one
            # key per client: lua/state.lua); layout 1, the default, is what the
            # script-level tests and test_key_layout.py run
            "key_layout": 2,
        },
        "limits": DEFAULT_LIMITS,
        "tiers": DEFAULT_TIERS,
        "default_tier": "free",
        # the tests send keys without tiers and expect default_tier's limits; the
        # agent's own default ("anonymous") is tested with unknown_keys=None
        "unknown_keys": "default_tier",
        "anonymous": {"limits": ["anon_rpm"], "ipv6_prefix": 64},
        "response": {"legacy_headers": True},
    }
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def limit_state(cmd, principal, field, prefix="rl"):
    """The state text Redis holds for limit <field> (its name; "@<endpoint>" after it for
    an endpoint's, "c:" before it for a candidate policy's) of <principal> ("k:<32 hex>",
    "ip4:..."): its entry in the principal's key (key layout 2, the agents' default), else
    its own key (layout 1); None when neither holds it. <cmd> sends one command
    (Redis.cmd, a cluster node's)."""
    v = cmd("GET", "%s:v2:{%s}" % (prefix, principal))
    for e in (v.split("|")[1:] if v else []):
        name, _, state = e.partition("=")
        if name == field:
            return state
    key = "%s:{%s}:%s" % (prefix, principal, field)
    return cmd("GET", key) if cmd("TYPE", key) == "string" else None


def key_principal(api_key):
    """The principal part of the Redis keys of API key <api_key>: "k:" + 32 hex digits."""
    return "k:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


# The fleet's fingerprint secret of the tests (metrics.fingerprint_secret_file): every
# agent with a metrics group gets it unless the test names its own file, or None (the
# agent's random secret). fingerprint() computes what the agents show with it.
FP_SECRET = "tests-fleet-fingerprint-secret-0123456789abcdef"


def fp_secret_file(tmp, secret=FP_SECRET, name="fingerprint.secret", mode=0o600):
    """Writes <secret> (and a newline) to <tmp>/<name> with <mode>; returns its path."""
    path = tmp / name
    path.write_text(secret + "\n")
    path.chmod(mode)
    return path


def fingerprint(key, secret=FP_SECRET):
    """What people see of API key <key>: "fp:" + 16 hex digits of HMAC-SHA256(<secret>,
    the first 16 bytes of SHA-256(key)), the Redis key part's digest."""
    digest = hashlib.sha256(key.encode()).digest()[:16]
    return "fp:" + hmac.new(secret.encode(), digest, hashlib.sha256).hexdigest()[:16]


def unkeyed_prefix(key, hexdigits=16):
    """The unkeyed SHA-256 prefix of <key> (what earlier versions showed, 8 digits)."""
    return hashlib.sha256(key.encode()).hexdigest()[:hexdigits]


def check_config(tmp, cfg):
    """`spoa-ratelimit -c` on the config dict <cfg>, written to <tmp>/check.conf."""
    path = tmp / "check.conf"
    path.write_text(to_libconfig(cfg))
    return subprocess.run([str(SPOA_BIN), "-c", "-f", str(path)], capture_output=True,
                          text=True, timeout=10)


def parse_listen(listen):
    """Agent listen string -> socket address: ("127.0.0.1", p), ("::1", p) or "/path"."""
    if listen.startswith("unix:"):
        return listen[5:]
    host, port = listen.rsplit(":", 1)
    return (host.strip("[]"), int(port))


def connect_to(addr, timeout=0.5):
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(addr)
        except OSError:
            s.close()
            raise
        return s
    return socket.create_connection(addr, timeout=timeout)


def wait_addr(addr, timeout=10.0, proc=None):
    """wait_port() for any agent address (TCP v4/v6 or unix socket path)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and not proc.alive():
            raise RuntimeError("%s exited with %s before listening on %r\n%s" % (
                proc.name, proc.returncode(), addr, proc.log_tail()))
        try:
            connect_to(addr).close()
            return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError("nothing listening on %r after %.1fs" % (addr, timeout))
        time.sleep(0.05)


class Agent:
    def __init__(self, procs, tmp, cfg, name="agent", wait_redis=True, args=()):
        """<args>: extra command-line arguments, e.g. ("-w", 2)."""
        self.procs = procs
        self.cfg = cfg
        self.addr = parse_listen(cfg["listen"])
        self.wait_redis = wait_redis and cfg.get("store") == "redis"
        self.conf_path = tmp / ("%s-%d.conf" % (name, len(procs.procs)))
        metrics = cfg.get("metrics")
        if isinstance(metrics, dict):
            if "fingerprint_secret_file" not in metrics:
                metrics["fingerprint_secret_file"] = str(fp_secret_file(tmp))
            elif metrics["fingerprint_secret_file"] is None:
                del metrics["fingerprint_secret_file"]
        self.conf_path.write_text(to_libconfig(cfg))
        self.proc = procs.spawn(name, [SPOA_BIN, "-f", self.conf_path] + list(args),
                                env=agent_env())
        self.proc.is_agent = True
        self._ready()

    def _ready(self):
        wait_addr(self.addr, 15, self.proc)
        if self.wait_redis:
            self.wait_store()

    def wait_store(self, timeout=10.0):
        """Wait until the agent decides with Redis (its first decisions, while it is still
        connecting, are fail-open). Probes with a throw-away key."""
        import spop_client as sc
        deadline = time.monotonic() + timeout
        with sc.SpopClient(self.addr) as c:
            c.hello()
            sid = 1
            while True:
                v = c.request(sid, 1, [sc.rl_message(key="__harness_probe__")])
                if not v.get("degraded"):
                    return
                if time.monotonic() >= deadline:
                    raise RuntimeError("agent still degraded after %.0fs\n%s" % (
                        timeout, self.proc.log_tail()))
                sid += 2
                time.sleep(0.05)

    @property
    def address(self):
        """The address in HAProxy's syntax (for RL_AGENT_ADDR)."""
        if isinstance(self.addr, str):
            return "unix@" + self.addr
        host, port = self.addr
        return ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)

    def alive(self):
        return self.proc.alive()

    @property
    def metrics_addr(self):
        """(host, port) of the metrics HTTP listener (config `metrics.listen`), or None."""
        listen = (self.cfg.get("metrics") or {}).get("listen")
        return parse_listen(listen) if listen else None

    def http(self, path, timeout=5.0):
        """GET <path> on the metrics listener: (status, body text)."""
        r = http_request(self.metrics_addr, path, timeout=timeout)
        return r.status, r.body.decode(errors="replace")

    def worker_pids(self):
        """Pids of the worker processes (children of the master; [] with one process)."""
        pid = self.proc.pid
        try:
            return [int(x) for x in
                    Path("/proc/%d/task/%d/children" % (pid, pid)).read_text().split()]
        except OSError:
            pass
        out = []                        # kernels without CONFIG_PROC_CHILDREN
        for d in Path("/proc").iterdir():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if d.name.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
        return sorted(out)

    def reload(self, text=None, **over):
        """Rewrite the config file (raw <text>, or the current dict with top-level
        entries replaced) and send SIGHUP."""
        if text is None:
            self.cfg = dict(self.cfg, **over)
            text = to_libconfig(self.cfg)
        self.conf_path.write_text(text)
        self.proc.signal(signal.SIGHUP)

    def kill(self):
        self.proc.kill()

    def stop(self):
        return self.proc.stop()

    def restart(self):
        if self.proc.alive():
            self.proc.stop()
        self.proc.expect_exit_zero = True
        self.proc.start()
        self._ready()


def agent_env():
    """Environment for the agent: sanitizer options for an ASan/UBSan build (ignored by a
    normal build), with the suppressions of lsan.supp (known third-party leaks)."""
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    supp = "suppressions=%s" % (HERE / "lsan.supp")
    env["LSAN_OPTIONS"] = supp + (":" + env["LSAN_OPTIONS"] if env.get("LSAN_OPTIONS") else "")
    return env


@pytest.fixture
def agent_bin():
    if not SPOA_BIN.exists():
        msg = "agent binary %s not built (run make, or set SPOA_BIN)" % SPOA_BIN
        # In CI, or when SPOA_BIN was given explicitly, a missing binary is an error.
        if os.environ.get("CI") or os.environ.get("SPOA_BIN"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return SPOA_BIN


@pytest.fixture
def agent(procs, tmp, agent_bin):
    """Factory: agent(redis=Redis|None, redis_cfg={...}, args=(...), metrics=False,
    **config overrides) -> Agent (started, listening). redis_cfg entries are merged into
    the `redis` group (a value of None removes the entry); args are extra command-line
    arguments (e.g. ("-w", 2)); metrics=True sets `metrics.listen` to a free loopback port
    (Agent.metrics_addr, Agent.http()), a dict the other `metrics` settings too (with the
    tests' fingerprint secret file unless it names one, or None for none)."""
    def start(redis=None, name="agent", redis_cfg=None, wait_redis=True, args=(),
              metrics=False, **over):
        ports = free_ports(2)
        listen = over.pop("listen", None) or "127.0.0.1:%d" % ports[0]
        if metrics:  # True, or a dict of metrics keys besides listen
            over["metrics"] = dict({"listen": "127.0.0.1:%d" % ports[1]},
                                   **(metrics if isinstance(metrics, dict) else {}))
        cfg = agent_config(listen, redis.address if redis else None, **over)
        for k, v in (redis_cfg or {}).items():
            if v is None:
                cfg["redis"].pop(k, None)
            else:
                cfg["redis"][k] = v
        return Agent(procs, tmp, cfg, name=name, wait_redis=wait_redis, args=args)
    return start


# ---------------------------------------------------------------------------------------
# HAProxy (gateway and upstream)

class HAProxy:
    def __init__(self, procs, tmp, agent_addr, upstream_addr, tiers=None,
                 spoe_timeout="500ms", cfg=None, name="haproxy"):
        self.port = free_port()
        self.front = ("127.0.0.1", self.port)
        map_path = tmp / ("tiers-%d.map" % self.port)
        map_path.write_text("".join("%s %s\n" % kv for kv in (tiers or {}).items()))
        self.map_path = map_path
        self.env = dict(os.environ)
        self.env.update({
            "RL_FRONT_ADDR": "127.0.0.1:%d" % self.port,
            "RL_AGENT_ADDR": agent_addr,
            "RL_UPSTREAM_ADDR": upstream_addr,
            "RL_SPOE_CONF": str(HAPROXY_DIR / "spoe-ratelimit.conf"),
            "RL_TIER_MAP": str(map_path),
            "RL_SPOE_TIMEOUT": spoe_timeout,
            "RL_STATS_SOCKET": str(tmp / ("haproxy-%d.sock" % self.port)),
        })
        cfg = cfg or HAPROXY_DIR / "haproxy.cfg"
        self.proc = procs.spawn(name, [HAPROXY_BIN, "-db", "-f", cfg], env=self.env,
                                cwd=str(tmp))
        wait_port("127.0.0.1", self.port, 15, self.proc)

    def request(self, path="/", api_key=None, source=None, method="GET", headers=None,
                timeout=5.0):
        return http_request(self.front, path, api_key, source, method, headers, timeout)

    def runtime(self, command, timeout=5.0):
        """One command on the runtime API (RL_STATS_SOCKET); returns the answer text."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.env["RL_STATS_SOCKET"])
            s.sendall(command.encode() + b"\n")
            out = b""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
            return out.decode(errors="replace")
        finally:
            s.close()


class Response:
    def __init__(self, status, headers, body, elapsed):
        self.status = status
        self.headers = headers          # lower-case name -> value (last one)
        self.body = body
        self.elapsed = elapsed

    def h(self, name):
        return self.headers.get(name.lower())

    def __repr__(self):
        return "Response(%d, %r, %r)" % (self.status, self.headers, self.body[:200])


def http_request(addr, path="/", api_key=None, source=None, method="GET", headers=None,
                 timeout=5.0):
    """One request on a fresh connection (optionally from a given source address)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        hdrs = {"Connection": "close"}
        if api_key is not None:
            hdrs["X-API-Key"] = api_key
        hdrs.update(headers or {})
        conn.request(method, path, headers=hdrs)
        r = conn.getresponse()
        body = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, body,
                        time.monotonic() - t0)
    finally:
        conn.close()


@pytest.fixture
def upstream(procs):
    """The stand-in application server (haproxy/upstream.cfg); returns its "ip:port"."""
    port = free_port()
    env = dict(os.environ, RL_UPSTREAM_ADDR="127.0.0.1:%d" % port)
    p = procs.spawn("upstream", [HAPROXY_BIN, "-db", "-f", HAPROXY_DIR / "upstream.cfg"],
                    env=env)
    wait_port("127.0.0.1", port, 15, p)
    return "127.0.0.1:%d" % port


@pytest.fixture
def haproxy(procs, tmp, upstream):
    """Factory: haproxy(agent_addr, tiers={key: tier}, spoe_timeout="500ms") -> HAProxy.
    The SPOE budget is raised from the production 10ms so that a loaded (or ASan) run
    does not flake; it stays above the agent's Redis command timeout (150ms here), so
    an answer from the agent is always seen."""
    def start(agent_addr, **kw):
        return HAProxy(procs, tmp, agent_addr, upstream, **kw)
    return start


class Stack:
    """Redis + agent + upstream + gateway, the usual set for a test."""

    def __init__(self, redis, agent, gw):
        self.redis, self.agent, self.gw = redis, agent, gw

    def get(self, *a, **kw):
        return self.gw.request(*a, **kw)


@pytest.fixture
def stack(redis, agent, haproxy):
    """Factory: stack(tiers={...}, spoe_timeout=..., **agent overrides) -> Stack."""
    def start(tiers=None, spoe_timeout="500ms", **agent_over):
        a = agent(redis=redis, **agent_over)
        gw = haproxy(a.address, tiers=tiers, spoe_timeout=spoe_timeout)
        return Stack(redis, a, gw)
    return start


# ---------------------------------------------------------------------------------------
# Structured fields (RFC 8941 lists), enough for RateLimit / RateLimit-Policy

def parse_sf_list(text):
    """Parse an sf-list of items with parameters: returns [(item, {param: value})].
    Items and values may be strings, tokens, integers, decimals or booleans."""
    s = text
    i = 0
    n = len(s)
    out = []

    def ws():
        nonlocal i
        while i < n and s[i] in " \t":
            i += 1

    def bare():
        nonlocal i
        if i >= n:
            raise ValueError("sf: unexpected end in %r" % s)
        c = s[i]
        if c == '"':
            i += 1
            buf = []
            while True:
                if i >= n:
                    raise ValueError("sf: unterminated string in %r" % s)
                c = s[i]
                i += 1
                if c == "\\":
                    if i >= n or s[i] not in '"\\':
                        raise ValueError("sf: bad escape in %r" % s)
                    buf.append(s[i])
                    i += 1
                elif c == '"':
                    return ("string", "".join(buf))
                elif ord(c) < 0x20 or ord(c) > 0x7e:
                    raise ValueError("sf: bad char in string %r" % s)
                else:
                    buf.append(c)
        if c == "-" or c.isdigit():
            j = i + 1
            while j < n and (s[j].isdigit() or s[j] == "."):
                j += 1
            num = s[i:j]
            i = j
            if "." in num:
                return ("decimal", float(num))
            if len(num.lstrip("-")) > 15:
                raise ValueError("sf: integer too long in %r" % s)
            return ("integer", int(num))
        if c == "?":
            v = s[i + 1:i + 2]
            i += 2
            if v not in ("0", "1"):
                raise ValueError("sf: bad boolean in %r" % s)
            return ("boolean", v == "1")
        if c.isalpha() or c == "*":
            j = i + 1
            while j < n and (s[j].isalnum() or s[j] in "_-.:%*/!#$&'+^`|~"):
                j += 1
            tok = s[i:j]
            i = j
            return ("token", tok)
        raise ValueError("sf: unexpected %r in %r" % (c, s))

    def key():
        nonlocal i
        j = i
        if j >= n or not (s[j].islower() or s[j] == "*"):
            raise ValueError("sf: bad key in %r" % s)
        while j < n and (s[j].islower() or s[j].isdigit() or s[j] in "_-.*"):
            j += 1
        k = s[i:j]
        i = j
        return k

    ws()
    while i < n:
        item = bare()
        params = {}
        while i < n and s[i] == ";":
            i += 1
            ws()
            k = key()
            if i < n and s[i] == "=":
                i += 1
                params[k] = bare()[1]
            else:
                params[k] = True
        out.append((item[1], params))
        ws()
        if i >= n:
            break
        if s[i] != ",":
            raise ValueError("sf: expected ',' at %d in %r" % (i, s))
        i += 1
        ws()
        if i >= n:
            raise ValueError("sf: trailing comma in %r" % s)
    return out
