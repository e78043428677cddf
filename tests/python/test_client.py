"""lendbox.Client / AsyncClient against a real daemon: the routes, their answers (validated
against docs/openapi.yaml by the fixture's hook), and every error class as its exception."""

from __future__ import annotations

import asyncio

import pytest

import lendbox
from conftest import needs_create, openapi, sandbox_dir_exists


def test_seed_exec_files_release(daemon):
    c = daemon.client()
    lease = c.seed("cl-1", "task-1", files={"/workspace/t.txt": "hi\n", "/workspace/b.bin": b"\x00\xff"})
    sid = lease["sandbox_id"]
    assert lease["state"] == "lent" and lease["access"]["scope"] == "operate"
    assert c.seed("cl-1", "task-1")["reused"] is True
    op = daemon.client(token=lease["access"]["token"])
    r = op.exec(sid, "cat /workspace/t.txt; exit 3")
    assert (r["return_code"], r["stdout"], r["error_type"]) == (3, "hi\n", None)
    r = op.exec(sid, "sleep 5", timeout_s=0.5)
    assert r["return_code"] == 125 and r["error_type"] == "timeout"
    assert op.get_file(sid, "/workspace/b.bin") == b"\x00\xff"
    op.put_file(sid, "/workspace/x/y.bin", b"\x01\x02", mode=0o600)
    assert c.get_file(sid, "/workspace/x/y.bin") == b"\x01\x02"
    assert op.exec(sid, "stat -c %a /workspace/x/y.bin")["stdout"] == "600\n"
    assert c.get_sandbox(sid)["status"] == "running"
    # a grader: exclusive starts in / on the trusted view; agent_root on the agent's root
    assert c.exec(sid, "pwd; cat /workspace/t.txt", exclusive=True)["stdout"] == "/\nhi\n"
    assert c.exec(sid, "exit 4", exclusive=True, agent_root=True)["return_code"] == 4
    with pytest.raises(lendbox.BadRequest):
        c.exec(sid, "true", agent_root=True)
    assert c.get_session("cl-1")["sandbox_id"] == sid
    assert [s["sandbox_id"] for s in c.list_sessions()].count(sid) == 1
    assert any(s["sandbox_id"] == sid for s in c.list_sandboxes())
    assert c.pause(sid)["status"] == "paused"
    assert c.resume(sid)["status"] == "running"
    assert c.readyz() == {"status": "ready"} and c.healthz() == {"status": "ok"}
    assert "lendbox" in c.metrics()
    assert c.release("cl-1") == {"released": True, "sandbox_id": sid}
    assert c.release("cl-1") == {"released": False}
    assert not sandbox_dir_exists(daemon, sid)
    assert openapi().validated > 10
    c.close()


def test_fork(daemon):
    c = daemon.client()
    lease = c.seed("fork-p", "t", files={"/workspace/a.txt": "from the parent\n"})
    sid = lease["sandbox_id"]
    live = c.seed("fork-b", "t")
    r = c.fork(sid, ["fork-a", "fork-b", "fork-c"], task_id="t2", labels={"grp": "g"})
    assert [(k["rsid"], k["status"]) for k in r["children"]] == [
        ("fork-a", 200), ("fork-b", 409), ("fork-c", 200)]
    assert r["children"][1]["error"]["code"] == "conflict"
    kids = [r["children"][i]["lease"]["sandbox_id"] for i in (0, 2)]
    assert len({sid, live["sandbox_id"], *kids}) == 4
    for k in kids:
        assert c.get_file(k, "/workspace/a.txt") == b"from the parent\n"
    assert not [i for i in c.list_images() if i["name"].startswith("fork-")]
    for bad in ([], ["fork-x", "fork-x"], ["no spaces"]):
        with pytest.raises(lendbox.BadRequest):
            c.fork(sid, bad)
    with pytest.raises(lendbox.Forbidden):
        daemon.client(token=lease["access"]["token"]).fork(sid, ["fork-d"])
    with pytest.raises(lendbox.NotFound):
        c.fork("sbx-nosuch", ["fork-d"])
    for rsid in ("fork-a", "fork-b", "fork-c", "fork-p"):
        assert c.release(rsid)["released"] is True
    c.close()


async def test_async_fork(daemon):
    async with daemon.async_client() as c:
        sid = (await c.seed("afork-p", "t"))["sandbox_id"]
        r = await c.fork(sid, ["afork-a"])
        assert r["children"][0]["status"] == 200
        assert (await c.release("afork-a"))["released"] is True
        assert (await c.release("afork-p"))["released"] is True


async def test_async_client(daemon):
    async with daemon.async_client() as c:
        lease = await c.seed("acl-1", "t")
        sid = lease["sandbox_id"]
        r = await c.exec(sid, argv=["printf", "%s", "a b"])
        assert r["stdout"] == "a b"
        await c.put_file(sid, "/workspace/f", "text")
        assert await c.get_file(sid, "/workspace/f") == b"text"
        assert (await c.release("acl-1"))["released"] is True


def test_snapshot(daemon):
    c = daemon.client()
    lease = c.seed("snap-1", "t", files={"/workspace/a.txt": "from the parent\n"})
    sid = lease["sandbox_id"]
    img = c.snapshot(sid, "pysnap-1", labels={"stage": "prepared"})
    assert (img["name"], img["kind"], img["source_sandbox_id"]) == ("pysnap-1", "snapshot", sid)
    assert img["labels"] == {"stage": "prepared"}
    listed = [i for i in c.list_images() if i["name"] == "pysnap-1"]
    assert [(i["kind"], i["labels"]) for i in listed] == [("snapshot", {"stage": "prepared"})]
    with pytest.raises(lendbox.BadRequest):
        c.snapshot(sid, "pysnap-3", labels={"n": 3})
    with pytest.raises(lendbox.Conflict):
        c.snapshot(sid, "pysnap-1")
    with pytest.raises(lendbox.Forbidden):
        daemon.client(token=lease["access"]["token"]).snapshot(sid, "pysnap-2")
    child = c.seed("snap-2", "t", image="pysnap-1")
    assert c.get_file(child["sandbox_id"], "/workspace/a.txt") == b"from the parent\n"
    with pytest.raises(lendbox.Conflict):
        c.delete_image("pysnap-1")
    assert c.release("snap-2")["released"] is True
    assert c.release("snap-1")["released"] is True
    assert c.delete_image("pysnap-1") is None
    assert "pysnap-1" not in [i["name"] for i in c.list_images()]
    c.close()


def test_errors_are_typed(daemon):
    c = daemon.client()
    with pytest.raises(lendbox.NotFound) as e:
        c.get_session("never-seeded")
    assert (e.value.status, e.value.code) == (404, "not_found") and e.value.message
    assert e.value.request_id
    lease = c.seed("err-1", "task-a")
    with pytest.raises(lendbox.Conflict) as e:
        c.seed("err-1", "task-b")
    assert (e.value.status, e.value.code) == (409, "conflict")
    with pytest.raises(lendbox.BadRequest) as e:
        c.seed("err-1", "task-a", extra={"no_such_field": 1})
    assert e.value.status == 400 and "no_such_field" in e.value.message
    # a model server on loopback without a port cannot be enforced
    with pytest.raises(lendbox.Unenforceable) as e:
        c.seed("err-2", "t", network={"access": "model_only", "model_server": "127.0.0.1"})
    assert (e.value.status, e.value.code) == (422, "unenforceable")
    with pytest.raises(lendbox.Unauthorized):
        daemon.client(token="wrong-token-wrong-token").get_session("err-1")
    other = c.seed("err-3", "t")
    op = daemon.client(token=lease["access"]["token"])
    with pytest.raises(lendbox.Forbidden):
        op.exec(other["sandbox_id"], "true")
    with pytest.raises(lendbox.Forbidden):
        op.delete_sandbox(lease["sandbox_id"])
    # PTY sessions: a round trip; an offset past the end is a typed 400
    sid = c.create_pty(lease["sandbox_id"], "printf pty-ok; exit 4")["session_id"]
    assert c.pty_wait(sid, timeout_ms=30000)["exit_code"] == 4
    out = c.pty_output(sid, 0)
    assert out["data"] == b"pty-ok" and out["exit_code"] == 4 and out["next_offset"] == 6
    with pytest.raises(lendbox.BadRequest):
        c.pty_output(sid, 7)
    c.pty_delete(sid)
    with pytest.raises(lendbox.ImageNotFound):
        c.seed("err-4", "t", image="no-such-image")
    for rsid in ("err-1", "err-3"):
        c.release(rsid)


def test_429_and_502(own_daemon):
    # the first sandbox create fails (502), and one live sandbox at most (the second is 429)
    d = own_daemon(["--set", "lending.max_sandboxes=1"], {"LENDBOX_FAULTS": "provider.create=fail:1"})
    c = d.client(retries=0)
    with pytest.raises(lendbox.ProviderError) as e:
        c.seed("f-0", "t")
    assert (e.value.status, e.value.code) == (502, "provider_error") and "inject" in e.value.message
    with pytest.raises(lendbox.NotFound):
        c.get_session("f-0")  # nothing was lent
    lease = c.seed("f-1", "t")
    with pytest.raises(lendbox.Overloaded) as e:
        c.seed("f-2", "t")
    assert (e.value.status, e.value.code) == (429, "overloaded")
    # the retrying client retries 429 on the idempotent seed (as its Retry-After says, within
    # retry_overloaded_s), and still raises it in the end
    c2 = d.client(retries=2, backoff_s=0.01, retry_overloaded_s=2.5)
    with pytest.raises(lendbox.Overloaded):
        c2.seed("f-2", "t")
    assert c.release("f-1") == {"released": True, "sandbox_id": lease["sandbox_id"]}


def test_stop_failure_is_provider_error(own_daemon):
    d = own_daemon(env={"LENDBOX_FAULTS": "provider.stop=fail:1"})
    c = d.client()
    c.seed("s-1", "t")
    with pytest.raises(lendbox.ProviderError):
        c.release("s-1")
    # the record is kept; the next release retries the stop and succeeds
    assert c.release("s-1")["released"] is True


def test_exec_transport_failure_is_502(own_daemon):
    # an exec the provider cannot carry out is ProviderError (502 provider_error), not internal
    d = own_daemon(env={"LENDBOX_FAULTS": "provider.exec=fail:1"})
    c = d.client()
    sid = c.seed("x-1", "t")["sandbox_id"]
    with pytest.raises(lendbox.ProviderError) as e:
        c.exec(sid, "true")
    assert (e.value.status, e.value.code) == (502, "provider_error")
    assert "injected fault: provider.exec failed" in e.value.message
    assert c.exec(sid, "echo ok")["stdout"] == "ok\n"  # sent once: the fault was used up by it
    assert c.release("x-1")["released"] is True


def test_transport_error_and_no_retry_of_exec(daemon):
    c = lendbox.Client("http://127.0.0.1:1", "x", retries=1, backoff_s=0.01)
    with pytest.raises(lendbox.TransportError) as e:
        c.healthz()
    assert e.value.status == 0 and e.value.code == "transport"


def test_client_covers_every_route():
    from conftest import daemon_routes

    table = {(m, p) for m, p, *_ in daemon_routes()}
    client = {(r.method, r.pattern) for r in lendbox.ROUTES.values()}
    # routes the client knows that this daemon lacks can only be the newest ones (an older build)
    assert table - client == set(), f"routes without a client method: {table - client}"
    pending = client - table
    assert pending <= {("POST", "/v1/sessions/release_all"), ("POST", "/v1/sandboxes"),
                       ("POST", "/v1/sessions/*/stop_harness")}, pending


@needs_create
async def test_create_sandbox_and_release_all(daemon):
    async with daemon.async_client() as c:
        made = await c.create_sandbox(extra={"workdir": "/repo", "metadata": {"k": "v"}})
        assert made["resources_session_id"] is None and made["access"]["workdir"] == "/repo"
        r = await c.exec(made["sandbox_id"], "pwd")
        assert r["stdout"] == "/repo\n"
        leases = await asyncio.gather(*(c.seed(f"ra-{i}", "t", labels={"grp": "ra"}) for i in range(3)))
        other = await c.seed("ra-other", "t", labels={"grp": "else"})
        r = await c.release_all(labels={"grp": "ra"})
        assert sorted(r["released"]) == ["ra-0", "ra-1", "ra-2"] and r["failed"] == []
        assert (await c.get_session("ra-other"))["sandbox_id"] == other["sandbox_id"]
        for lease in leases:
            assert (await c.get_sandbox(lease["sandbox_id"]))["state"] == "stopped"
        assert (await c.delete_sandbox(made["sandbox_id"]))["deleted"] is True
        await c.release("ra-other")
