"""A sandbox whose init is killed from the host: the client raises SandboxLost (410
sandbox_lost) on exec and file calls, GET shows it stopped with stop_reason "lost" and usage all
None, and the session seeds again. GET of a running sandbox has the six usage figures."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time

import pytest

import lendbox

USAGE_KEYS = {"cpu_s", "memory_bytes", "memory_peak_bytes", "pids", "oom_kills", "disk_bytes"}


def _kill_init(d, sandbox_id: str) -> None:
    desc = json.loads(pathlib.Path(d.state_dir, "sandboxes", sandbox_id, "descriptor.json").read_text())
    pid = int(desc["pid"])
    os.kill(pid, signal.SIGKILL)
    for _ in range(400):
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.025)
    pytest.fail(f"init {pid} still runs")


def test_killed_init_raises_sandbox_lost(own_daemon):
    d = own_daemon(["--set", "lending.sweep_interval_s=3600"])
    c = d.client(retries=0)
    lease = c.seed("py-lost", "t")
    sid = lease["sandbox_id"]
    running = c.get_sandbox(sid)
    assert set(running["usage"]) == USAGE_KEYS
    assert running["usage"]["pids"] >= 1
    assert running["stop_reason"] is None

    _kill_init(d, sid)
    with pytest.raises(lendbox.SandboxLost) as e:
        c.exec(sid, "echo hi")
    assert e.value.status == 410 and e.value.code == "sandbox_lost"
    assert isinstance(e.value, lendbox.Gone)
    op = d.client(token=lease["access"]["token"], retries=0)
    with pytest.raises(lendbox.SandboxLost):
        op.exec(sid, "echo hi")
    info = c.get_sandbox(sid)
    assert (info["state"], info["status"], info["stop_reason"]) == ("stopped", "stopped", "lost")
    assert info["usage"] == {k: None for k in USAGE_KEYS}

    again = c.seed("py-lost", "t")
    assert again["sandbox_id"] != sid
    assert c.exec(again["sandbox_id"], "echo new")["stdout"] == "new\n"
    c.release("py-lost")
