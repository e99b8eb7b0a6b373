"""A small Chrome DevTools Protocol client for the tests: Debian's headless chromium driven
over --remote-debugging-pipe (fd 3 carries the commands in, fd 4 the replies and events out,
each message a JSON text ended by a NUL byte), to measure a page's layout in a real browser,
emulate a screen size and take screenshots.

Every wait is bounded; the browser runs in a session (process group) of its own, which
close() kills whole, whatever state it is in:

    with Browser(tmp) as b:
        b.viewport(1280, 800)
        b.goto(url)
        b.wait("document.readyState === 'complete'")
        width = b.eval("document.documentElement.scrollWidth")
        b.screenshot(path)
"""
import base64
import collections
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import time
import zlib

CHROMIUM = shutil.which("chromium")


class CdpError(Exception):
    pass


class Browser:
    def __init__(self, tmp, name="cdp", timeout=30.0):
        """Starts chromium with a profile under <tmp>/<name>-profile and opens one blank
        tab. <timeout>: the longest any one command waits for its reply."""
        self.timeout = timeout
        self.events, self.log = [], []
        self._buf, self._id, self.session = b"", 0, None
        prof = tmp / ("%s-profile" % name)
        prof.mkdir(exist_ok=True)
        cmd_r, cmd_w = os.pipe()        # we write commands, chromium reads them on fd 3
        out_r, out_w = os.pipe()        # chromium writes on fd 4, we read
        # high numbers, so that "3<&N 4>&M" cannot overwrite one with the other (bash: dash
        # takes one-digit descriptors only)
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 20)
        hi_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 20)
        os.close(cmd_r)
        os.close(out_w)
        argv = ["/bin/bash", "-c", 'exec "$0" "$@" 3<&%d 4>&%d %d<&- %d>&-' % (
                    hi_r, hi_w, hi_r, hi_w),
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                "--disable-sync", "--hide-scrollbars", "--mute-audio",
                "--user-data-dir=%s" % prof, "--remote-debugging-pipe", "about:blank"]
        self.errlog = open(tmp / ("%s-chromium.log" % name), "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.errlog,
                                     stderr=subprocess.STDOUT, pass_fds=(hi_r, hi_w),
                                     env=dict(os.environ, HOME=str(prof)),
                                     start_new_session=True)
        os.close(hi_r)
        os.close(hi_w)
        self.w, self.r = cmd_w, out_r
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target,
                                     flatten=True)["sessionId"]
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Log.enable")
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Asks the browser to close, then kills its process group (helpers included)."""
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self._send({"id": 10 ** 6, "method": "Browser.close"})
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)
        self.proc = None
        for fd in (self.w, self.r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.errlog.close()

    # ---- the protocol

    def _send(self, msg):
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.w, data)
            data = data[n:]

    def _read(self, deadline):
        """The next message, or CdpError past <deadline> (time.monotonic())."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no message from chromium in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise CdpError("chromium closed its pipe (exit %s)" % self.proc.poll())
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, timeout=None, **params):
        """Sends <method> (to the tab once attached) and returns its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise CdpError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            if "method" in m:
                self._event(m)

    def _event(self, m):
        self.events.append(m["method"])
        p = m.get("params", {})
        if m["method"] == "Log.entryAdded":
            self.log.append(p.get("entry", {}).get("text", ""))
        elif m["method"] == "Runtime.exceptionThrown":
            self.log.append(json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m["method"] == "Runtime.consoleAPICalled":
            self.log.append(" ".join(str(a.get("value")) for a in p.get("args", [])))

    # ---- what the tests use

    def viewport(self, width, height, mobile=False):
        """Emulates a screen of <width> x <height> CSS pixels (a phone when <mobile>)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)

    def goto(self, url):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'")

    def eval(self, expression):
        """The value of a JavaScript <expression> in the page (JSON-able)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise CdpError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expression, timeout=15.0, every=0.1):
        """Waits until <expression> is truthy in the page; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.eval(expression)
            if v:
                return v
            if time.monotonic() >= deadline:
                raise CdpError("not true within %.0f s: %s" % (timeout, expression))
            time.sleep(every)

    def rect(self, selector):
        """The bounding box of the first element matching <selector>, in CSS pixels from the
        top left of the document (not the viewport), or None."""
        return self.eval("(function(){var e=document.querySelector(%s);if(!e)return null;"
                         "var r=e.getBoundingClientRect();return {x:r.left+scrollX,"
                         "y:r.top+scrollY,w:r.width,h:r.height};})()" % json.dumps(selector))

    def screenshot(self, path, colors=None):
        """The viewport as a PNG file at <path>, in a palette of <colors> (at most 256) when
        given (a page of text: a third of the bytes); returns its size in bytes."""
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        if colors:
            data = small_png(data, colors)
        path.write_bytes(data)
        return len(data)

    def csp_violations(self):
        return [t for t in self.log if "Content Security Policy" in t]


# ---- smaller screenshots (the documentation's): a PNG of 8-bit RGB(A) read back, its
# colours reduced to a palette of the most frequent ones (each other colour to its nearest),
# written again with one byte a pixel

def _png_chunk(typ, body):
    return struct.pack(">I", len(body)) + typ + body + struct.pack(">I", zlib.crc32(typ + body))


def _png_rows(data):
    """(width, height, bytes a pixel, rows of pixels) of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if typ == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif typ == b"IDAT":
            idat.append(body)
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and not interlace, hdr
    bpp = 4 if ctype == 6 else 3
    raw, stride = zlib.decompress(b"".join(idat)), w * bpp
    prev, rows = bytearray(stride), []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def small_png(data, colors=128):
    w, h, bpp, rows = _png_rows(data)
    count = collections.Counter(r[i:i + 3] for r in rows for i in range(0, len(r), bpp))
    pal = [c for c, _ in count.most_common(min(colors, 256))]
    index = {c: i for i, c in enumerate(pal)}
    for c in count:
        if c not in index:
            index[c] = min(range(len(pal)), key=lambda i: 3 * (c[0] - pal[i][0]) ** 2 +
                           4 * (c[1] - pal[i][1]) ** 2 + 2 * (c[2] - pal[i][2]) ** 2)
    out = bytearray()
    for r in rows:
        out.append(0)
        out.extend(index[r[i:i + 3]] for i in range(0, len(r), bpp))
    return (b"\x89PNG\r\n\x1a\n" +
            _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0)) +
            _png_chunk(b"PLTE", b"".join(pal)) +
            _png_chunk(b"IDAT", zlib.compress(bytes(out), 9)) + _png_chunk(b"IEND", b""))
