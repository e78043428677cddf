"""Code contexts (POST /v1/sandboxes/{id}/contexts, /v1/contexts/{cid}/run, interrupt, DELETE)
through lendbox.Client and AsyncClient: state across runs and exceptions, output and result,
a timeout's KeyboardInterrupt, another sandbox's token refused, delete. Every JSON answer is
validated against docs/openapi.yaml by the fixtures' hook."""

from __future__ import annotations

import asyncio

import pytest

import lendbox


def test_context_client(daemon):
    c = daemon.client()
    lease = c.seed("cx-1", "t")
    sid = lease["sandbox_id"]
    op = daemon.client(token=lease["access"]["token"])
    made = op.create_context(sid)
    cid = made["context_id"]
    assert made == {"context_id": cid, "language": "python"} and cid.startswith("ctx-")
    r = op.run_context(cid, "x = 41")
    assert r["result"] is None and r["error"] is None
    assert set(r) == {"stdout", "stderr", "result", "error", "duration_ms"}
    r = op.run_context(cid, "print('hi')\nimport sys; sys.stderr.write('e')\nx + 1")
    assert (r["stdout"], r["stderr"], r["result"], r["error"]) == ("hi\n", "e", "42", None)
    r = op.run_context(cid, "1/0")
    assert r["error"]["name"] == "ZeroDivisionError" and r["error"]["value"] == "division by zero"
    assert "ZeroDivisionError" in r["error"]["traceback"] and r["result"] is None
    r = op.run_context(cid, "while True: pass", timeout_s=1)
    assert r["error"]["name"] == "KeyboardInterrupt"
    assert op.run_context(cid, "x")["result"] == "41"
    with pytest.raises(lendbox.BadRequest):
        op.create_context(sid, "ruby")
    # another sandbox's operate token
    other = c.seed("cx-2", "t")
    stranger = daemon.client(token=other["access"]["token"])
    for call in (lambda: stranger.run_context(cid, "x"), lambda: stranger.interrupt_context(cid),
                 lambda: stranger.delete_context(cid), lambda: stranger.create_context(sid)):
        with pytest.raises(lendbox.Forbidden):
            call()
    stranger.close()
    assert op.interrupt_context(cid) == {"context_id": cid}
    assert op.run_context(cid, "x")["result"] == "41"
    assert op.delete_context(cid) is None
    # gone: 404 for the admin (an operate token gets 403: the context is no sandbox's now)
    with pytest.raises(lendbox.NotFound):
        c.run_context(cid, "x")
    with pytest.raises(lendbox.NotFound):
        c.delete_context(cid)
    with pytest.raises(lendbox.Forbidden):
        op.run_context(cid, "x")
    op.close()
    c.release("cx-1")
    c.release("cx-2")
    c.close()


def test_context_async_client(daemon):
    async def main():
        async with daemon.async_client() as c:
            lease = await c.seed("cx-a", "t")
            cid = (await c.create_context(lease["sandbox_id"]))["context_id"]
            await c.run_context(cid, "import math\nr = math.sqrt(16)")
            run = asyncio.ensure_future(c.run_context(cid, "import time\ntime.sleep(60)", timeout_s=120))
            for _ in range(100):  # until the run is under way: a second run is refused meanwhile
                await asyncio.sleep(0.1)
                try:
                    await c.run_context(cid, "r")
                except lendbox.Conflict:
                    break
            else:
                pytest.fail("the second run was never refused")
            # an interrupt before the driver took the run up is ignored: repeat until it ends
            while not run.done():
                await c.interrupt_context(cid)
                await asyncio.wait([run], timeout=0.3)
            r = run.result()
            assert r["error"]["name"] == "KeyboardInterrupt"
            assert (await c.run_context(cid, "r"))["result"] == "4.0"
            await c.delete_context(cid)
            await c.release("cx-a")

    asyncio.run(main())
