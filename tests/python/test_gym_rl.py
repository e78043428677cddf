"""lendbox.gym's extensions for RL against a real daemon: snapshot, fork and reset on
AsyncSandbox, Sandbox and LentSandboxes (answers validated against docs/openapi.yaml by the
ValidatingProvider)."""

from __future__ import annotations

import pytest

import lendbox
from lendbox.gym import (
    AsyncSandbox,
    ForkableProvider,
    ForkedSandbox,
    LentSandboxes,
    ResettableProvider,
    Sandbox,
    SandboxSpec,
    SnapshotProvider,
)


def test_provider_declares_extensions(daemon):
    p = daemon.provider()
    assert isinstance(p, SnapshotProvider)
    assert isinstance(p, ForkableProvider)
    assert isinstance(p, ResettableProvider)


async def test_lent_fork_and_reset(daemon):
    prov, agent = daemon.provider(), daemon.provider(token="")
    lent = LentSandboxes(prov, {"ttl_s": 600}, None, None)
    await lent.lend("grl-parent", "task-a", files={"/workspace/task.txt": "seeded\n"})
    parent = lent.get("grl-parent")
    r = await parent.exec("echo prepared > /workspace/dep.txt; echo proc > /tmp/p")
    assert r.return_code == 0
    # a session with a live sandbox gets its own error; the others start
    await lent.lend("grl-busy", "task-a")
    out = await lent.fork("grl-parent", ["grl-c0", "grl-busy", "grl-c1"])
    assert list(out) == ["grl-c0", "grl-busy", "grl-c1"]
    assert isinstance(out["grl-busy"], lendbox.Conflict) and out["grl-busy"].status == 409
    for rsid in ("grl-c0", "grl-c1"):
        acc = out[rsid]
        assert acc.descriptor["resources_session_id"] == rsid
        child = await AsyncSandbox.connect(acc.descriptor, agent)
        res = await child.exec("cat task.txt dep.txt; ls /tmp")
        assert (res.return_code, res.stdout) == (0, "seeded\nprepared\n")
        await child.exec(f"echo attempt-{rsid} > answer.txt")
        assert child.sandbox_id not in (parent.sandbox_id,)
        await child.disconnect()
    ids = {lent.get(r).sandbox_id for r in ("grl-c0", "grl-c1")}
    assert len(ids) == 2
    with pytest.raises(KeyError):
        await lent.fork("grl-unknown", ["grl-c2"])
    # reset between attempts: the child is back as the fork captured it (the attempt's file is
    # gone), and the old token is refused
    before = await lent.get("grl-c0").serialize(scope="operate")
    again = await lent.reset("grl-c0")
    assert again.descriptor["sandbox_id"] == before["sandbox_id"]
    assert again.descriptor["token"] != before["token"]
    with pytest.raises(lendbox.Unauthorized):
        await AsyncSandbox.connect(before, agent)
    child = await AsyncSandbox.connect(again.descriptor, agent)
    res = await child.exec("ls")
    assert (res.return_code, res.stdout) == (0, "dep.txt\ntask.txt\n")
    await child.disconnect()
    with pytest.raises(KeyError):
        await lent.reset("grl-unknown")
    await lent.release_all()
    c = daemon.client()
    live = [s for s in c.list_sandboxes() if (s.get("resources_session_id") or "").startswith("grl-")
            and s["state"] != "stopped"]
    assert live == []
    c.close()
    await prov.aclose()
    await agent.aclose()


async def test_async_sandbox_snapshot_fork_reset(daemon):
    prov = daemon.provider()
    lent = LentSandboxes(prov, None, None, None)
    await lent.lend("grl-a", "t", files={"/workspace/seed.txt": "s\n"})
    sb = lent.get("grl-a")
    await sb.exec("echo v1 > /workspace/state")
    img = await sb.snapshot("grl-snap", labels={"k": "v"})
    assert img["name"] == "grl-snap" and img["kind"] == "snapshot"
    assert img["source_sandbox_id"] == sb.sandbox_id and img["labels"] == {"k": "v"}
    await sb.exec("echo v2 > /workspace/state; echo x > /workspace/later")
    await sb.reset("grl-snap")
    assert (await sb.exec("cat state; ls")).stdout == "v1\nseed.txt\nstate\n"
    await sb.reset()
    assert (await sb.exec("ls")).stdout == "seed.txt\n"
    kids = await sb.fork(["grl-k0", "grl-k1"], task_id="t2")
    assert [k.resources_session_id for k in kids] == ["grl-k0", "grl-k1"]
    assert all(isinstance(k, ForkedSandbox) and k.error is None for k in kids)
    for k in kids:
        assert (await k.sandbox.exec("cat seed.txt")).stdout == "s\n"
        await k.sandbox.stop()
    # a sandbox started from the snapshot
    fresh = AsyncSandbox(prov, SandboxSpec(image="grl-snap", ttl_s=60), owns_provider=False)
    await fresh.start()
    assert (await fresh.exec("cat state")).stdout == "v1\n"
    with pytest.raises(lendbox.Conflict):
        await prov.delete_snapshot("grl-snap")  # a live sandbox stands on it
    await fresh.stop()
    with pytest.raises(lendbox.NotFound):  # no such snapshot
        await sb.reset("grl-no-such")
    await lent.release("grl-a")
    await prov.delete_snapshot("grl-snap")
    assert "grl-snap" not in [i["name"] for i in await prov.client().list_images()]
    await prov.aclose()


def test_sync_sandbox_snapshot(daemon):
    with Sandbox(daemon.provider(), SandboxSpec(ttl_s=60)) as sb:
        sb.exec("echo one > /workspace/f")
        img = sb.snapshot("grl-sync")
        assert img["name"] == "grl-sync"
        assert sb.exec("cat f").stdout == "one\n"
    c = daemon.client()
    c.delete_image("grl-sync")
    c.close()
