"""lendbox.gym against a real daemon: an episode as a NeMo Gym resources server and its agent
run it, 20 concurrent lends, release_all, the sandbox facade, and a daemon restart in the middle
of an episode. Every answer is validated against docs/openapi.yaml (ValidatingProvider)."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

import lendbox
from conftest import needs_agent_activations, needs_create, sandbox_dir_exists
from lendbox.gym import (
    SANDBOX_RUNTIME_RETURN_CODE,
    AsyncSandbox,
    LentSandboxes,
    Sandbox,
    SandboxCommand,
    SandboxSession,
    SandboxSpec,
    SandboxStatus,
)

HARNESS = """#!/bin/sh
# a toy agent: reads the task, answers, leaves a background process behind
echo "harness ran in $(pwd)"
echo "stop file: $LENDBOX_STOP_REQUEST"
expr $(sed 's/add \\([0-9]*\\) and \\([0-9]*\\)/\\1 + \\2/' task.txt) > answer.txt
sleep 300 &
"""


def lent_for(d, **kw) -> LentSandboxes:
    return LentSandboxes(d.provider(), {"ttl_s": 600, "metadata": {"team": "rl"}}, None,
                         kw.pop("workdir", None), **kw)


async def run_episode(d, lent: LentSandboxes, rsid: str, tmp_path: pathlib.Path, agent_provider):
    """One episode: lend with a task file; the agent connects with the operate descriptor and
    runs the harness through SandboxSession; the server grades with exec and downloads."""
    access = await lent.lend(rsid, {"taskset": "arith", "task_id": "7"},
                             files={"/workspace/task.txt": "add 2 and 3\n",
                                    "/workspace/blob.bin": b"\x00\x01\xfe\xff"})
    desc = access.connection.descriptor
    assert access.connection.kind == "direct" and access.workdir == "/workspace"
    assert desc["scope"] == "operate" and desc["token"].startswith("lbo_")
    assert d.token not in str(desc)  # the admin token never leaves the server

    # --- agent side: nothing but the descriptor ---
    agent = await AsyncSandbox.connect(dict(desc), agent_provider)
    session = SandboxSession(agent, "/tmp/session", "/workspace", "toy")
    script = tmp_path / "harness.sh"
    script.write_text(HARNESS)

    async def stage() -> SandboxCommand:
        await agent.upload(script, "/workspace/harness.sh")
        return SandboxCommand(["/bin/sh", "/workspace/harness.sh"], "python3")

    async def collect():
        r = await agent.exec("cat answer.txt")
        return {"answer": r.stdout}

    artifacts = await session.execute(stage, collect, timeout=60, close_timeout=15)
    assert artifacts == {"answer": "5\n"}
    assert session.cleanup["cleanup_confirmed"] is True and session.cleanup["return_code"] == 0
    log = await session.read_output_log()
    assert "harness ran in /workspace" in log
    assert session.stop_request_path and f"stop file: {session.stop_request_path}" in log
    await session.close(15)
    assert session.closed
    # the harness's background process was drained with it
    sb = lent.get(rsid)
    r = await sb.exec("pgrep -x sleep || echo none")
    assert r.stdout == "none\n"

    # --- server side: grade, download, release ---
    r = await sb.exec('test "$(cat answer.txt)" = 5 && echo pass', timeout_s=30)
    assert (r.return_code, r.stdout, r.error_type) == (0, "pass\n", None)
    await sb.download("/workspace/blob.bin", tmp_path / "out" / "blob.bin")
    assert (tmp_path / "out" / "blob.bin").read_bytes() == b"\x00\x01\xfe\xff"
    sandbox_id = sb.sandbox_id
    await lent.release(rsid)
    await lent.release(rsid)  # safe to repeat
    assert lent.get(rsid) is None
    assert not sandbox_dir_exists(d, sandbox_id)
    return sandbox_id


@needs_agent_activations
async def test_episode_agent_side_with_operate_descriptor(daemon, tmp_path):
    lent = lent_for(daemon, workdir="/workspace")
    await run_episode(daemon, lent, "gym-ep-1", tmp_path, daemon.provider(token=""))


async def test_episode_server_side(daemon, tmp_path):
    """The same episode where the server runs the harness with its own (admin) handle: works on
    every daemon version (blocking execute when "wait": false is unknown)."""
    lent = LentSandboxes("lendbox" if False else daemon.provider(), None, None, None)
    access = await lent.lend("gym-srv-1", "task-1", files={"/workspace/task.txt": "add 4 and 5\n"})
    sb = lent.get("gym-srv-1")
    assert sb is not None and lent.get("unknown-session") is None
    assert access.workdir == "/workspace"
    session = SandboxSession(sb, "/tmp/s", None, "toy", owns_sandbox=False)
    script = tmp_path / "harness.sh"
    script.write_text(HARNESS)

    async def stage():
        await sb.upload(script, "/workspace/harness.sh")
        return SandboxCommand(["/bin/sh", "/workspace/harness.sh"])

    async def collect():
        return (await sb.exec("cat /workspace/answer.txt")).stdout

    assert await session.execute(stage, collect, 60, 15) == "9\n"
    with pytest.raises(RuntimeError, match="already activated"):
        await session.execute(stage, collect, 60, 15)
    await asyncio.gather(session.close(15), session.close(15))
    assert session.closed
    sandbox_id = sb.sandbox_id
    await lent.release("gym-srv-1")
    assert not sandbox_dir_exists(daemon, sandbox_id)


async def test_twenty_concurrent_lends(daemon):
    lent = LentSandboxes(daemon.provider(), {"ttl_s": 600}, None, None)
    n = 20
    accesses = await asyncio.gather(
        *(lent.lend(f"conc-{i}", f"task-{i}", files={"/workspace/i": str(i)}) for i in range(n)))
    ids = {a.descriptor["sandbox_id"] for a in accesses}
    assert len(ids) == n
    # a repeated lend returns the same sandbox
    again = await lent.lend("conc-0", "task-0")
    assert again.descriptor["sandbox_id"] == accesses[0].descriptor["sandbox_id"]
    results = await asyncio.gather(*(lent.get(f"conc-{i}").exec("cat /workspace/i") for i in range(n)))
    assert [r.stdout for r in results] == [str(i) for i in range(n)]
    await asyncio.gather(*(lent.release(f"conc-{i}") for i in range(n)))
    assert all(not sandbox_dir_exists(daemon, s) for s in ids)


async def test_release_all_only_this_servers_sessions(daemon):
    mine = LentSandboxes(daemon.provider(), None, None, None)
    other = LentSandboxes(daemon.provider(), None, None, None)
    await asyncio.gather(*(mine.lend(f"ra-m-{i}", "t") for i in range(3)))
    theirs = await other.lend("ra-o-1", "t")
    ids = [mine.get(f"ra-m-{i}").sandbox_id for i in range(3)]
    await mine.release_all()
    assert all(mine.get(f"ra-m-{i}") is None for i in range(3))
    assert all(not sandbox_dir_exists(daemon, s) for s in ids)
    c = daemon.client()
    assert c.get_session("ra-o-1")["sandbox_id"] == theirs.descriptor["sandbox_id"]
    await other.release_all()
    with pytest.raises(lendbox.NotFound):
        c.get_session("ra-o-1")


@needs_create
async def test_async_sandbox_facade(daemon, tmp_path):
    spec = SandboxSpec(workdir="/repo", files={"/repo/f.txt": "hello"}, metadata={"k": "v"},
                       ports=[8000])
    sb = AsyncSandbox(daemon.provider(), spec)
    assert await sb.status() == SandboxStatus.UNKNOWN
    with pytest.raises(RuntimeError, match="not been started"):
        await sb.exec("true")
    async with sb:
        assert await sb.status() == SandboxStatus.RUNNING
        r = await sb.exec("cat f.txt; pwd")
        assert r.stdout == "hello/repo\n"
        r = await sb.exec("sleep 5", timeout_s=0.5)
        assert (r.return_code, r.error_type) == (SANDBOX_RUNTIME_RETURN_CODE, "timeout")
        with pytest.raises(ValueError, match="not declared"):
            await sb.endpoint(9000)
        desc = await sb.serialize(scope="operate")
        other = await AsyncSandbox.connect(desc, daemon.provider(token=""))
        assert (await other.exec("cat /repo/f.txt")).stdout == "hello"
        await other.stop()  # borrowed: only disconnects
        assert (await sb.exec("true")).return_code == 0
        await sb.pause()
        assert await sb.status() == SandboxStatus.PAUSED
        await sb.resume()
        session = await sb.pty.create(command="echo gym-pty")
        assert session["session_id"].startswith("pty-")
        sandbox_id = sb.sandbox_id
    assert await sb.status() == SandboxStatus.STOPPED
    assert not sandbox_dir_exists(daemon, sandbox_id)
    with pytest.raises(RuntimeError, match="has been stopped"):
        await sb.start()
    with pytest.raises(lendbox.Unenforceable):
        await AsyncSandbox(daemon.provider()).start(SandboxSpec(resources={"gpu": 1}))


@needs_create
def test_sync_sandbox(daemon, tmp_path):
    local = tmp_path / "in.txt"
    local.write_text("up")
    with Sandbox({"name": "lendbox", "base_url": daemon.url, "token": daemon.token},
                 SandboxSpec(ttl_s=300)) as sb:
        sb.upload(local, "/workspace/in.txt")
        assert sb.exec("cat /workspace/in.txt").stdout == "up"
        sb.download("/workspace/in.txt", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "up"
        sandbox_id = sb.sandbox_id
    assert not sandbox_dir_exists(daemon, sandbox_id)


async def test_sync_sandbox_refused_in_async_code(daemon):
    with pytest.raises(RuntimeError, match="AsyncSandbox"):
        Sandbox("lendbox")


@needs_agent_activations
async def test_daemon_restart_mid_episode(own_daemon, tmp_path):
    """lendboxd is killed (SIGKILL) and restarted while the agent's harness runs: the agent's
    SandboxSession keeps polling through the outage and gets the harness's result; a fresh
    client rebuilt from the serialized descriptor (as another process would) grades and the
    server releases."""
    d = own_daemon()
    lent = LentSandboxes(d.provider(), {"ttl_s": 600}, None, "/workspace")
    access = await lent.lend("rs-1", "t", files={"/workspace/task.txt": "add 1 and 1\n"})
    desc = dict(access.connection.descriptor)
    agent = await AsyncSandbox.connect(desc, d.provider(token=""))
    session = SandboxSession(agent, "/tmp/s", "/workspace", "toy")

    async def stage():
        return SandboxCommand(["/bin/sh", "-c", "sleep 3; expr 1 + 1 > answer.txt"])

    async def collect():
        return (await agent.exec("cat answer.txt")).stdout

    episode = asyncio.ensure_future(session.execute(stage, collect, timeout=60, close_timeout=15))
    await asyncio.sleep(1.0)
    assert not episode.done()
    await asyncio.to_thread(d.restart)  # SIGKILL, then a new daemon on the same state dir and port
    assert await asyncio.wait_for(episode, 60) == "2\n"
    assert session.cleanup["cleanup_confirmed"] is True
    await session.close(15)
    # another process: only the serialized descriptor
    grader = await AsyncSandbox.connect(desc)
    assert (await grader.exec("cat /workspace/answer.txt")).stdout == "2\n"
    await grader.disconnect()
    fresh = LentSandboxes(d.provider(), None, None, None)  # a restarted resources server
    await fresh.release("rs-1")
    assert not sandbox_dir_exists(d, desc["sandbox_id"])
