"""Batch seeds (POST /v1/sessions/seed_batch) through lendbox.Client, AsyncClient and
lendbox.gym's LentSandboxes.lend_many: one result per item in order, each what a single seed
would answer; whole-request errors raise. Every JSON answer is validated against
docs/openapi.yaml by the fixtures' hook."""

from __future__ import annotations

import pytest

import lendbox


def test_seed_batch_client(daemon):
    c = daemon.client()
    live = c.seed("sbp-live", "other")
    items = [
        {"rsid": "sbp-0", "task_id": "t", "files": {"/workspace/who": "sbp-0"}},
        {"rsid": "sbp-1", "task_id": "t", "labels": {"b": "py"}},
        {"task_id": "t"},  # no rsid
        {"rsid": "sbp-2", "task_id": "t", "ttl_s": "soon"},  # a bad field
        {"rsid": "sbp-0", "task_id": "t"},  # named by an earlier item
        {"rsid": "sbp-live", "task_id": "t"},  # live for another task
    ]
    res = c.seed_batch(items)
    assert [r["status"] for r in res] == [200, 200, 400, 400, 409, 409]
    assert [r["rsid"] for r in res] == ["sbp-0", "sbp-1", None, "sbp-2", "sbp-0", "sbp-live"]
    assert [r["error"]["code"] for r in res[2:]] == [
        "bad_request", "bad_request", "conflict", "conflict"]
    assert all("lease" not in r for r in res[2:]) and all("error" not in r for r in res[:2])
    l0, l1 = res[0]["lease"], res[1]["lease"]
    assert l0["sandbox_id"] != l1["sandbox_id"] and l0["resources_session_id"] == "sbp-0"
    assert c.get_session("sbp-1")["metadata"] == {"b": "py"}
    op = daemon.client(token=l0["access"]["token"])
    assert op.exec(l0["sandbox_id"], "cat /workspace/who")["stdout"] == "sbp-0"
    # the operate token is no admin
    with pytest.raises(lendbox.Forbidden):
        op.seed_batch([{"rsid": "sbp-9", "task_id": "t"}])
    op.close()
    # a second batch of the same items answers as repeated seeds do: the same leases
    again = c.seed_batch(items[:2])
    assert [r["lease"]["sandbox_id"] for r in again] == [l0["sandbox_id"], l1["sandbox_id"]]
    assert c.get_session("sbp-live")["sandbox_id"] == live["sandbox_id"]
    with pytest.raises(lendbox.NotFound):
        c.get_session("sbp-2")
    for bad in ([], [{"rsid": f"sbp-x{i}", "task_id": "t"} for i in range(257)]):
        with pytest.raises(lendbox.BadRequest):
            c.seed_batch(bad)
    with pytest.raises(lendbox.NotFound):
        c.get_session("sbp-x0")
    for rsid in ("sbp-0", "sbp-1", "sbp-live"):
        assert c.release(rsid)["released"] is True
    c.close()


async def test_seed_batch_async(daemon):
    async with daemon.async_client() as c:
        res = await c.seed_batch([{"rsid": f"sbp-a{i}", "task_id": "t"} for i in range(3)])
        assert [r["status"] for r in res] == [200, 200, 200]
        assert len({r["lease"]["sandbox_id"] for r in res}) == 3
        for i in range(3):
            assert (await c.release(f"sbp-a{i}"))["released"] is True


async def test_gym_lend_many(daemon):
    from lendbox.gym import LentSandboxes

    provider = daemon.provider()
    lent = LentSandboxes(provider, {"ttl_s": 600}, None, None)
    c = daemon.client()
    c.seed("sbp-g-live", "other")
    sessions = {f"sbp-g{i}": f"task-{i}" for i in range(5)}
    sessions["sbp-g-live"] = "t"
    out = await lent.lend_many(sessions, files={f"sbp-g{i}": {"/workspace/i": str(i)}
                                                for i in range(5)})
    assert list(out) == list(sessions)
    assert isinstance(out["sbp-g-live"], lendbox.Conflict)
    assert lent.get("sbp-g-live") is None
    ids = {out[f"sbp-g{i}"].descriptor["sandbox_id"] for i in range(5)}
    assert len(ids) == 5
    for i in range(5):
        assert (await lent.get(f"sbp-g{i}").exec("cat /workspace/i")).stdout == str(i)
    # a repeated lend returns the same sandbox
    again = await lent.lend("sbp-g0", "task-0")
    assert again.descriptor["sandbox_id"] == out["sbp-g0"].descriptor["sandbox_id"]
    await lent.release_all()
    assert all(lent.get(f"sbp-g{i}") is None for i in range(5))
    assert c.release("sbp-g-live")["released"] is True
    c.close()
    await provider.aclose()
