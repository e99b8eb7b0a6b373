"""Process harness for tests/tools/demo.py and tests/tools/bench.py (standard library only).

Starts redis-server, HAProxy and the agent on free loopback ports, each with its output in a
log file of a private temporary directory, and guarantees they are gone when the script ends:

  * every child runs in its own session (a Ctrl-C in the terminal reaches only the script,
    which then stops the children in order) and gets PR_SET_PDEATHSIG=SIGTERM (Linux), so
    it is terminated even if the script itself is SIGKILLed;
  * Harness.close() stops children in reverse start order by PID: SIGTERM, then SIGKILL
    after a deadline, then reaps them; it runs from try/finally, from atexit, and on
    SIGTERM/SIGHUP/SIGALRM (turned into exceptions so the finally blocks run);
  * a watchdog (SIGALRM) bounds the whole run;
  * the temporary directory (tempfile.mkdtemp) is removed at the end.

Standard library only, so these scripts run with a bare /usr/bin/python3; the pytest
fixtures (tests/integration/conftest.py) import its Redis client and libconfig renderer.
"""

import atexit
import ctypes
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent.parent
HAPROXY_DIR = REPO / "haproxy"
HAPROXY_CFG = HAPROXY_DIR / "haproxy.cfg"
UPSTREAM_CFG = HAPROXY_DIR / "upstream.cfg"
SPOE_CONF = HAPROXY_DIR / "spoe-ratelimit.conf"

LOCALHOST = "127.0.0.1"


class SetupError(Exception):
    """Something could not be started or did not behave: not a performance result."""


class Watchdog(Exception):
    """The run exceeded its time bound."""


def which(name, env_var):
    p = os.environ.get(env_var) or shutil.which(name)
    if not p:
        for d in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"):
            if os.access(os.path.join(d, name), os.X_OK):
                return os.path.join(d, name)
        raise SetupError("%s not found (install it or set %s)" % (name, env_var))
    return p


# ---------------------------------------------------------------------------------------
# Children die with us

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):      # not Linux/glibc: the other safeguards remain
    _prctl = None


_GUARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)


def _child_setup(parent_pid):
    def setup():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _GUARDED)   # blocked around Popen
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent_pid:      # the parent died before prctl took effect
                os._exit(1)
    return setup


# ---------------------------------------------------------------------------------------
# Ports

def free_ports(n, host=LOCALHOST):
    """<n> distinct TCP ports that were free a moment ago (all bound at once, then
    released). Another program may still take one before we do: callers retry."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def can_connect(host, port, timeout=0.3):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# Processes

class Proc:
    def __init__(self, name, argv, log_path, popen):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.p = popen
        self.rc = None

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, nlines=25):
        return "\n".join(self.log_text().splitlines()[-nlines:])

    def stop(self, grace=5.0):
        """SIGTERM this PID, SIGKILL after <grace> seconds, reap. Returns the exit status
        (negative: killed by that signal)."""
        if self.p.poll() is None:
            try:
                self.p.send_signal(signal.SIGTERM)
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.rc = self.p.returncode
        return self.rc


class Harness:
    """Owns a temporary directory and every process started through it."""

    def __init__(self, prefix, time_limit):
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs = []          # running (or not yet stopped)
        self.all_procs = []      # every process started, for dump_logs()
        self.keep = False
        self.closed = False
        self.time_limit = time_limit
        self._old = {}
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, self._on_signal)
        self._old[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        signal.alarm(int(time_limit))

    def _on_signal(self, signum, frame):
        raise SystemExit(128 + signum)

    def _on_alarm(self, signum, frame):
        raise Watchdog("run exceeded its %d s bound" % self.time_limit)

    # -- processes

    def spawn(self, name, argv, env=None, cwd=None):
        argv = [str(a) for a in argv]
        log_path = self.tmp / ("%s.log" % name)
        n = 1
        while log_path.exists():
            n += 1
            log_path = self.tmp / ("%s.%d.log" % (name, n))
        with open(log_path, "wb") as logf:
            logf.write(("==== %s\n" % " ".join(argv)).encode())
            logf.flush()
            # No signal between the fork and the registration: a process we started is
            # always one close() knows about.
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _GUARDED)
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT, env=env,
                                     cwd=str(cwd or self.tmp), start_new_session=True,
                                     preexec_fn=_child_setup(os.getpid()))
                proc = Proc(name, argv, log_path, p)
                self.procs.append(proc)
                self.all_procs.append(proc)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return proc

    def stop(self, proc, grace=5.0):
        rc = proc.stop(grace)
        if proc in self.procs:
            self.procs.remove(proc)
        return rc

    def run(self, name, argv, timeout, env=None):
        """Run a short-lived command to completion (output captured, stderr merged);
        killed and reaped on timeout or interruption. Returns (rc, output)."""
        proc = self.spawn(name, argv, env=env)
        try:
            proc.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc, 1.0)
            raise SetupError("%s did not finish within %.0f s" % (name, timeout))
        self.stop(proc)
        text = proc.log_text()
        return proc.rc, text.split("\n", 1)[1] if "\n" in text else ""

    def wait_listening(self, proc, port, timeout):
        deadline = time.monotonic() + timeout
        while True:
            if not proc.alive():
                raise SetupError("%s exited with %s before listening on port %d:\n%s" % (
                    proc.name, proc.p.returncode, port, indent(proc.log_tail())))
            if can_connect(LOCALHOST, port):
                return
            if time.monotonic() >= deadline:
                raise SetupError("%s: nothing listening on port %d after %.0f s:\n%s" % (
                    proc.name, port, timeout, indent(proc.log_tail())))
            time.sleep(0.03)

    def start_listening(self, name, make_argv_env, attempts=3, timeout=10.0):
        """Start a server on a fresh free port; if it dies before listening (the port was
        taken meanwhile), retry on another port. make_argv_env(port) -> (argv, env).
        Returns (proc, port)."""
        last = None
        for i in range(attempts):
            port = free_ports(1)[0]
            argv, env = make_argv_env(port)
            proc = self.spawn(name if i == 0 else "%s-retry%d" % (name, i), argv, env=env)
            try:
                self.wait_listening(proc, port, timeout)
                proc.name = name
                return proc, port
            except SetupError as e:
                last = e
                exited_early = not proc.alive()
                self.stop(proc, 1.0)
                if not exited_early:
                    break
        raise last

    def dump_logs(self, out=sys.stderr, nlines=25):
        for p in self.all_procs:
            if p.name.endswith("-check") and p.rc == 0:
                continue
            out.write("---- %s (pid %d, %s) %s\n%s\n" % (
                p.name, p.pid, "running" if p.alive() else "exit %s" % p.p.returncode,
                p.log_path, indent(p.log_tail(nlines))))

    def close(self):
        """Stop every process still running (reverse start order), remove the temporary
        directory, restore signal handlers. Idempotent."""
        if self.closed:
            return
        self.closed = True
        signal.alarm(0)
        # Cleanup is bounded (a few seconds per process): let no signal interrupt it.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, signal.SIG_IGN)
        try:
            for p in reversed(list(self.procs)):
                try:
                    p.stop()
                except Exception as e:      # keep stopping the others
                    sys.stderr.write("warning: stopping %s (pid %d): %s\n" % (p.name, p.pid, e))
            self.procs.clear()
        finally:
            for sig, h in self._old.items():
                signal.signal(sig, h)
            if self.keep:
                sys.stderr.write("logs and configs kept in %s\n" % self.tmp)
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)


def indent(text, pad="    "):
    return "\n".join(pad + line for line in text.splitlines())


# ---------------------------------------------------------------------------------------
# Components

def start_redis(h, name="redis", extra=(), server=None):
    """redis-server on a free port, no persistence; <extra>: more command-line options
    (e.g. ("--enable-debug-command", "yes")); <server>: another server's binary (Valkey's)."""
    redis_bin = server or which("redis-server", "REDIS_BIN")
    rdir = h.tmp / name
    rdir.mkdir(exist_ok=True)

    def mk(port):
        return [redis_bin, "--port", port, "--bind", LOCALHOST, "--save", "",
                "--appendonly", "no", "--dir", rdir, "--daemonize", "no",
                "--protected-mode", "no"] + list(extra), None
    proc, port = h.start_listening(name, mk)
    deadline = time.monotonic() + 5
    while True:
        try:
            if redis_cmd(port, "PING") == "PONG":
                return proc, port
        except (OSError, RuntimeError):
            pass
        if time.monotonic() >= deadline:
            raise SetupError("redis on port %d does not answer PING" % port)
        time.sleep(0.05)


def start_cluster(h, masters=3, name="cluster"):
    """A Redis Cluster of <masters> masters (no replicas) on free ports, the slots split
    evenly, met and stable. Returns [(proc, port)]; the cluster bus on port + 10000."""
    for i in range(masters):      # a cluster of that name before: its node ids go
        conf = h.tmp / ("%s-%d" % (name, i)) / "nodes.conf"
        if conf.exists():
            conf.unlink()
    nodes = [start_redis(h, "%s-%d" % (name, i),
                         extra=("--cluster-enabled", "yes", "--cluster-config-file",
                                "nodes.conf", "--cluster-node-timeout", "5000"))
             for i in range(masters)]
    for i, (_, port) in enumerate(nodes):
        lo, hi = 16384 * i // masters, 16384 * (i + 1) // masters - 1
        redis_cmd(port, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
    for _, port in nodes[1:]:
        redis_cmd(port, "CLUSTER", "MEET", LOCALHOST, nodes[0][1])
    deadline = time.monotonic() + 20
    while True:
        infos = [redis_cmd(port, "CLUSTER", "INFO") for _, port in nodes]
        infos = [i.decode() if isinstance(i, bytes) else i for i in infos]
        if all("cluster_state:ok" in i and "cluster_known_nodes:%d" % masters in i
               for i in infos):
            return nodes
        if time.monotonic() >= deadline:
            raise SetupError("the cluster did not come up:\n%s" % indent(infos[0]))
        time.sleep(0.1)


def redis_cmd(port, *args, timeout=2.0, host=LOCALHOST):
    """One command on a fresh connection, minimal RESP2 client."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        req = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            req += b"$%d\r\n%s\r\n" % (len(a), a)
        s.sendall(req)
        return resp_read(s.makefile("rb"))


def resp_read(f):
    """One RESP2 reply from the binary file <f>: str, int, None, list; errors raise."""
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise OSError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError("redis: " + rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [resp_read(f) for _ in range(n)]
    raise RuntimeError("bad RESP line %r" % line)


def start_upstream(h, name="upstream"):
    haproxy_bin = which("haproxy", "HAPROXY_BIN")

    def mk(port):
        env = dict(os.environ, RL_UPSTREAM_ADDR="%s:%d" % (LOCALHOST, port))
        return [haproxy_bin, "-db", "-f", UPSTREAM_CFG], env
    return h.start_listening(name, mk)


class LcList(list):
    """A libconfig *list* `( a, b )`, whose elements may be groups (e.g. `endpoints`).
    to_libconfig renders a plain Python list or tuple as an array `[ a, b ]`."""


def to_libconfig(cfg, ind=0):
    """A dict as a libconfig document: dict -> group `{ }`, LcList -> list `( )`, other
    list/tuple -> array `[ ]`, strings, ints (64-bit with L), floats, bools."""
    def val(v, ind):
        if isinstance(v, dict):
            inner = "".join("%s%s = %s;\n" % ("  " * (ind + 1), k, val(x, ind + 1))
                            for k, x in v.items())
            return "{\n%s%s}" % (inner, "  " * ind)
        if isinstance(v, LcList):
            return "( %s )" % ", ".join(val(x, ind) for x in v)
        if isinstance(v, (list, tuple)):
            return "[ %s ]" % ", ".join(val(x, ind) for x in v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v) + ("L" if abs(v) > 2**31 - 1 else "")
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, str):
            return '"%s"' % v.replace("\\", "\\\\").replace('"', '\\"')
        raise TypeError("libconfig: %r" % (v,))
    pad = "  " * ind
    return "".join("%s%s = %s;\n" % (pad, k, val(v, ind)) for k, v in cfg.items())


def start_agent(h, agent_bin, cfg, name="agent"):
    """Write the agent's config (cfg without `listen`) for a fresh port, check it with
    `-c`, run the agent. Returns (proc, port, conf_path)."""
    conf = {}

    def mk(port):
        conf.clear()
        conf.update({"listen": "%s:%d" % (LOCALHOST, port)})
        conf.update(cfg)
        path = h.tmp / ("%s.conf" % name)
        path.write_text(to_libconfig(conf))
        rc, out = h.run(name + "-check", [agent_bin, "-c", "-f", path], timeout=10)
        if rc != 0:
            raise SetupError("agent config %s rejected:\n%s\n%s" % (
                path, indent(out), indent(path.read_text())))
        return [agent_bin, "-f", path], None
    proc, port = h.start_listening(name, mk)
    return proc, port, h.tmp / ("%s.conf" % name)


def agent_stats(h, proc, timeout=3.0):
    """SIGUSR1 -> the agent logs a `stats:` line; parsed into a dict of ints."""
    before = proc.log_text().count("stats:")
    proc.p.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = proc.log_text()
        if text.count("stats:") > before:
            line = [l for l in text.splitlines() if "stats:" in l][-1]
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
        time.sleep(0.05)
    raise SetupError("agent %s logged no stats after SIGUSR1" % proc.name)


def start_gateway(h, name, agent_port, upstream_port, tier_map, spoe_timeout, cfg_path=None):
    """HAProxy running haproxy.cfg (or a derived copy) with absolute paths in the env."""
    haproxy_bin = which("haproxy", "HAPROXY_BIN")
    cfg_path = cfg_path or HAPROXY_CFG

    def mk(port):
        env = dict(os.environ)
        env.update({
            "RL_FRONT_ADDR": "%s:%d" % (LOCALHOST, port),
            "RL_AGENT_ADDR": "%s:%d" % (LOCALHOST, agent_port),
            "RL_UPSTREAM_ADDR": "%s:%d" % (LOCALHOST, upstream_port),
            "RL_SPOE_CONF": str(SPOE_CONF),
            "RL_TIER_MAP": str(tier_map),
            "RL_SPOE_TIMEOUT": spoe_timeout,
        })
        return [haproxy_bin, "-db", "-f", cfg_path], env
    return h.start_listening(name, mk, timeout=15)


def haproxy_version():
    try:
        out = subprocess.run([which("haproxy", "HAPROXY_BIN"), "-v"], capture_output=True,
                             text=True, timeout=5).stdout
        m = re.search(r"version (\S+)", out)
        return m.group(1) if m else "?"
    except (OSError, subprocess.SubprocessError, SetupError):
        return "?"


# ---------------------------------------------------------------------------------------
# HTTP

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers          # [(name, value)] as received
        self.body = body

    def h(self, name):
        name = name.lower()
        for k, v in reversed(self.headers):
            if k.lower() == name:
                return v
        return None


class Client:
    """One keep-alive HTTP/1.1 connection (reopened if the server closed it)."""

    def __init__(self, port, timeout=5.0):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def get(self, path="/", headers=None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(LOCALHOST, self.port,
                                                       timeout=self.timeout)
            try:
                self.conn.request("GET", path, headers=headers or {})
                r = self.conn.getresponse()
                body = r.read()
                if r.will_close:
                    self.close()
                return Response(r.status, r.getheaders(), body)
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError, http.client.BadStatusLine):
                # an idle keep-alive connection closed by the server: one retry
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run_guarded(h, body, dump=None):
    """The main() of a tool: <body>() with harness <h>, returning its exit status; a setup
    failure or the watchdog prints why, dumps the logs (<dump>(h), else h.dump_logs()) and
    returns 2; Ctrl-C returns 130; <h> is closed whatever happens."""
    try:
        return body()
    except (SetupError, Watchdog) as e:
        print("\nSETUP FAILED: %s" % e, file=sys.stderr)
        (dump or Harness.dump_logs)(h)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr)
        return 130
    finally:
        h.close()


def poll(pred, timeout, interval=0.1, what="condition"):
    """Call pred() until it returns a true value (returned), at most <timeout> seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = pred()
        except OSError as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise SetupError("timed out after %.0f s waiting for %s (last: %r)" % (
                timeout, what, last))
        time.sleep(interval)


def setup_stdout():
    """Line-buffered stdout that never dies on a character the terminal cannot show."""
    try:
        sys.stdout.reconfigure(errors="replace", line_buffering=True)
    except (AttributeError, ValueError):
        pass
