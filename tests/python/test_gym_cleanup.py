"""lendbox.gym as a NeMo Gym user meets it: a script that lends and exits prints no aiohttp
"Unclosed client session" / "Unclosed connector" warning (LentSandboxes closes its client at
release_all, an AsyncClient closes its sessions when it goes or at interpreter exit), and the
synchronous Sandbox works (it runs its own loop in a thread of its own) from a thread that runs
no event loop, and refuses, as NeMo Gym's does, a call from one that does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SRCDIR

from lendbox.gym import Sandbox, SandboxSpec

# Each script lends a sandbox to a session and exits; {url} and {token} are filled in.
SCRIPTS = {
    # a server that calls release_all at shutdown, its LentSandboxes a local of main()
    "release_all": """
        async def main():
            lent = LentSandboxes(P, {"ttl_s": 600}, None, None)
            await lent.lend("gc-1", "t")
            await lent.release_all()
        asyncio.run(main())
    """,
    # a module-level LentSandboxes, released one by one, never release_all: interpreter exit
    "global_release": """
        lent = LentSandboxes(P, {"ttl_s": 600}, None, None)
        async def main():
            await lent.lend("gc-2", "t")
            await lent.release("gc-2")
        asyncio.run(main())
    """,
    # a local LentSandboxes, released one by one: it goes when main() returns
    "local_release": """
        async def main():
            lent = LentSandboxes(P, {"ttl_s": 600}, None, None)
            await lent.lend("gc-3", "t")
            await lent.release("gc-3")
        asyncio.run(main())
    """,
    # the loop is never closed (run_until_complete), the client lives to interpreter exit
    "open_loop": """
        lent = LentSandboxes(P, {"ttl_s": 600}, None, None)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(lent.lend("gc-4", "t"))
        loop.run_until_complete(lent.release("gc-4"))
    """,
}

PROLOGUE = """
import asyncio, gc, sys
sys.path.insert(0, {pkg!r})
from lendbox.gym import LentSandboxes
P = {{"name": "lendbox", "base_url": {url!r}, "token": {token!r}}}
"""


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_no_unclosed_warnings_at_exit(daemon, name):
    code = PROLOGUE.format(pkg=str(SRCDIR / "clients" / "python"), url=daemon.url,
                           token=daemon.token) + textwrap.dedent(SCRIPTS[name]) + "\nprint('done')\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LENDBOX_")}
    # -X dev: ResourceWarnings shown, asyncio in debug mode (what a developer runs with)
    r = subprocess.run([sys.executable, "-X", "dev", "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    # aiohttp's warnings, and asyncio's for a socket left open under them (the "open_loop"
    # script's own unclosed loop is its business)
    for warning in ("Unclosed client session", "Unclosed connector", "unclosed transport",
                    "unclosed <socket"):
        assert warning not in r.stderr, r.stderr
    rsid = {"release_all": "gc-1", "global_release": "gc-2", "local_release": "gc-3",
            "open_loop": "gc-4"}[name]
    assert daemon.client().list_sessions() == [] or all(
        s["resources_session_id"] != rsid for s in daemon.client().list_sessions())


def test_sync_sandbox_beside_a_running_loop(daemon):
    # A program whose event loop runs in another thread (a server's) calls the sync facade
    # from a plain thread: it works, on its own loop thread, and leaves nothing running.
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        provider = {"name": "lendbox", "base_url": daemon.url, "token": daemon.token}
        with Sandbox(provider, SandboxSpec(ttl_s=600)) as sb:
            r = sb.exec("echo $((6*7))")
            assert (r.return_code, r.stdout) == (0, "42\n")
            sid = sb.sandbox_id
        assert daemon.client().get_sandbox(sid)["state"] == "stopped"
        assert not [th for th in threading.enumerate() if th.name == "lendbox-sync-loop"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join()
        loop.close()


async def test_sync_sandbox_refused_on_a_running_loop(daemon):
    # As NeMo Gym: a blocking call from a thread whose loop runs is refused, naming the call
    # (it would stall the loop); made outside the loop, the same object's calls are refused too.
    import asyncio

    with pytest.raises(RuntimeError, match=r"^Sandbox.__init__\(\) is blocking; use AsyncSandbox"):
        Sandbox("lendbox")
    provider = {"name": "lendbox", "base_url": daemon.url, "token": daemon.token}
    sb = await asyncio.to_thread(Sandbox, provider, SandboxSpec(ttl_s=600))
    await asyncio.to_thread(sb.start)
    try:
        with pytest.raises(RuntimeError, match=r"^Sandbox.exec\(\) is blocking"):
            sb.exec("true")
        assert (await asyncio.to_thread(sb.exec, "echo ok")).stdout == "ok\n"
    finally:
        await asyncio.to_thread(sb.stop)


def test_async_client_dropped_in_another_thread(daemon):
    # A client whose loop runs in another thread, dropped here: its session is closed on that
    # loop's own thread (call_soon_threadsafe), never touched from this one.
    import asyncio
    import gc
    import threading

    import lendbox

    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        c = lendbox.AsyncClient(daemon.url, daemon.token)
        assert asyncio.run_coroutine_threadsafe(c.healthz(), loop).result(30) == {"status": "ok"}
        (session,) = [s for _, s in c._open]
        del c
        gc.collect()
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
        assert session.closed
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join()
        loop.close()
