"""The ``lendbox`` command (clients/python/lendbox/cli.py) against a real daemon, run the way a
user runs it (``python3 -m lendbox``, a new process per command): seed, exec and its exit
status, cp both ways byte for byte, ls, release, errors, where the address and token come
from, and ``shell`` driven through a pseudo-terminal of the test's own."""

from __future__ import annotations

import fcntl
import os
import pathlib
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Dict, List, Optional

import pytest

from conftest import SRCDIR, has_route

import lendbox
import lendbox.cli

PKG = str(SRCDIR / "clients" / "python")
DEAD_URL = "http://127.0.0.1:1"  # nothing listens on port 1 of loopback


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LENDBOX_")}
    env["PYTHONPATH"] = PKG
    env.update(extra or {})
    return env


def lb(d, *argv: str, env: Optional[Dict[str, str]] = None, url: bool = True,
       token: bool = True, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """Run ``lendbox ARGV`` with the daemon's address and admin token in the environment."""
    e = {}
    if url:
        e["LENDBOX_URL"] = d.url
    if token:
        e["LENDBOX_TOKEN"] = d.token
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "lendbox", *argv], env=_env(e), input=stdin,
                          capture_output=True, timeout=120)


def test_seed_exec_cp_ls_release(daemon, tmp_path):
    r = lb(daemon, "seed", "cli-1", "--task-id", "t-1", "--ttl", "600")
    assert r.returncode == 0, r.stderr
    sbx = r.stdout.decode().strip()
    assert sbx.startswith("sbx-") and len(sbx) == 30
    assert daemon.client().get_session("cli-1")["task_id"] == "t-1"

    r = lb(daemon, "ls")
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stdout.decode().splitlines() if ln.startswith(sbx)]
    assert len(row) == 1 and row[0].split()[1:3] == ["cli-1", "lent"]

    # exit status and both streams, as the command made them
    r = lb(daemon, "exec", sbx, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    r = lb(daemon, "exec", sbx, "--", "printf", "%s", "ok")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"ok", b"")
    # binary output is carried exactly (base64 on the wire)
    r = lb(daemon, "exec", sbx, "--", "printf", "a\\000\\377b")
    assert (r.returncode, r.stdout) == (0, b"a\x00\xffb")

    # cp up and down, byte for byte (every byte value), mode kept on the way up
    blob = bytes(range(256)) * 300 + b"\x00end"
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    os.chmod(src, 0o640)
    r = lb(daemon, "cp", str(src), f"{sbx}:/workspace/in/blob.bin")
    assert r.returncode == 0, r.stderr
    assert daemon.client().get_file(sbx, "/workspace/in/blob.bin") == blob
    r = lb(daemon, "exec", sbx, "--", "stat", "-c", "%a %s", "/workspace/in/blob.bin")
    assert r.stdout == f"640 {len(blob)}\n".encode()
    back = tmp_path / "back.bin"
    r = lb(daemon, "cp", f"{sbx}:/workspace/in/blob.bin", str(back))
    assert r.returncode == 0, r.stderr
    assert back.read_bytes() == blob
    # into a directory: the file's own name
    r = lb(daemon, "cp", f"{sbx}:/workspace/in/blob.bin", str(tmp_path))
    assert r.returncode == 0 and (tmp_path / "blob.bin").read_bytes() == blob

    r = lb(daemon, "release", "cli-1")
    assert (r.returncode, r.stdout.decode()) == (0, f"released {sbx}\n")
    r = lb(daemon, "release", "cli-1")
    assert (r.returncode, r.stdout.decode()) == (0, "nothing to release\n")
    r = lb(daemon, "ls")
    assert sbx not in r.stdout.decode()
    r = lb(daemon, "ls", "--all")
    assert [ln.split()[2] for ln in r.stdout.decode().splitlines() if ln.startswith(sbx)] == ["stopped"]

    # the event feed tells of both
    r = lb(daemon, "events", "--rsid", "cli-1")
    types = [__import__("json").loads(ln)["type"] for ln in r.stdout.decode().splitlines()]
    assert r.returncode == 0 and types == ["seeded", "stopped"]


def test_cp_directory(daemon, tmp_path):
    sbx = lb(daemon, "seed", "cli-dir").stdout.decode().strip()
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "a.txt").write_bytes(b"a\n")
    (tree / "sub" / "deeper" / "b.bin").write_bytes(bytes(range(256)))
    try:
        r = lb(daemon, "cp", str(tree), f"{sbx}:/workspace/tree")
        if not has_route("PUT", "/v1/sandboxes/*/archive"):
            # no archive route on this daemon: a clear error, and nothing half-copied
            assert r.returncode == 1
            assert b"is a directory, and this daemon has no archive route" in r.stderr, r.stderr
            r = lb(daemon, "exec", sbx, "--", "test", "-e", "/workspace/tree")
            assert r.returncode == 1
            return
        assert r.returncode == 0, r.stderr
        out = tmp_path / "out"
        r = lb(daemon, "cp", f"{sbx}:/workspace/tree", str(out))
        assert r.returncode == 0, r.stderr
        assert (out / "a.txt").read_bytes() == b"a\n"
        assert (out / "sub" / "deeper" / "b.bin").read_bytes() == bytes(range(256))
        assert (out / "empty").is_dir() and not any((out / "empty").iterdir())
    finally:
        lb(daemon, "release", "cli-dir")


def test_errors(daemon):
    unknown = "sbx-" + "0" * 26
    r = lb(daemon, "exec", unknown, "--", "true")
    assert r.returncode == 1 and r.stdout == b""
    err = r.stderr.decode()
    assert err.startswith("lendbox: error: 404 not_found: ") and unknown in err, err
    r = lb(daemon, "cp", f"{unknown}:/etc/hostname", "-")
    assert r.returncode == 1 and b"404 not_found" in r.stderr
    r = lb(daemon, "seed", "bad rsid")
    assert r.returncode == 1 and r.stderr.startswith(b"lendbox: error: 400 bad_request: ")
    r = lb(daemon, "exec", unknown)
    assert r.returncode == 1 and b"exec needs a command" in r.stderr
    r = lb(daemon, "cp", "a", "b")
    assert r.returncode == 1 and b"one side is SBX:/path" in r.stderr
    r = lb(daemon, "frobnicate")
    assert r.returncode == 2 and b"invalid choice" in r.stderr


def test_address_and_token_precedence(daemon, tmp_path):
    # --url over LENDBOX_URL; LENDBOX_URL over the default
    r = lb(daemon, "--url", daemon.url, "ls", env={"LENDBOX_URL": DEAD_URL})
    assert r.returncode == 0, r.stderr
    r = lb(daemon, "ls", env={"LENDBOX_URL": DEAD_URL})
    assert r.returncode == 1 and r.stderr.startswith(f"lendbox: cannot reach {DEAD_URL}".encode())
    # --token and --token-file over LENDBOX_TOKEN
    r = lb(daemon, "--token", daemon.token, "ls", env={"LENDBOX_TOKEN": "wrong"})
    assert r.returncode == 0, r.stderr
    tf = tmp_path / "token"
    tf.write_text(daemon.token + "\n")
    r = lb(daemon, "--token-file", str(tf), "ls", env={"LENDBOX_TOKEN": "wrong"})
    assert r.returncode == 0, r.stderr
    r = lb(daemon, "ls", env={"LENDBOX_TOKEN": "wrong"})
    assert r.returncode == 1 and r.stderr.startswith(b"lendbox: error: 401 unauthorized: ")
    r = lb(daemon, "--token", "x", "--token-file", str(tf), "ls")
    assert r.returncode == 2 and b"not allowed with argument" in r.stderr
    r = lb(daemon, "--token-file", str(tmp_path / "none"), "ls")
    assert r.returncode == 1 and b"cannot read the token file" in r.stderr


def test_default_address_and_token_file(tmp_path, monkeypatch):
    # the last resort: http://127.0.0.1:8787 and /var/lib/lendbox/admin.token (here a copy)
    tf = tmp_path / "admin.token"
    tf.write_text("tok-from-file\n")
    monkeypatch.setattr(lendbox.cli, "DEFAULT_TOKEN_FILE", str(tf))
    args = lendbox.cli.build_parser().parse_args(["ls"])
    assert lendbox.cli.resolve_target(args, {}) == ("http://127.0.0.1:8787", "tok-from-file")
    assert lendbox.cli.resolve_target(args, {"LENDBOX_TOKEN": "e", "LENDBOX_URL": "http://h:1"}) \
        == ("http://h:1", "e")
    monkeypatch.setattr(lendbox.cli, "DEFAULT_TOKEN_FILE", str(tmp_path / "absent"))
    assert lendbox.cli.resolve_target(args, {}) == ("http://127.0.0.1:8787", "")


class _Term:
    """``lendbox ARGV`` on a pseudo-terminal of its own (its controlling terminal)."""

    def __init__(self, d, argv: List[str], rows: int, cols: int):
        env = _env({"LENDBOX_URL": d.url, "LENDBOX_TOKEN": d.token, "TERM": "xterm"})
        pid, fd = pty.fork()
        if pid == 0:  # the child: exec the command at once
            try:
                os.execve(sys.executable, [sys.executable, "-m", "lendbox", *argv], env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.resize(rows, cols)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, needle: bytes, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} not seen; the terminal showed {self.seen[-2000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:  # EIO: the command exited and closed the terminal
                    time.sleep(0.05)

    def wait(self, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.1)[0]:
                try:
                    self.seen += os.read(self.fd, 4096)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        raise AssertionError(f"lendbox shell did not exit; it showed {self.seen[-2000:]!r}")


def test_shell_through_a_pseudo_terminal(daemon):
    sbx = lb(daemon, "seed", "cli-sh").stdout.decode().strip()
    try:
        t = _Term(daemon, ["shell", sbx, "--command", "sh"], 20, 70)
        t.expect(b"# ")  # the prompt: the shell reads
        t.type("stty size; tty; echo $((6*7))\r")
        t.expect(b"42")
        assert b"/dev/pts/" in t.seen and b"20 70" in t.seen, t.seen
        # a window-size change of the local terminal reaches the sandbox's
        t.resize(33, 101)
        for _ in range(50):
            t.type("stty size\r")
            try:
                t.expect(b"33 101", timeout_s=0.5)
                break
            except AssertionError:
                continue
        assert b"33 101" in t.seen, t.seen
        t.type("exit 3\r")
        assert t.wait() == 3
        # the shell's session was deleted at its end; raw mode left nothing behind here
        r = lb(daemon, "exec", sbx, "--", "sh", "-c", "ps -eo args | grep -c '^sh$' || true")
        assert r.stdout == b"0\n", r.stdout
    finally:
        lb(daemon, "release", "cli-sh")


def test_shell_ctrl_d_and_user(daemon):
    sbx = lb(daemon, "seed", "cli-sh2").stdout.decode().strip()
    try:
        t = _Term(daemon, ["shell", sbx, "--user", "nobody", "--command", "sh"], 24, 80)
        t.expect(b"$ ")
        t.type("id -un\r")
        t.expect(b"nobody\r\n")
        t.type("\x04")  # Ctrl-D: end of input for the remote shell, which exits 0
        assert t.wait() == 0
    finally:
        lb(daemon, "release", "cli-sh2")


def test_shell_from_a_pipe_and_attach(daemon):
    sbx = lb(daemon, "seed", "cli-sh3").stdout.decode().strip()
    try:
        # stdin not a terminal: its lines go to the shell, its end ends it (the terminal's EOF)
        r = lb(daemon, "shell", sbx, "--command", "sh", stdin=b"echo $((6*7))\nexit 4\n")
        assert r.returncode == 4 and b"42\r\n" in r.stdout, r
        r = lb(daemon, "shell", sbx, "--command", "sh", stdin=b"echo piped\n")
        assert r.returncode == 0 and b"piped\r\n" in r.stdout, r
        # --attach takes over a session another client made; its earlier output is replayed
        c = daemon.client()
        sid = c.create_pty(sbx, "echo before; exec sh")["session_id"]
        c.pty_attach(sid)
        r = lb(daemon, "shell", sbx, "--attach", sid, stdin=b"echo attached\nexit 5\n")
        assert r.returncode == 5, r
        assert b"before" in r.stdout and b"attached\r\n" in r.stdout, r.stdout
        with pytest.raises(lendbox.NotFound):  # the session was deleted at its end
            c.pty_wait(sid, timeout_ms=0)
    finally:
        lb(daemon, "release", "cli-sh3")


def test_logs_events_images_snapshot_fork(daemon):
    sbx = lb(daemon, "seed", "cli-x").stdout.decode().strip()
    kids = []
    try:
        c = daemon.client()
        c.execute("cli-x", ["sh", "-c", "echo one; sleep 1; echo two"], wait=False)
        r = lb(daemon, "logs", "cli-x", "--follow")
        assert (r.returncode, r.stdout, r.stderr) == (0, b"one\ntwo\n", b"")
        r = lb(daemon, "logs", "cli-x")
        assert (r.returncode, r.stdout) == (0, b"one\ntwo\n")
        r = lb(daemon, "logs", "no-such-session")
        assert r.returncode == 1 and r.stderr.startswith(b"lendbox: error: 404 not_found: ")

        # --follow reads on as events come, until interrupted
        p = subprocess.Popen([sys.executable, "-m", "lendbox", "events", "--follow", "--rsid",
                              "cli-x"], env=_env({"LENDBOX_URL": daemon.url,
                                                  "LENDBOX_TOKEN": daemon.token}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             # a shell starts a background job with SIGINT ignored, and Python
                             # keeps an ignored SIGINT ignored: give the command Ctrl-C back, as
                             # a terminal would, or a `make check &` run could never interrupt it
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            first = __import__("json").loads(p.stdout.readline())
            assert first["type"] == "seeded" and first["sandbox_id"] == sbx
        finally:
            p.send_signal(2)  # SIGINT: Ctrl-C
            assert p.wait(30) == 130

        lb(daemon, "exec", sbx, "--", "sh", "-c", "echo kept > /workspace/f")
        r = lb(daemon, "snapshot", sbx, "cli-snap")
        assert r.returncode == 0 and r.stdout.decode().startswith("cli-snap sha256:"), r
        r = lb(daemon, "images")
        rows = [ln.split() for ln in r.stdout.decode().splitlines()]
        assert rows[0] == ["NAME", "KIND", "BASE", "SIZE", "CREATED"]
        assert ["cli-snap", "snapshot", "host"] in [row[:3] for row in rows[1:]]
        r = lb(daemon, "fork", sbx, "cli-k1", "cli-k2")
        assert r.returncode == 0, r.stderr
        kids = [ln.split() for ln in r.stdout.decode().splitlines()]
        assert [k[0] for k in kids] == ["cli-k1", "cli-k2"]
        r = lb(daemon, "exec", kids[1][1], "--", "cat", "/workspace/f")
        assert (r.returncode, r.stdout) == (0, b"kept\n")
        # a child that cannot be lent (its session is live): said on stderr, status 1
        r = lb(daemon, "fork", sbx, "cli-k1")
        assert r.returncode == 1 and b"cli-k1: 409 conflict" in r.stderr, r.stderr
    finally:
        for rsid in ("cli-x", "cli-k1", "cli-k2"):
            lb(daemon, "release", rsid)
        try:
            daemon.client().delete_image("cli-snap")
        except lendbox.LendboxError:
            pass


def test_shell_attach_past_the_retained_window(daemon):
    # 3 MB of output, more than the 1 MiB kept: --attach replays from the oldest byte kept
    sbx = lb(daemon, "seed", "cli-sh4").stdout.decode().strip()
    try:
        c = daemon.client()
        sid = c.create_pty(sbx, "head -c 3000000 /dev/zero | tr '\\0' a; echo END; exit 6")["session_id"]
        assert c.pty_wait(sid, timeout_ms=60000)["exit_code"] == 6
        with pytest.raises(lendbox.Gone):
            c.pty_output(sid, 0)
        r = lb(daemon, "shell", sbx, "--attach", sid)
        assert r.returncode == 6, r.stderr
        assert r.stdout.endswith(b"aaaaEND\r\n") and 1 << 20 <= len(r.stdout) < 3000000, len(r.stdout)
    finally:
        lb(daemon, "release", "cli-sh4")


def test_downloaded_archive_stays_in_its_directory(tmp_path):
    # A sandbox's tree is the agent's: an entry of a downloaded tar that would land outside the
    # destination (.., an absolute or escaping link, a device) is refused, nothing of it written.
    import io
    import tarfile

    def tar(*entries):
        b = io.BytesIO()
        with tarfile.open(fileobj=b, mode="w") as t:
            for name, kind, link in entries:
                ti = tarfile.TarInfo(name)
                if kind == "sym":
                    ti.type, ti.linkname = tarfile.SYMTYPE, link
                elif kind == "lnk":
                    ti.type, ti.linkname = tarfile.LNKTYPE, link
                elif kind == "chr":
                    ti.type = tarfile.CHRTYPE
                elif kind == "dir":
                    ti.type = tarfile.DIRTYPE
                else:
                    ti.size = 1
                t.addfile(ti, io.BytesIO(b"x") if kind == "file" else None)
        b.seek(0)
        return tarfile.open(fileobj=b, mode="r")

    ok = tmp_path / "ok"
    lendbox.cli._extract(tar(("a", "file", None), ("d", "dir", None), ("d/l", "sym", "../a")), str(ok))
    assert (ok / "a").read_bytes() == b"x" and os.readlink(ok / "d" / "l") == "../a"
    for i, bad in enumerate([("../x", "file", None), ("l", "sym", "../../etc"), ("l", "sym", "/etc"),
                             ("h", "lnk", "../../etc/passwd"), ("null", "chr", None)]):
        d = tmp_path / f"bad{i}"
        with pytest.raises(lendbox.cli.CliError, match="would leave"):
            lendbox.cli._extract(tar(bad), str(d))
        assert not d.exists() or not any(d.iterdir())
    assert not (tmp_path / "x").exists()


def test_downloaded_archive_never_follows_a_link(tmp_path):
    # A hostile tree (or daemon) may send a symlink chain that realpath misjudges (names near
    # PATH_MAX: tarfile's "data" filter before Python 3.11.13 let this tar write outside), a
    # chain that climbs only when followed (s -> ., x -> s/s/../..), or an entry through a
    # link already in the destination: refused, nothing written outside.
    import io
    import tarfile

    outside = tmp_path / "outside"
    outside.mkdir()
    comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as t:
        for step in steps:
            d = tarfile.TarInfo(os.path.join(path, comp))
            d.type = tarfile.DIRTYPE
            t.addfile(d)
            s = tarfile.TarInfo(os.path.join(path, step))
            s.type, s.linkname = tarfile.SYMTYPE, comp
            t.addfile(s)
            path = os.path.join(path, comp)
        deep = os.path.join(*steps, "l" * 254)
        s = tarfile.TarInfo(deep)
        s.type, s.linkname = tarfile.SYMTYPE, "../" * len(steps)
        t.addfile(s)
        s = tarfile.TarInfo("escape")
        s.type, s.linkname = tarfile.SYMTYPE, deep + "/../outside"
        t.addfile(s)
        f = tarfile.TarInfo("escape/evil")
        f.size = 6
        t.addfile(f, io.BytesIO(b"pwned\n"))
    dst = tmp_path / "dst"
    with pytest.raises(lendbox.cli.CliError, match="would leave"):
        lendbox.cli._extract(tarfile.open(fileobj=io.BytesIO(b.getvalue())), str(dst))
    assert list(outside.iterdir()) == []

    def one(*entries):
        b = io.BytesIO()
        with tarfile.open(fileobj=b, mode="w") as t:
            for name, link in entries:
                ti = tarfile.TarInfo(name)
                if link is None:
                    ti.size = 1
                    t.addfile(ti, io.BytesIO(b"x"))
                else:
                    ti.type, ti.linkname = tarfile.SYMTYPE, link
                    t.addfile(ti)
        b.seek(0)
        return tarfile.open(fileobj=b)

    for i, bad in enumerate([[("s", "."), ("x", "s/s/../..")], [("s", "."), ("t/u", "../s/../..")]]):
        with pytest.raises(lendbox.cli.CliError, match="would leave"):
            lendbox.cli._extract(one(*bad), str(tmp_path / f"chain{i}"))
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "x").symlink_to(outside)
    with pytest.raises(lendbox.cli.CliError, match="would leave"):
        lendbox.cli._extract(one(("x/evil", None)), str(planted))
    assert list(outside.iterdir()) == []
    # what stays inside still comes out: a leading climb within the tree, a repeated name
    ok = tmp_path / "ok"
    lendbox.cli._extract(one(("a/b", None), ("a/up", "../a/b"), ("a/b", None)), str(ok))
    assert (ok / "a" / "b").read_bytes() == b"x" and os.readlink(ok / "a" / "up") == "../a/b"
