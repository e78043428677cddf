"""The clients' connections: one kept-alive connection carries many calls; a connection the
daemon dropped is replaced; a request whose connection breaks in flight is sent again only on
idempotent routes.

The in-flight break cannot be produced by lendboxd on demand, so those two tests talk to a
stand-in HTTP server on 127.0.0.1 that this file starts (it answers the first request of each
connection and closes the connection on the second without answering). Everything else runs
against the real daemon.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import List, Set

import pytest

import lendbox

# --- which TCP connections this process holds to a port ------------------------------------------


def _socket_inodes() -> Set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connections_to(port: int) -> Set[int]:
    """Local ports of this process's established TCP connections to 127.0.0.1:port."""
    mine = _socket_inodes()
    out = set()
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if state == "01" and inode in mine and int(remote.split(":")[1], 16) == port:
                out.add(int(local.split(":")[1], 16))
    return out


def daemon_port(d) -> int:
    return int(d.url.rsplit(":", 1)[1])


def test_one_connection_carries_every_call(daemon):
    c = daemon.client()
    port = daemon_port(daemon)
    others = connections_to(port)
    c.healthz()
    first = connections_to(port) - others
    assert len(first) == 1
    lease = c.seed("conn-1", "t")
    assert c.exec(lease["sandbox_id"], "echo hi")["stdout"] == "hi\n"
    for _ in range(20):
        c.healthz()
        c.get_session("conn-1")
    with pytest.raises(lendbox.NotFound):
        c.get_sandbox("sbx-doesnotexist")  # an error answer keeps the connection too
    c.put_file(lease["sandbox_id"], "/tmp/x", b"1")  # a 204 answer
    assert c.get_file(lease["sandbox_id"], "/tmp/x") == b"1"
    assert c.release("conn-1")["released"] is True
    assert connections_to(port) - others == first
    c.close()
    assert connections_to(port) - others == set()


def test_threads_use_one_connection_each(daemon):
    c = daemon.client()
    port = daemon_port(daemon)
    others = connections_to(port)
    barrier = threading.Barrier(4)

    def work() -> None:
        barrier.wait()
        for _ in range(10):
            c.healthz()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.healthz()  # and this thread's own
    # one per thread at most (ended threads' connections may already be gone)
    assert 1 <= len(connections_to(port) - others) <= 5
    c.close()
    assert connections_to(port) - others == set()


async def test_async_client_reuses_its_connection(daemon):
    c = daemon.async_client()
    port = daemon_port(daemon)
    others = connections_to(port)
    await c.healthz()
    first = connections_to(port) - others
    assert len(first) == 1
    for _ in range(20):
        await c.healthz()
        await c.list_sessions()
    assert connections_to(port) - others == first
    await asyncio.gather(*(c.healthz() for _ in range(8)))  # concurrent calls open more
    assert first <= connections_to(port) - others
    await c.aclose()
    await asyncio.sleep(0.05)
    assert connections_to(port) - others == set()


def test_connection_dropped_by_a_restart_is_replaced(own_daemon):
    """After the daemon restarted, even a call that is never retried (exec) goes out once on a
    new connection: the dropped one is noticed before anything is sent (Client: checked before
    each reuse; AsyncClient: the event loop sees the close while it runs)."""
    d = own_daemon()
    c = d.client(retries=0)
    ac = d.async_client(retries=0)
    lease = c.seed("drop-1", "t")
    sid = lease["sandbox_id"]
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(ac.healthz())
        before = connections_to(daemon_port(d))
        d.restart()
        assert c.exec(sid, "echo again")["stdout"] == "again\n"
        loop.run_until_complete(asyncio.sleep(0.2))  # a running loop: it was stopped meanwhile
        r = loop.run_until_complete(ac.exec(sid, "echo async"))
        assert r["stdout"] == "async\n"
        assert not (connections_to(daemon_port(d)) & before)
        loop.run_until_complete(ac.aclose())
    finally:
        loop.close()
    assert c.release("drop-1")["released"] is True


# --- a connection that breaks in flight (stand-in server) ----------------------------------------


class DroppingServer:
    """HTTP/1.1 on 127.0.0.1: answers the first request of a connection with 200 and
    keep-alive, then reads the next request and closes the connection without an answer.
    Records every request line it read."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: List[str] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read_request(self, f) -> str:
        line = f.readline().decode().strip()
        length = 0
        while True:
            h = f.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if length:
            f.read(length)
        return line

    def _conn(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            first = self._read_request(f)
            if not first:
                return
            with self.lock:
                self.requests.append(first)
            body = b'{"status":"ok"}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            second = self._read_request(f)
            if second:
                with self.lock:
                    self.requests.append(second)
            conn.shutdown(socket.SHUT_RDWR)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dropping():
    s = DroppingServer()
    yield s
    s.close()


def test_in_flight_break_resent_only_when_idempotent(dropping):
    c = lendbox.Client(f"http://127.0.0.1:{dropping.port}", "x", retries=0)
    assert c.healthz() == {"status": "ok"}  # connection 1, kept alive
    # an idempotent GET on it breaks in flight: sent again at once on a new connection
    assert c.healthz() == {"status": "ok"}
    assert dropping.requests == ["GET /healthz HTTP/1.1"] * 3
    assert dropping.connections == 2
    # exec on the kept-alive connection 2 breaks in flight: not sent again (retries or not)
    c.retries = 3
    with pytest.raises(lendbox.TransportError) as e:
        c.exec("sbx-1", "true")
    assert e.value.status == 0 and e.value.code == "transport"
    assert dropping.requests[3:] == ["POST /v1/sandboxes/sbx-1/exec HTTP/1.1"]
    assert dropping.connections == 2
    c.close()


async def test_async_in_flight_break_resent_only_when_idempotent(dropping):
    c = lendbox.AsyncClient(f"http://127.0.0.1:{dropping.port}", "x", retries=0)
    assert await c.healthz() == {"status": "ok"}
    assert await c.healthz() == {"status": "ok"}
    assert dropping.requests == ["GET /healthz HTTP/1.1"] * 3
    assert dropping.connections == 2
    c.retries = 3
    with pytest.raises(lendbox.TransportError):
        await c.exec("sbx-1", "true")
    assert dropping.requests[3:] == ["POST /v1/sandboxes/sbx-1/exec HTTP/1.1"]
    assert dropping.connections == 2
    await c.aclose()
