"""lendbox.Client / AsyncClient put_archive and get_archive against a real daemon: a directory
made with tarfile goes in (plain and gzip) and comes back with its modes and symlinks; an
escaping entry and a body that is not a tar are BadRequest with nothing kept; another sandbox's
operate token is Forbidden. Every JSON answer is validated against docs/openapi.yaml by the
fixture's hook."""

from __future__ import annotations

import asyncio
import io
import tarfile

import pytest

import lendbox


def _tar(entries, gzip: bool = False) -> bytes:
    """entries: (name, kind, mode, data_or_target) with kind "f", "d" or "l"."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gzip else "w") as t:
        for name, kind, mode, extra in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "d":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = extra
                t.addfile(info)
            else:
                info.size = len(extra)
                t.addfile(info, io.BytesIO(extra))
    return buf.getvalue()


def test_archive_round_trip(daemon):
    c = daemon.client()
    lease = c.seed("ar-1", "t")
    sid = lease["sandbox_id"]
    op = daemon.client(token=lease["access"]["token"])
    body = _tar(
        [
            ("proj", "d", 0o750, None),
            ("proj/main.py", "f", 0o755, b"print(42)\n"),
            ("proj/data/x.bin", "f", 0o600, bytes(range(256))),
            ("proj/latest", "l", 0o777, "data/x.bin"),
            ("proj/empty", "d", 0o700, None),
        ],
        gzip=True,
    )
    r = op.put_archive(sid, "/workspace/in", body)
    assert r == {"path": "/workspace/in", "entries": 5, "bytes": 10 + 256}
    out = c.exec(sid, "stat -c '%a %n' /workspace/in/proj /workspace/in/proj/main.py "
                 "/workspace/in/proj/empty; readlink /workspace/in/proj/latest; "
                 "python3 /workspace/in/proj/main.py || echo 42")
    assert out["stdout"] == ("750 /workspace/in/proj\n755 /workspace/in/proj/main.py\n"
                             "700 /workspace/in/proj/empty\ndata/x.bin\n42\n")
    got = tarfile.open(fileobj=io.BytesIO(op.get_archive(sid, "/workspace/in/proj")))
    members = {m.name: m for m in got.getmembers()}
    assert set(members) == {"main.py", "data", "data/x.bin", "latest", "empty"}
    assert members["main.py"].mode == 0o755 and members["empty"].isdir()
    assert members["latest"].issym() and members["latest"].linkname == "data/x.bin"
    assert got.extractfile("data/x.bin").read() == bytes(range(256))

    # escapes and non-tars: BadRequest, nothing kept
    for bad in (
        _tar([("ok", "f", 0o644, b"ok"), ("../evil", "f", 0o644, b"x")]),
        _tar([("ok", "f", 0o644, b"ok"), ("/evil", "f", 0o644, b"x")]),
        _tar([("ok", "f", 0o644, b"ok"), ("up", "l", 0o777, "../../etc")]),
        b"not a tar at all",
    ):
        with pytest.raises(lendbox.BadRequest):
            op.put_archive(sid, "/workspace/bad", bad)
    assert c.exec(sid, "ls -A /workspace | grep -c bad; true")["stdout"] == "0\n"

    # another sandbox's operate token
    other = c.seed("ar-2", "t")
    stranger = daemon.client(token=other["access"]["token"])
    with pytest.raises(lendbox.Forbidden):
        stranger.put_archive(sid, "/workspace/x", body)
    with pytest.raises(lendbox.Forbidden):
        stranger.get_archive(sid, "/workspace")
    with pytest.raises(lendbox.NotFound):
        op.get_archive(sid, "/workspace/missing")
    stranger.close()
    op.close()

    async def go():
        async with daemon.async_client() as ac:
            r2 = await ac.put_archive(sid, "/workspace/async", _tar([("a", "f", 0o644, b"A")]))
            assert r2 == {"path": "/workspace/async", "entries": 1, "bytes": 1}
            t = tarfile.open(fileobj=io.BytesIO(await ac.get_archive(sid, "/workspace/async")))
            assert t.extractfile("a").read() == b"A"

    asyncio.run(go())
    c.release("ar-1")
    c.release("ar-2")
    c.close()
