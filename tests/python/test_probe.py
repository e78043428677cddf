"""A seed's ready_probe through lendbox.Client (the seed's ``extra``) and lendbox.gym
(``provider_options["ready_probe"]`` of SandboxSpec and SandboxConfig): the seed returns once the
probe exits 0, a probe that never does raises ProviderError (502) naming its last exit status and
stderr, and a bad probe is BadRequest. Every JSON answer is validated against docs/openapi.yaml
by the fixtures' hook."""

from __future__ import annotations

import pytest

import lendbox
from lendbox.gym import LentSandboxes, SandboxSpec

# counts its attempts in the workdir; succeeds from the third one
COUNTING = "n=$(cat .probe-n 2>/dev/null || echo 0); n=$((n + 1)); echo $n > .probe-n; [ $n -ge 3 ]"


def test_spec_carries_ready_probe():
    probe = {"command": "true", "interval_ms": 50}
    assert SandboxSpec(provider_options={"ready_probe": probe}).to_api()["ready_probe"] == probe
    assert "ready_probe" not in SandboxSpec().to_api()
    with pytest.raises(ValueError):
        SandboxSpec(provider_options={"probe": probe}).to_api()


def test_client_seed_with_probe(daemon):
    c = daemon.client()
    lease = c.seed("pb-ok", "t", extra={"ready_probe": {"command": COUNTING, "interval_ms": 50}})
    assert c.exec(lease["sandbox_id"], "cat .probe-n")["stdout"] == "3\n"
    with pytest.raises(lendbox.ProviderError) as e:
        c.seed("pb-never", "t", extra={"ready_timeout_s": 1,
                                       "ready_probe": {"command": "echo nope >&2; exit 4"}})
    assert e.value.code == "provider_error"
    assert "exit status 4" in e.value.message and "stderr: nope" in e.value.message
    rec = [s for s in c.list_sandboxes() if s["resources_session_id"] == "pb-never"]
    assert [(s["state"], s["stop_reason"]) for s in rec] == [("stopped", "seed_failed")]
    for bad in ({"command": ""}, {"interval_ms": 100}, {"command": "true", "interval_ms": 0},
                {"command": "true", "interval_ms": "100"}, {"command": "true", "every": 1}):
        with pytest.raises(lendbox.BadRequest):
            c.seed("pb-bad", "t", extra={"ready_probe": bad})
    c.release("pb-ok")
    c.close()


async def test_gym_lend_with_probe(daemon):
    lent = LentSandboxes(daemon.provider(), {
        "ttl_s": 600,
        "provider_options": {"ready_probe": {"command": COUNTING, "interval_ms": 50}},
    }, None, None)
    await lent.lend("pb-gym", "task-1")
    c = daemon.client()
    sid = c.get_session("pb-gym")["sandbox_id"]
    assert c.exec(sid, "cat .probe-n")["stdout"] == "3\n"
    c.close()
    await lent.release("pb-gym")
