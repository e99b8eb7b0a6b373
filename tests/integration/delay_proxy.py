"""A TCP proxy on loopback for the tests: a Redis far away (replies held back), or slow to
answer a new connection (joined to its upstream only after a while)."""

import queue
import socket
import threading
import time


class DelayProxy:
    """A TCP proxy on loopback in front of a Redis: each connection accepted is joined to
    the upstream after <join_delay> seconds (a Redis a few milliseconds away, or one slow
    to accept); then requests go through at once and every reply is held for <delay>
    seconds (settable) from when it reached the proxy (in order). Each connection has a
    thread per direction; all stop with close()."""

    def __init__(self, upstream_port, join_delay=0.0):
        self.upstream_port = upstream_port
        self.join_delay = join_delay
        self.delay = 0.0
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.closing = threading.Event()
        self.socks = []
        self.threads = []
        self.accepted = 0               # connections accepted so far
        self._spawn(self._accept)

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        while not self.closing.is_set():
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            self._spawn(self._join, c)

    def _join(self, c):
        self.socks.append(c)
        if self.join_delay:
            time.sleep(self.join_delay)
        if self.closing.is_set():
            return
        u = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        c.settimeout(None)
        u.settimeout(None)
        self.socks.append(u)
        held = queue.Queue()
        self._spawn(self._pump, c, u)
        self._spawn(self._read_replies, u, held)
        self._spawn(self._send_replies, held, c)

    def _pump(self, src, dst):
        try:
            while True:
                b = src.recv(65536)
                if not b:
                    break
                dst.sendall(b)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_replies(self, u, held):
        try:
            while True:
                b = u.recv(65536)
                if not b:
                    break
                held.put((time.monotonic() + self.delay, b))
        except OSError:
            pass
        held.put((0, None))

    def _send_replies(self, held, c):
        while True:
            at, b = held.get()
            if b is None:
                break
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                c.sendall(b)
            except OSError:
                break
        try:
            c.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self):
        self.closing.set()
        self.lsock.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(timeout=5)
