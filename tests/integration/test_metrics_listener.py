"""The metrics listener's bounds, on real sockets: what one client may ask of it.

HTTP/1.1 connections are kept alive (a browser polling the status page, Prometheus) for at
most 100 requests, the last answered with "Connection: close"; requests pipelined in one
write are answered in order, no more than that bound; the door (allow-list, Host, token)
judges every request of a kept connection, and a refusal closes it; a client holding more
connections than metrics.max_connections has its oldest idle ones closed, and a new client
is still served.
"""
import socket
import time

REQUESTS_MAX = 100              # src/net/http.h HTTP_REQUESTS_MAX


def metric_value(a, name):
    status, text = a.http("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("%s not in /metrics" % name)


def connect(a):
    s = socket.create_connection(a.metrics_addr, timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def request(a, path, **headers):
    host = "%s:%d" % a.metrics_addr
    lines = ["GET %s HTTP/1.1" % path, "Host: " + headers.pop("Host", host)]
    lines += ["%s: %s" % kv for kv in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Reader:
    """Replies read off one socket: (status, {lower-case name: value}, body), or None at
    the server's close."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def reply(self):
        try:
            while b"\r\n\r\n" not in self.buf:
                self._fill()
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            hdrs = dict((k.lower(), v.strip()) for k, v in
                        (ln.split(":", 1) for ln in lines[1:]))
            n = int(hdrs["content-length"])
            while len(self.buf) < n:
                self._fill()
            body, self.buf = self.buf[:n], self.buf[n:]
            return int(lines[0].split()[1]), hdrs, body
        except (EOFError, ConnectionResetError):
            assert not self.buf, self.buf[:200]
            return None

    def closed(self):
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def test_keep_alive_serves_a_hundred_requests_then_closes(redis, agent):
    a = agent(redis=redis, metrics=True)
    with connect(a) as s:
        rd = Reader(s)
        for i in range(1, REQUESTS_MAX + 1):
            s.sendall(request(a, "/status.json" if i % 2 else "/healthz"))
            status, hdrs, body = rd.reply()
            assert status == 200, (i, body[:200])
            # every reply of a kept connection carries the door's headers
            assert hdrs["x-content-type-options"] == "nosniff"
            assert hdrs["cache-control"] == "no-store"
            assert hdrs["content-security-policy"].startswith("default-src 'none'")
            if i < REQUESTS_MAX:
                assert "connection" not in hdrs, (i, hdrs)
        assert hdrs["connection"] == "close"
        assert rd.closed()
    # a client that says close, or speaks HTTP/1.0, is closed after its reply
    for req in (request(a, "/healthz", Connection="close"),
                b"GET /healthz HTTP/1.0\r\nHost: %s:%d\r\n\r\n" % (
                    a.metrics_addr[0].encode(), a.metrics_addr[1])):
        with connect(a) as s:
            s.sendall(req)
            rd = Reader(s)
            status, hdrs, _ = rd.reply()
            assert status == 200 and hdrs["connection"] == "close"
            assert rd.closed()


def test_pipelined_requests_in_order_and_bounded(redis, agent):
    """150 requests in one write: the first 100 answered in order, then the close; the rest
    never read as requests. The agent answers a new client at once."""
    a = agent(redis=redis, metrics=True)
    paths = ["/healthz", "/status.json", "/nothing-here"]
    with connect(a) as s:
        s.sendall(b"".join(request(a, paths[i % 3]) for i in range(150)))
        rd, got = Reader(s), []
        while True:
            r = rd.reply()
            if r is None:
                break
            got.append(r)
    assert len(got) == REQUESTS_MAX
    assert [st for st, _, _ in got] == [(200, 200, 404)[i % 3] for i in range(REQUESTS_MAX)]
    assert [b for _, _, b in got[:3]][0] == b"ok\n"
    assert all(b.startswith(b"{") for _, _, b in got[1::3])
    assert got[-1][1]["connection"] == "close"
    assert all("connection" not in h for _, h, _ in got[:-1])
    assert a.http("/healthz")[0] == 200


def test_the_door_judges_every_request_of_a_kept_connection(redis, agent):
    """A request with a foreign Host on a connection whose first request passed is refused
    (421), and the connection closed: the door's decision is not kept per connection."""
    a = agent(redis=redis, metrics=True)
    with connect(a) as s:
        rd = Reader(s)
        s.sendall(request(a, "/status.json"))
        assert rd.reply()[0] == 200
        s.sendall(request(a, "/status.json", Host="evil.example"))
        status, hdrs, body = rd.reply()
        assert status == 421 and hdrs["connection"] == "close", (status, hdrs)
        assert b"metrics.host_names" in body
        assert rd.closed()


def test_a_client_holding_many_connections_is_bounded(redis, agent):
    """20 connections against metrics.max_connections = 8, half of them kept alive after a
    request, the rest never sending: the oldest idle ones are closed to admit the new ones,
    never more than 8 stay open, and a new client is served."""
    a = agent(redis=redis, metrics={"max_connections": 8})
    held = []
    for i in range(20):
        s = connect(a)
        if i % 2:
            s.sendall(request(a, "/healthz"))
            assert Reader(s).reply()[0] == 200
        held.append(s)
        time.sleep(0.01)
    assert a.http("/healthz")[0] == 200
    for s in held:
        s.settimeout(0.5)
    closed = 0
    for s in held:
        try:
            closed += Reader(s).closed()
        except socket.timeout:
            pass
    assert closed >= 20 + 1 - 8, closed
    assert metric_value(a, "spoa_ratelimit_http_connections_evicted_total") >= 20 - 8
    for s in held:
        s.close()
