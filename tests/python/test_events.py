"""The event feed (GET /v1/events) through lendbox.Client and AsyncClient: events() with its
filters, iter_events() long-polling and resuming from its last seq (also across a kill -9 and
restart of the daemon), and the async iterator. Every JSON answer is validated against
docs/openapi.yaml by the fixtures' hook."""

from __future__ import annotations

import asyncio
import threading

import pytest

import lendbox


def _head(c: lendbox.Client) -> int:
    since = 0
    while True:
        page = c.events(since, limit=10000)
        if not page["events"]:
            return since
        since = page["next"]


def test_events_client(daemon):
    c = daemon.client()
    head = _head(c)
    lease = c.seed("pe-1", "task-pe", labels={"k": "v"})
    sid = lease["sandbox_id"]
    c.release("pe-1")
    page = c.events(head, rsid="pe-1")
    assert [e["type"] for e in page["events"]] == ["seeded", "stopped"]
    assert page["next"] == page["events"][-1]["seq"]
    seeded, stopped = page["events"]
    assert seeded["sandbox_id"] == sid and seeded["task_id"] == "task-pe"
    assert seeded["labels"] == {"k": "v"} and seeded["seq"] < stopped["seq"]
    assert stopped["data"]["reason"] == "released" and "usage" in stopped["data"]
    assert c.events(head, sandbox_id=sid, types=["stopped"])["events"] == [stopped]
    assert c.events(head, rsid="pe-none") == {"events": [], "next": head}
    with pytest.raises(lendbox.BadRequest):
        c.events(head, types=["nope"])
    with pytest.raises(lendbox.BadRequest):
        c.events(-1)
    with pytest.raises(lendbox.BadRequest):
        c.events(head, wait_ms=60001)
    # an operate token may not read the feed
    other = c.seed("pe-2", "t")
    op = daemon.client(token=other["access"]["token"])
    with pytest.raises(lendbox.Forbidden):
        op.events(0)
    op.close()
    c.release("pe-2")
    c.close()


def test_iter_events_resumes(own_daemon):
    d = own_daemon()
    c = d.client()
    head = _head(c)
    got = []
    done = threading.Event()

    def reader():
        r = d.client()
        for ev in r.iter_events(head, wait_ms=2000, rsid="pe-it"):
            got.append(ev)
            if len(got) == 3:
                break
        r.close()
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    c.seed("pe-it", "t")
    c.release("pe-it")
    # the reader long-polls across a kill -9 and restart, and reads on from its last seq
    d.restart()
    c.close()
    c = d.client()
    c.seed("pe-it", "t")
    assert done.wait(60), got
    assert [e["type"] for e in got] == ["seeded", "stopped", "seeded"]
    assert got[0]["seq"] < got[1]["seq"] < got[2]["seq"]
    c.release("pe-it")
    c.close()


def test_async_events(daemon):
    async def main():
        async with daemon.async_client() as a:
            head = (await a.events(0, limit=10000))["next"]
            while True:
                page = await a.events(head, limit=10000)
                if not page["events"]:
                    break
                head = page["next"]
            it = a.iter_events(head, wait_ms=5000, rsid="pe-async")
            waiter = asyncio.ensure_future(it.__anext__())
            await asyncio.sleep(0.2)
            lease = await a.seed("pe-async", "t")
            ev = await asyncio.wait_for(waiter, 30)
            assert ev["type"] == "seeded" and ev["sandbox_id"] == lease["sandbox_id"]
            await a.release("pe-async")
            ev = await asyncio.wait_for(it.__anext__(), 30)
            assert ev["type"] == "stopped" and ev["data"]["reason"] == "released"
            await it.aclose()

    asyncio.run(main())
