"""The ``lendbox`` command: lendboxd from a shell (``lendbox --help``; man page lendbox(1)).

Address and token, first found wins: ``--url``, ``--token`` / ``--token-file``; then the
environment, ``LENDBOX_URL`` and ``LENDBOX_TOKEN``; then ``http://127.0.0.1:8787`` and the
file ``/var/lib/lendbox/admin.token`` (when readable).

Exit status: 0 on success; for ``exec`` and ``shell`` the command's own status; 1 when the
daemon answered an error (its status, code and message are printed on stderr), 2 for a usage
error, 130 after Ctrl-C.

Standard library only (the blocking :class:`lendbox.Client`); ``shell`` needs a Unix terminal.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import select
import signal
import stat
import sys
import tarfile
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import quote, urlencode

from .client import DEFAULT_BASE_URL, Client
from .errors import BadRequest, Conflict, Gone, LendboxError, TransportError, error_for

DEFAULT_TOKEN_FILE = "/var/lib/lendbox/admin.token"

#: long-poll of ``shell``'s output reads, milliseconds (the daemon lowers it to limits.max_wait_ms)
_SHELL_WAIT_MS = 20000


class CliError(Exception):
    """A failure of the command itself (not an answer of the daemon): printed, exit 1."""


# --- address, token and transport ----------------------------------------------------------------


def resolve_target(args: argparse.Namespace, environ: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """The base URL and token the command uses (module docs: flags, environment, defaults).
    The token is "" when none is found (routes then answer 401)."""
    env = os.environ if environ is None else environ
    url = args.url or env.get("LENDBOX_URL") or DEFAULT_BASE_URL
    if args.token is not None:
        return url, args.token
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                return url, f.read().strip()
        except OSError as e:
            raise CliError(f"cannot read the token file {args.token_file}: {e.strerror}") from e
    if env.get("LENDBOX_TOKEN"):
        return url, env["LENDBOX_TOKEN"]
    try:
        with open(DEFAULT_TOKEN_FILE, encoding="utf-8") as f:
            return url, f.read().strip()
    except OSError:
        return url, ""


def _seg(s: str) -> str:
    return quote(str(s), safe="")


class _Raw:
    """Requests the route methods of :class:`Client` do not make: streamed answers (NDJSON
    exec, activation log follow, event stream) and the archive routes. One connection per
    request; errors raised as :class:`LendboxError` like the client's."""

    def __init__(self, client: Client):
        self.c = client

    def _conn(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.c._scheme == "https" else http.client.HTTPConnection
        return cls(self.c._host, self.c._port, timeout=timeout)

    def request(self, method: str, path: str, *, params: Optional[Dict[str, Any]] = None,
                body: Optional[bytes] = None, content_type: Optional[str] = None,
                accept: Optional[str] = None, timeout: Optional[float] = None
                ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        target = self.c._prefix + path
        if params:
            target += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        headers = dict(self.c._headers)
        if content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        conn = self._conn(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TransportError(f"{method} {target}: {e!r}") from e
        if resp.status >= 300:
            data = resp.read()
            conn.close()
            code, message = f"http_{resp.status}", resp.reason or "error"
            try:
                err = json.loads(data)["error"]
                code, message = str(err["code"]), str(err["message"])
            except Exception:
                if data:
                    message = data.decode("utf-8", "replace")[:500]
            raise error_for(resp.status, code, message, resp.headers.get("X-Request-Id"))
        return conn, resp

    def ndjson(self, method: str, path: str, **kw: Any) -> Iterator[Dict[str, Any]]:
        """The JSON objects of a streamed answer, one per line, as they come."""
        conn, resp = self.request(method, path, accept="application/x-ndjson", **kw)
        try:
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise TransportError(f"{method} {path}: the stream broke: {e!r}") from e
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


def _raise_stream_error(obj: Dict[str, Any]) -> None:
    """A stream's last line ``{"error": {...}}`` as the error it stands for."""
    err = obj.get("error")
    if isinstance(err, dict):
        code = str(err.get("code") or "error")
        status = {"not_found": 404, "draining": 503, "overloaded": 429}.get(code, 502)
        raise error_for(status, code, str(err.get("message") or ""))


def _out(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _err(data: bytes) -> None:
    sys.stderr.buffer.write(data)
    sys.stderr.buffer.flush()


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, separators=(",", ":"), ensure_ascii=False), flush=True)


def _table(rows: List[Sequence[Any]], header: Sequence[str]) -> None:
    cells = [list(map(str, header))] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


# --- commands --------------------------------------------------------------------------------------


def cmd_ls(c: Client, args: argparse.Namespace) -> int:
    boxes = c.list_sandboxes(None if args.all else "lent")
    if args.json:
        _print_json(boxes)
        return 0
    _table([(b.get("sandbox_id"), b.get("resources_session_id"), b.get("state"), b.get("image"),
             b.get("expires_at")) for b in boxes],
           ("SANDBOX", "SESSION", "STATE", "IMAGE", "EXPIRES"))
    return 0


def cmd_seed(c: Client, args: argparse.Namespace) -> int:
    lease = c.seed(args.rsid, args.task_id or args.rsid, image=args.image, ttl_s=args.ttl)
    if args.json:
        _print_json(lease)
    else:
        print(lease["sandbox_id"], flush=True)
    return 0


def _env_pairs(pairs: Optional[List[str]]) -> Optional[Dict[str, str]]:
    if not pairs:
        return None
    env = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise CliError(f"--env takes NAME=VALUE, not {p!r}")
        env[k] = v
    return env


def cmd_exec(c: Client, args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise CliError("exec needs a command: lendbox exec SBX -- CMD [ARG...]")
    body: Dict[str, Any] = {"argv": argv, "encoding": "base64"}
    for k, v in (("cwd", args.cwd), ("user", args.user), ("timeout_s", args.timeout),
                 ("env", _env_pairs(args.env))):
        if v is not None:
            body[k] = v
    if args.stdin:
        try:
            body["stdin"] = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as e:
            raise CliError("--stdin takes text (UTF-8): the exec route's stdin is a string") from e
    path = f"/v1/sandboxes/{_seg(args.sandbox)}/exec"
    for obj in _Raw(c).ndjson("POST", path, body=json.dumps(body).encode(),
                              content_type="application/json", timeout=None):
        stream = obj.get("stream")
        if stream in ("stdout", "stderr"):
            data = base64.b64decode(obj.get("data") or "")
            (_out if stream == "stdout" else _err)(data)
            continue
        _raise_stream_error(obj)
        if "return_code" in obj:
            if obj.get("error_type") and obj.get("message"):
                _err(f"lendbox: {obj['error_type']}: {obj['message']}\n".encode())
            return int(obj["return_code"])
    raise CliError("the exec stream ended without a result")


class _Terminal:
    """Raw mode on a tty stdin for the life of a shell; restored however it ends."""

    def __init__(self, fd: int):
        self.fd = fd
        self.saved = None
        if os.isatty(fd):
            import termios
            import tty

            self.saved = termios.tcgetattr(fd)
            tty.setraw(fd, termios.TCSANOW)  # keep what was typed ahead

    def restore(self) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.saved = None


def _window_size() -> Tuple[int, int]:
    for fd in (1, 0, 2):
        try:
            sz = os.get_terminal_size(fd)
            if sz.lines > 0 and sz.columns > 0:
                return sz.lines, sz.columns
        except OSError:
            continue
    return 24, 80


def cmd_shell(c: Client, args: argparse.Namespace) -> int:
    rows, cols = _window_size()
    io_client = c
    if args.attach:
        sid = args.attach
        a = c.pty_attach(sid, takeover=True)
        io_client = Client(c.base_url, c.token, headers={"X-Attach-Token": a["attach_token"]})
        since = 0
        try:
            io_client.pty_resize(sid, rows, cols)
        except Conflict:
            pass  # its process has exited: the output and the status are still there
    else:
        sid = c.create_pty(args.sandbox, args.command, user=args.user, rows=rows, cols=cols,
                           cwd=args.cwd)["session_id"]
        since = 0
    result: Dict[str, Any] = {"exit": None, "error": None}
    done = threading.Event()
    wake_r, wake_w = os.pipe()

    def reader() -> None:
        pos = since
        try:
            while True:
                try:
                    r = io_client.pty_output(sid, pos, wait_ms=_SHELL_WAIT_MS)
                except Gone:  # older than the retained window: replay from its start
                    pos = _oldest_offset(io_client, sid, pos)
                    continue
                if r["data"]:
                    _out(r["data"])
                pos = r["next_offset"]
                if r["exit_code"] is not None:
                    result["exit"] = r["exit_code"]
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            result["error"] = e
        finally:
            done.set()
            os.write(wake_w, b"x")

    resized = {"pending": False}

    def on_winch(signum: int, frame: Any) -> None:
        resized["pending"] = True
        try:
            os.write(wake_w, b"w")
        except OSError:
            pass

    old_winch = signal.signal(signal.SIGWINCH, on_winch)
    term = _Terminal(0)
    t = threading.Thread(target=reader, name="lendbox-shell-output", daemon=True)
    t.start()
    stdin_open = True
    try:
        while not done.is_set():
            fds = [wake_r] + ([0] if stdin_open else [])
            ready, _, _ = select.select(fds, [], [])
            if wake_r in ready:
                os.read(wake_r, 64)
                if resized["pending"]:
                    resized["pending"] = False
                    r2, c2 = _window_size()
                    try:
                        io_client.pty_resize(sid, r2, c2)
                    except Conflict:
                        pass  # the shell exited meanwhile
            if stdin_open and 0 in ready:
                data = os.read(0, 4096)
                if not data:
                    # EOF of a pipe or file: pass it on as the terminal's EOF character, so a
                    # shell fed a script ends with it
                    stdin_open = False
                    try:
                        io_client.pty_input(sid, b"\x04")
                    except Conflict:
                        pass
                    continue
                try:
                    io_client.pty_input(sid, data)
                except Conflict:
                    stdin_open = False  # the process has exited: its output tells the rest
    finally:
        term.restore()
        signal.signal(signal.SIGWINCH, old_winch)
    t.join()
    os.close(wake_r)
    os.close(wake_w)
    if result["error"] is not None:
        raise result["error"]
    try:
        io_client.pty_delete(sid)
    except LendboxError:
        pass
    return int(result["exit"])


def _oldest_offset(c: Client, sid: str, gone: int) -> int:
    """The oldest offset of the PTY session's output still retained, above ``gone`` (410 there):
    found by bisection between 410 (older) and 400 (past the end) answers, one read each."""
    lo, hi = gone + 1, 1 << 62
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            c.pty_output(sid, mid, wait_ms=0)
            hi = mid
        except Gone:
            lo = mid + 1
        except BadRequest:  # past the end
            hi = mid
    return lo


def _split_remote(spec: str) -> Tuple[Optional[str], str]:
    """``SBX:/path`` → (SBX, /path); a local path → (None, path). A local path with a colon is
    written ``./a:b``."""
    if spec.startswith(("/", ".")) or ":" not in spec:
        return None, spec
    sbx, _, path = spec.partition(":")
    if not path.startswith("/"):
        raise CliError(f"a sandbox path must be absolute: {spec!r}")
    return sbx, path


def _no_archive(e: LendboxError) -> bool:
    return e.status in (404, 405) and e.message.startswith("no route")


def cmd_cp(c: Client, args: argparse.Namespace) -> int:
    src_sbx, src = _split_remote(args.src)
    dst_sbx, dst = _split_remote(args.dst)
    if (src_sbx is None) == (dst_sbx is None):
        raise CliError("cp copies between a sandbox and here: one side is SBX:/path, the other local")
    raw = _Raw(c)
    if dst_sbx is not None:  # upload
        if os.path.isdir(src):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for name in sorted(os.listdir(src)):
                    tar.add(os.path.join(src, name), arcname=name)
            try:
                conn, resp = raw.request("PUT", f"/v1/sandboxes/{_seg(dst_sbx)}/archive",
                                         params={"path": dst}, body=buf.getvalue(),
                                         content_type="application/x-tar")
                resp.read()
                conn.close()
            except LendboxError as e:
                if _no_archive(e):
                    raise CliError(f"{src} is a directory, and this daemon has no archive route "
                                   "(PUT /v1/sandboxes/{id}/archive): copy its files one by one") from e
                raise
            return 0
        try:
            with open(src, "rb") as f:
                data = f.read()
            mode = os.stat(src).st_mode & 0o777
        except OSError as e:
            raise CliError(f"cannot read {src}: {e.strerror}") from e
        c.put_file(dst_sbx, dst, data, mode=mode)
        return 0
    # download
    try:
        data = c.get_file(src_sbx, src)
    except LendboxError as e:
        if not (e.status == 400 and "directory" in e.message):
            raise
        try:
            conn, resp = raw.request("GET", f"/v1/sandboxes/{_seg(src_sbx)}/archive",
                                     params={"path": src})
            body = resp.read()
            conn.close()
        except LendboxError as e2:
            if _no_archive(e2):
                raise CliError(f"{src_sbx}:{src} is a directory, and this daemon has no archive "
                               "route (GET /v1/sandboxes/{id}/archive)") from e2
            raise
        os.makedirs(dst, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            _extract(tar, dst)  # not extractall: its "data" filter is bypassable before 3.11.13
        return 0
    if dst == "-":
        _out(data)
        return 0
    if os.path.isdir(dst):
        dst = os.path.join(dst, os.path.basename(src))
    with open(dst, "wb") as f:
        f.write(data)
    return 0


def _link_stays_inside(depth: int, target: str) -> bool:
    """A symlink in a directory ``depth`` levels below the destination, with this target: it
    may climb with leading ``..`` components only (at most ``depth``), then only descend. With
    every symlink so made, no chain of them leads out (a ``..`` after a name could climb out
    of wherever an earlier symlink led)."""
    if not target or target.startswith("/"):
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return up <= depth and ".." not in parts[up:]


def _extract(tar: tarfile.TarFile, dst: str) -> None:
    """Extract a downloaded archive into ``dst`` without anything landing outside it, whatever
    the archive holds: only directories, regular files and symlinks are taken; names are
    relative without ``..``; every entry's parent is opened from ``dst`` one component at a
    time with ``O_NOFOLLOW``, so no symlink (of the archive or already in ``dst``) is ever
    followed; a symlink is made as a link and its target must stay inside (_link_stays_inside).
    Modes keep rwx bits without group/other write; no setuid, setgid or sticky bit; the owner
    is the caller. Every entry is checked before the first is written."""
    members = []
    links = set()
    for m in tar.getmembers():
        parts = [p for p in m.name.split("/") if p not in ("", ".")]
        bad = (m.name.startswith("/") or ".." in parts or not (m.isdir() or m.isreg() or m.issym())
               or (m.issym() and not _link_stays_inside(len(parts) - 1, m.linkname))
               or any("/".join(parts[:i]) in links for i in range(1, len(parts))))
        if bad:
            raise CliError(f"the archive's entry {m.name!r} would leave {dst} (only files, "
                           "directories and symlinks that stay inside are taken)")
        if parts:
            if m.issym():
                links.add("/".join(parts))
            else:
                links.discard("/".join(parts))
            members.append((parts, m))
    os.makedirs(dst, exist_ok=True)
    root = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    dirs = []

    def open_dir(parts: List[str]) -> int:
        fd = os.dup(root)
        try:
            for p in parts:
                try:
                    os.mkdir(p, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError:
            os.close(fd)
            raise
        return fd

    def clear(pfd: int, base: str) -> None:
        """Remove a non-directory at base (the last of a repeated name wins)."""
        try:
            if not stat.S_ISDIR(os.stat(base, dir_fd=pfd, follow_symlinks=False).st_mode):
                os.unlink(base, dir_fd=pfd)
        except FileNotFoundError:
            pass

    try:
        for parts, m in members:
            try:
                pfd = open_dir(parts[:-1])
            except OSError as e:
                raise CliError(f"the archive's entry {m.name!r} would leave {dst}: {e.strerror}") from e
            base = parts[-1]
            try:
                if m.isdir():
                    try:
                        os.mkdir(base, 0o700, dir_fd=pfd)
                    except FileExistsError:
                        pass
                    dirs.append((parts, (m.mode & 0o755) | 0o700))
                    continue
                clear(pfd, base)
                if m.issym():
                    os.symlink(m.linkname, base, dir_fd=pfd)
                    continue
                fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=pfd)
                try:
                    src = tar.extractfile(m)
                    while src is not None:
                        chunk = memoryview(src.read(1 << 20))
                        if not chunk:
                            break
                        while chunk:
                            chunk = chunk[os.write(fd, chunk):]
                    os.fchmod(fd, (m.mode & 0o755) | 0o600)
                    try:
                        os.utime(fd, (m.mtime, m.mtime))
                    except (OverflowError, ValueError):
                        pass  # an mtime no file here can hold: the file keeps now
                finally:
                    os.close(fd)
            except OSError as e:
                raise CliError(f"cannot write the archive's entry {m.name!r} in {dst}: {e.strerror}") from e
            finally:
                os.close(pfd)
        for parts, mode in reversed(dirs):
            try:
                fd = open_dir(parts)
            except OSError as e:  # a name of the archive that is a directory and then not
                raise CliError(f"the archive's directory {'/'.join(parts)!r} is not one in {dst}: "
                               f"{e.strerror}") from e
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    finally:
        os.close(root)


def cmd_release(c: Client, args: argparse.Namespace) -> int:
    r = c.release(args.rsid)
    if args.json:
        _print_json(r)
    elif r.get("released"):
        print(f"released {r.get('sandbox_id')}")
    else:
        print("nothing to release")
    return 0


def cmd_events(c: Client, args: argparse.Namespace) -> int:
    types = args.types.split(",") if args.types else None
    if args.follow:
        for ev in c.iter_events(args.since, rsid=args.rsid, sandbox_id=args.sandbox, types=types):
            _print_json(ev)
        return 0
    page = c.events(args.since, rsid=args.rsid, sandbox_id=args.sandbox, types=types)
    for ev in page["events"]:
        _print_json(ev)
    return 0


def cmd_images(c: Client, args: argparse.Namespace) -> int:
    images = c.list_images()
    if args.json:
        _print_json(images)
        return 0
    _table([(i.get("name"), i.get("kind"), i.get("base"), i.get("size_bytes"), i.get("created_at"))
            for i in images], ("NAME", "KIND", "BASE", "SIZE", "CREATED"))
    return 0


def cmd_snapshot(c: Client, args: argparse.Namespace) -> int:
    img = c.snapshot(args.sandbox, args.name)
    if args.json:
        _print_json(img)
    else:
        print(f"{img['name']} {img['digest']} {img['size_bytes']}")
    return 0


def cmd_fork(c: Client, args: argparse.Namespace) -> int:
    r = c.fork(args.sandbox, list(args.rsids), task_id=args.task_id)
    if args.json:
        _print_json(r)
    failed = 0
    for ch in r["children"]:
        if ch.get("status") == 200:
            if not args.json:
                print(f"{ch['rsid']} {ch['lease']['sandbox_id']}")
        else:
            failed += 1
            err = ch.get("error") or {}
            print(f"lendbox: fork: {ch.get('rsid')}: {ch.get('status')} {err.get('code')}: "
                  f"{err.get('message')}", file=sys.stderr)
    return 1 if failed else 0


def cmd_logs(c: Client, args: argparse.Namespace) -> int:
    if not args.follow:
        act = c.get_activation(args.rsid, log=True)
        _out((act.get("log") or "").encode("utf-8"))
        return 0
    path = f"/v1/sessions/{_seg(args.rsid)}/activation"
    for obj in _Raw(c).ndjson("GET", path, timeout=None):
        if obj.get("stream") == "log":
            _out((obj.get("data") or "").encode("utf-8"))
            continue
        _raise_stream_error(obj)
        if args.json:
            _print_json(obj)
        return 0
    return 0


# --- the parser ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lendbox",
        description="Use lendboxd, the sandbox-lending daemon, from a shell.",
        epilog="Address and token: --url, --token/--token-file, then LENDBOX_URL and "
               "LENDBOX_TOKEN, then http://127.0.0.1:8787 and /var/lib/lendbox/admin.token. "
               "See lendbox(1).")
    p.add_argument("--url", help="the daemon's base URL (default $LENDBOX_URL, else %s)" % DEFAULT_BASE_URL)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--token", help="bearer token: the admin token or a sandbox's operate token")
    g.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON answers")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("ls", help="list lent sandboxes")
    s.add_argument("--all", action="store_true", help="every record, not only lent ones")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("seed", help="lend a resources session a sandbox; prints its id")
    s.add_argument("rsid")
    s.add_argument("--task-id", help="default: the session id")
    s.add_argument("--image")
    s.add_argument("--ttl", type=float, metavar="SECONDS")
    s.set_defaults(func=cmd_seed)

    s = sub.add_parser("exec", help="run a command in a sandbox, its output streamed")
    s.add_argument("sandbox")
    s.add_argument("--cwd")
    s.add_argument("--user")
    s.add_argument("--env", action="append", metavar="NAME=VALUE")
    s.add_argument("--timeout", type=float, metavar="SECONDS")
    s.add_argument("--stdin", action="store_true", help="send this command's stdin (as text)")
    s.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    s.set_defaults(func=cmd_exec)

    s = sub.add_parser("shell", help="an interactive terminal in a sandbox")
    s.add_argument("sandbox")
    s.add_argument("--user")
    s.add_argument("--cwd")
    s.add_argument("--command", help="run this instead of a login shell")
    s.add_argument("--attach", metavar="SESSION", help="take over the PTY session SESSION")
    s.set_defaults(func=cmd_shell)

    s = sub.add_parser("cp", help="copy a file or a directory between here and a sandbox (SBX:/path)")
    s.add_argument("src")
    s.add_argument("dst")
    s.set_defaults(func=cmd_cp)

    s = sub.add_parser("release", help="release a session's sandbox")
    s.add_argument("rsid")
    s.set_defaults(func=cmd_release)

    s = sub.add_parser("events", help="the event feed, one JSON object a line")
    s.add_argument("--follow", "-f", action="store_true", help="keep reading new events")
    s.add_argument("--since", type=int, default=0, metavar="SEQ")
    s.add_argument("--rsid")
    s.add_argument("--sandbox")
    s.add_argument("--types", metavar="A,B")
    s.set_defaults(func=cmd_events)

    s = sub.add_parser("images", help="list images and snapshots")
    s.set_defaults(func=cmd_images)

    s = sub.add_parser("snapshot", help="capture a sandbox as the image NAME")
    s.add_argument("sandbox")
    s.add_argument("name")
    s.set_defaults(func=cmd_snapshot)

    s = sub.add_parser("fork", help="lend each RSID a copy of a sandbox")
    s.add_argument("sandbox")
    s.add_argument("rsids", nargs="+", metavar="RSID")
    s.add_argument("--task-id")
    s.set_defaults(func=cmd_fork)

    s = sub.add_parser("logs", help="a session's activation log")
    s.add_argument("rsid")
    s.add_argument("--follow", "-f", action="store_true", help="stream it until the harness ends")
    s.set_defaults(func=cmd_logs)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        url, token = resolve_target(args)
        client = Client(url, token)
    except (CliError, ValueError) as e:
        print(f"lendbox: {e}", file=sys.stderr)
        return 1
    try:
        return args.func(client, args)
    except LendboxError as e:
        if isinstance(e, TransportError):
            print(f"lendbox: cannot reach {url}: {e.message}", file=sys.stderr)
        else:
            print(f"lendbox: error: {e.status} {e.code}: {e.message}", file=sys.stderr)
        return 1
    except CliError as e:
        print(f"lendbox: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    finally:
        client.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
