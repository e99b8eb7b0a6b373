"""A scriptable SPOP agent in Python, to test haproxy/*.cfg without the C agent.

It runs in threads inside the pytest process: one accept thread, one reader thread per
connection, and one timer per delayed ACK. `decide(messages)` returns (actions, delay_s)
for each NOTIFY; every NOTIFY seen is recorded in `.notifies` as decoded messages.
"""

import socket
import threading

import spop_client as sc


class FakeAgent:
    def __init__(self, decide, host="127.0.0.1"):
        self.decide = decide
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((host, 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.2)
        self.addr = self.lsock.getsockname()
        self.notifies = []
        self.healthchecks = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.conns = []
        self.timers = []
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    @property
    def addr_str(self):
        return "%s:%d" % self.addr

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        with self.lock:
            for t in self.timers:
                t.cancel()
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass
        self.lsock.close()

    def _accept_loop(self):
        while not self.stopping.is_set():
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _send(self, c, wlock, data):
        with wlock:
            try:
                c.sendall(data)
            except OSError:
                pass

    def _serve(self, c):
        c.settimeout(0.2)
        wlock = threading.Lock()
        buf = b""
        helloed = False
        while not self.stopping.is_set():
            try:
                data = c.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                break
            buf += data
            frames, buf = sc.split_frames(buf)
            for f in frames:
                if f.type == sc.T_HAPROXY_HELLO:
                    kv = f.kv()
                    mfs = kv["max-frame-size"].value if "max-frame-size" in kv else 16380
                    self._send(c, wlock, sc.agent_hello(mfs))
                    helloed = True
                    if "healthcheck" in kv and kv["healthcheck"].value:
                        with self.lock:
                            self.healthchecks += 1
                        c.close()
                        return
                elif f.type == sc.T_HAPROXY_DISCONNECT:
                    self._send(c, wlock, sc.disconnect(sc.T_AGENT_DISCONNECT, 0, ""))
                    c.close()
                    return
                elif f.type == sc.T_NOTIFY and helloed:
                    msgs = sc.decode_messages(f.payload)
                    with self.lock:
                        self.notifies.append(msgs)
                    actions, delay = self.decide(msgs)
                    frame = sc.ack(f.sid, f.fid, actions)
                    if delay:
                        t = threading.Timer(delay, self._send, (c, wlock, frame))
                        t.daemon = True
                        with self.lock:
                            self.timers.append(t)
                        t.start()
                    else:
                        self._send(c, wlock, frame)
        try:
            c.close()
        except OSError:
            pass


def txn_vars(**kv):
    """set-var actions in txn scope (the SPOE var-prefix is added by HAProxy)."""
    return [("set", sc.SCOPE_TXN, k, v) for k, v in kv.items()]
