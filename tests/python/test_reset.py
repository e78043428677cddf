"""lendbox.Client.reset / AsyncClient.reset against a real daemon: the same sandbox back as it
was seeded (or as a snapshot of it), with a new token; answers validated against
docs/openapi.yaml by the fixture's hook."""

from __future__ import annotations

import pytest

import lendbox


def test_reset(daemon):
    c = daemon.client()
    lease = c.seed("rst-1", "t", files={"/workspace/seed.txt": "seeded\n"})
    sid, old = lease["sandbox_id"], lease["access"]["token"]
    op = daemon.client(token=old)
    op.exec(sid, "echo episode > /workspace/seed.txt; echo x > /workspace/new; echo t > /tmp/t")
    with pytest.raises(lendbox.Forbidden):
        op.reset(sid)
    back = c.reset(sid)
    assert back["sandbox_id"] == sid and back["resources_session_id"] == "rst-1"
    assert back["expires_at"] == lease["expires_at"]
    new = back["access"]["token"]
    assert new != old
    with pytest.raises(lendbox.Unauthorized):
        op.exec(sid, "true")
    op2 = daemon.client(token=new)
    r = op2.exec(sid, "cat /workspace/seed.txt; ls /workspace; ls /tmp")
    assert r["stdout"] == "seeded\nseed.txt\n"
    # to a snapshot of the same sandbox, then back to the seed
    op2.exec(sid, "echo snap > /workspace/snapped")
    c.snapshot(sid, "rst-snap")
    op2.exec(sid, "rm /workspace/snapped; echo later > /workspace/later")
    snap = c.reset(sid, snapshot="rst-snap")
    op3 = daemon.client(token=snap["access"]["token"])
    assert op3.exec(sid, "ls /workspace")["stdout"] == "seed.txt\nsnapped\n"
    assert snap["image"] == "rst-snap" and snap["sandbox_id"] == sid
    with pytest.raises(lendbox.NotFound):
        c.reset(sid, snapshot="rst-no-such")
    with pytest.raises(lendbox.NotFound):
        c.reset("sbx-no-such")
    seeded = c.reset(sid)
    op4 = daemon.client(token=seeded["access"]["token"])
    assert op4.exec(sid, "ls /workspace")["stdout"] == "seed.txt\n"
    assert seeded["image"] == lease["image"]
    assert c.release("rst-1")["released"] is True
    with pytest.raises(lendbox.NotFound):
        c.reset(sid)
    assert c.delete_image("rst-snap") is None
    for x in (c, op, op2, op3, op4):
        x.close()


async def test_reset_async(daemon):
    async with daemon.async_client() as c:
        lease = await c.seed("rst-a", "t")
        sid = lease["sandbox_id"]
        back = await c.reset(sid)
        assert back["sandbox_id"] == sid and back["access"]["token"] != lease["access"]["token"]
        assert (await c.release("rst-a"))["released"] is True
