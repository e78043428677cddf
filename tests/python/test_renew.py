"""Renewal (POST /v1/sandboxes/{id}/renew) through lendbox.Client, AsyncClient and lendbox.gym's
RenewableProvider, and the idle fields of a seed (idle_timeout_s, on_idle, last_activity_at).
Every JSON answer is validated against docs/openapi.yaml by the fixtures' hook."""

from __future__ import annotations

import calendar
import time

import pytest

import lendbox
from lendbox.gym import AsyncSandbox, RenewableProvider, SandboxSpec


def _epoch(rfc3339: str) -> int:
    return calendar.timegm(time.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ"))


@pytest.fixture(scope="module")
def capped(request):
    from conftest import Daemon

    d = Daemon(["--set", "lending.max_ttl_s=100"])
    request.addfinalizer(d.cleanup)
    return d


def test_renew_client(capped):
    c = capped.client()
    lease = c.seed("rn-1", "t", ttl_s=30, extra={"idle_timeout_s": 600, "on_idle": "pause"})
    sid = lease["sandbox_id"]
    assert _epoch(lease["last_activity_at"]) <= int(time.time())
    op = capped.client(token=lease["access"]["token"])
    before = int(time.time())
    r = op.renew(sid, 50)
    assert set(r) == {"sandbox_id", "expires_at"} and r["sandbox_id"] == sid
    assert before + 50 <= _epoch(r["expires_at"]) <= int(time.time()) + 50
    # capped at lending.max_ttl_s, as a seed's ttl_s
    assert _epoch(c.renew(sid, 10**6)["expires_at"]) <= int(time.time()) + 100
    assert c.get_sandbox(sid)["expires_at"] == c.get_session("rn-1")["expires_at"]
    for bad in (0, -1, "5", None):
        with pytest.raises(lendbox.BadRequest):
            c.renew(sid, bad)
    # another sandbox's operate token
    other = c.seed("rn-2", "t")
    stranger = capped.client(token=other["access"]["token"])
    with pytest.raises(lendbox.Forbidden):
        stranger.renew(sid, 10)
    stranger.close()
    op.close()
    assert c.release("rn-1")["released"] is True
    # renewing a stopped sandbox is no resurrection
    with pytest.raises(lendbox.NotFound):
        c.renew(sid, 10)
    with pytest.raises(lendbox.NotFound):
        c.renew("sbx-unknown", 10)
    c.release("rn-2")
    c.close()


def test_idle_fields_refused(capped):
    c = capped.client()
    for extra in ({"idle_timeout_s": 0}, {"on_idle": "later"}, {"idle_timeout_s": "1"}):
        with pytest.raises(lendbox.BadRequest):
            c.seed("rn-bad", "t", extra=extra)
    c.close()


async def test_renew_async_and_gym(capped):
    async with capped.async_client() as c:
        lease = await c.seed("rn-a", "t", ttl_s=30)
        r = await c.renew(lease["sandbox_id"], 40)
        assert r["sandbox_id"] == lease["sandbox_id"]
        await c.release("rn-a")
        with pytest.raises(lendbox.NotFound):
            await c.renew(lease["sandbox_id"], 40)
    provider = capped.provider()
    assert isinstance(provider, RenewableProvider)
    sb = AsyncSandbox(provider, SandboxSpec(ttl_s=20))
    await sb.start()
    await sb.renew(80)
    info = await sb.client.get_sandbox(sb.sandbox_id)
    assert _epoch(info["expires_at"]) >= int(time.time()) + 70
    handle = sb._require_handle()
    await sb.stop()
    # an expired or stopped sandbox cannot be renewed (Gym's RenewableProvider contract)
    late = capped.provider()
    with pytest.raises(lendbox.NotFound):
        await late.renew(handle, 10)
    await late.aclose()
