"""A scripted fake Redis on loopback: enough RESP2 for the agent's store (SCRIPT LOAD,
CLUSTER SLOTS, EVALSHA/EVAL, HGET, HGETALL, AUTH), with the answers a test chooses. Used where a
real Redis cannot be made to misbehave: malformed topology replies, out-of-range integers.

    fr = FakeRedis(slots=[b"*1\\r\\n*1\\r\\n:1\\r\\n", ERR_NO_CLUSTER], script=ok_script)
    ...
    fr.close()

<slots>: the raw replies to successive CLUSTER SLOTS (the last one repeats).
<script>: a function (number of keys, argv) -> raw reply to EVALSHA/EVAL: bytes, or an
iterable of bytes sent one after the other (a reply without end: a generator, which should
stop when FakeRedis.closing is set; the connection's sending ends it too). The gateway
heartbeat (an EVAL on the key <prefix>:{gw}:gateways, every second from every agent) is
answered here, one live gateway, and never reaches it.
Every command received is recorded in .commands (list of argv lists of bytes).
"""

import socket
import threading
import time

ERR_NO_CLUSTER = b"-ERR This instance has cluster support disabled\r\n"
SHA = b"0123456789abcdef0123456789abcdef01234567"


def resp_int(v):
    return b":%d\r\n" % v


def resp_array(items):
    """A RESP array of raw replies."""
    return b"*%d\r\n" % len(items) + b"".join(items)


def script_reply(nkeys, values=None):
    """A well-formed answer of the rate-limit script for <nkeys> limits, all allowed, or
    the given flat integer list."""
    if values is None:
        now_us = int(time.time() * 1e6)
        values = [1, nkeys, now_us] + [1, 5, 0, 60000] * nkeys
    return resp_array([resp_int(v) for v in values])


class FakeRedis:
    def __init__(self, slots=(ERR_NO_CLUSTER,), script=None):
        self.slots = list(slots)
        self.script = script or (lambda nkeys, argv: script_reply(nkeys))
        self.commands = []
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closing = False
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def count(self, *prefix):
        """Commands received whose first words are <prefix> (str, case-insensitive)."""
        want = [p.upper().encode() for p in prefix]
        with self.lock:
            return sum(1 for c in self.commands
                       if [w.upper() for w in c[:len(want)]] == want)

    def close(self):
        self.closing = True
        try:
            self.sock.close()
        except OSError:
            pass
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self):
        while not self.closing:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _answer(self, argv):
        name = argv[0].upper()
        if name == b"SCRIPT":
            return b"$40\r\n" + SHA + b"\r\n"
        if name == b"CLUSTER":
            with self.lock:
                return self.slots.pop(0) if len(self.slots) > 1 else self.slots[0]
        if name == b"EVAL" and len(argv) > 3 and argv[3].endswith(b":{gw}:gateways"):
            return resp_int(1)
        if name in (b"EVALSHA", b"EVAL"):
            return self.script(int(argv[2]), argv)
        if name == b"HGET":
            return b"$-1\r\n"
        if name == b"HGETALL":
            return b"*0\r\n"
        return b"+OK\r\n"

    def _serve(self, c):
        f = c.makefile("rb")
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                if not line.startswith(b"*"):
                    return
                argv = []
                for _ in range(int(line[1:-2])):
                    n = int(f.readline()[1:-2])
                    argv.append(f.read(n + 2)[:-2])
                with self.lock:
                    self.commands.append(argv)
                answer = self._answer(argv)
                if isinstance(answer, (bytes, bytearray)):
                    c.sendall(answer)
                    continue
                for chunk in answer:
                    if self.closing:
                        return
                    c.sendall(chunk)
        except (OSError, ValueError):
            return
        finally:
            try:
                c.close()
            except OSError:
                pass
