"""Fixtures of the Python client tests: a real lendboxd on loopback, started per test module
(or per test where a test restarts it or needs fault injection), the way tests/e2e/harness.c
starts one: its own state dir under /tmp, --listen 127.0.0.1:0, its own sandbox uid range.

Every JSON answer the clients get in these tests is validated against docs/openapi.yaml (the
schema of its operation and status) with python3-jsonschema: see ``openapi_hook``.

Binaries come from LENDBOXD and LENDBOX_SUPERVISE (the Makefile exports them), else build/.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import urllib.error
import urllib.request

import jsonschema
import pytest
import yaml

SRCDIR = pathlib.Path(os.environ.get("LENDBOX_SRCDIR") or pathlib.Path(__file__).resolve().parents[2])
sys.path.insert(0, str(SRCDIR / "clients" / "python"))

import lendbox  # noqa: E402
import lendbox.gym  # noqa: E402

# what an ASan, LeakSanitizer or UBSan report in a daemon's log starts with
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:")
LENDBOXD = os.environ.get("LENDBOXD") or str(SRCDIR / "build" / "lendboxd")
SUPERVISE = os.environ.get("LENDBOX_SUPERVISE") or str(SRCDIR / "build" / "lendbox-supervise")
OPENAPI_PATH = SRCDIR / "docs" / "openapi.yaml"


def daemon_routes() -> List[Sequence[str]]:
    """The daemon's route table, from `lendboxd routes`: [(METHOD, PATTERN, AUTH, NAME)...]."""
    out = subprocess.run([LENDBOXD, "routes"], check=True, capture_output=True, text=True).stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def has_route(method: str, pattern: str) -> bool:
    return any(r[0] == method and r[1] == pattern for r in daemon_routes())


def needs_route(method: str, pattern: str, what: str = ""):
    """Skip a test whose route this daemon does not have yet (an older build)."""
    return pytest.mark.skipif(
        not has_route(method, pattern),
        reason=f"lendboxd has no route {method} {pattern} yet{what} (an older build)",
    )


needs_i10_http = needs_route("POST", "/v1/sessions/release_all")
needs_create = needs_route("POST", "/v1/sandboxes", " (AsyncSandbox.start)")
needs_agent_activations = needs_route(
    "POST", "/v1/sessions/*/stop_harness",
    " nor operate-token activations with \"wait\": false")


# --- OpenAPI validation of real answers ----------------------------------------------------------


class OpenAPI:
    """docs/openapi.yaml, and validation of an answer against its operation's schema."""

    def __init__(self, path: pathlib.Path):
        self.doc = yaml.safe_load(path.read_text())
        self.resolver = jsonschema.RefResolver(base_uri="", referrer=self.doc)
        self.templates = []
        for tpl, item in self.doc["paths"].items():
            rx = "^" + re.sub(r"\{[^/}]+\}", "[^/]+", tpl) + "$"
            self.templates.append((re.compile(rx), tpl, item))
        self.validated = 0

    def operation(self, method: str, path: str):
        # an exact path (/v1/sessions/release_all) wins over a template (/v1/sessions/{rsid})
        best = None
        for rx, tpl, item in self.templates:
            if rx.match(path) and method.lower() in item:
                if best is None or tpl.count("{") < best[0].count("{"):
                    best = (tpl, item[method.lower()])
        return best

    def validate(self, method: str, path: str, status: int, content_type: str, body: bytes) -> None:
        op = self.operation(method, path)
        if op is None and status in (404, 405):  # no such route: the common error body
            op = (path, {"responses": {}})
        assert op is not None, f"{method} {path} is not in docs/openapi.yaml"
        tpl, operation = op
        responses = operation["responses"]
        resp = responses.get(str(status)) or responses.get("default")
        if resp is None and status in (401, 404, 405, 413, 500):
            # answers common to every route (the document's info.description): the error body
            resp = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        assert resp is not None, f"{method} {tpl}: status {status} is not documented"
        if "$ref" in resp:
            resp = self.resolver.resolve(resp["$ref"])[1]
        content = resp.get("content") or {}
        if not content_type.startswith("application/json"):
            return
        assert "application/json" in content, f"{method} {tpl} {status}: JSON answer not documented"
        schema = content["application/json"]["schema"]
        jsonschema.Draft202012Validator(schema, resolver=self.resolver).validate(json.loads(body))
        self.validated += 1


_openapi: Optional[OpenAPI] = None


def openapi() -> OpenAPI:
    global _openapi
    if _openapi is None:
        _openapi = OpenAPI(OPENAPI_PATH)
    return _openapi


def _check(method: str, path: str, response) -> None:
    openapi().validate(method, path, response.status_code,
                       response.headers.get("content-type", ""), response.content)


def hooked(client):
    """Make every answer `client` (a lendbox Client or AsyncClient) gets validated: the
    clients call ``_on_response(method, path, answer)`` for each answer before decoding it."""
    client._on_response = _check
    return client


class ValidatingProvider(lendbox.gym.LendboxProvider):
    """The real provider, whose clients validate every answer against docs/openapi.yaml."""

    def client(self, handle=None):
        c = super().client(handle)
        if not getattr(c, "_validating", False):
            hooked(c)
            c._validating = True
        return c


# --- the daemon ----------------------------------------------------------------------------------


def claim_uid_range() -> "tuple[int, int]":
    """A sandbox uid range of 64 slots (65,536 ids each) claimed host-wide the way
    tests/e2e/harness.c claims its daemons' (lbt_claim_uid_range): block k of 210 from
    1526 * 65536 is held by flock on /run/lendbox-test/uid.<k> while the returned fd is open, and
    no lendboxd claims a slot of it (/run/lendbox/slots). Two test runs at once (two clones'
    make check) never share a range. Returns (uid_base, fd)."""
    os.makedirs("/run/lendbox-test", exist_ok=True)
    start = random.randrange(210)
    for t in range(210):
        k = (start + t) % 210
        first = 1526 + 64 * k
        fd = os.open(f"/run/lendbox-test/uid.{k}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if any(os.path.exists(f"/run/lendbox/slots/{(first + s) * 65536}") for s in range(64)):
            os.close(fd)
            continue
        return first * 65536, fd
    raise RuntimeError("no free uid range in /run/lendbox-test/uid.*")


class Daemon:
    """One lendboxd on loopback with its own state dir. ``env`` adds environment variables
    (e.g. LENDBOX_FAULTS), ``args`` more command-line arguments."""

    def __init__(self, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None):
        self.state_dir = tempfile.mkdtemp(prefix="lendbox-py-")
        os.chmod(self.state_dir, 0o711)
        self.log_path = self.state_dir + ".log"
        self.args = list(args)
        self.env = dict(env or {})
        # 64 slots of 65536 ids in [10^8, 10^9) (local.uid_count counts slots), claimed
        self.uid_base, self.uid_claim = claim_uid_range()
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self.token = ""
        self.listen = "127.0.0.1:0"
        self.start()

    def start(self) -> None:
        listen = pathlib.Path(self.state_dir, "listen")
        if listen.exists():
            listen.unlink()
        argv = [LENDBOXD, "--state-dir", self.state_dir, "--listen", self.listen,
                "--log-level", "debug", "--set", "lending.sweep_interval_s=1",
                "--set", f"local.uid_base={self.uid_base}", "--set", "local.uid_count=64",
                "--set", f"local.supervise={SUPERVISE}", *self.args]
        env = {k: v for k, v in os.environ.items() if k != "LENDBOX_FAULTS"}
        env.update(self.env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lendboxd exited during startup: {self.tail()}")
            if listen.exists() and listen.read_text().strip():
                self.listen = listen.read_text().strip()  # a restart keeps the port
                self.url = "http://" + self.listen
                try:
                    with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            self.token = pathlib.Path(self.state_dir, "admin.token").read_text().strip()
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"lendboxd never became ready: {self.tail()}")

    def tail(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text()[-3000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None:
            return 0
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def restart(self, sig: int = signal.SIGKILL) -> None:
        """Kill (SIGKILL by default: lent sandboxes and harnesses keep running) and start again
        on the same state dir; the new daemon adopts what runs."""
        self.stop(sig)
        self.start()

    def client(self, token: Optional[str] = None, **kw: Any) -> lendbox.Client:
        return hooked(lendbox.Client(self.url, self.token if token is None else token, **kw))

    def async_client(self, token: Optional[str] = None, **kw: Any) -> lendbox.AsyncClient:
        return hooked(lendbox.AsyncClient(self.url, self.token if token is None else token, **kw))

    def provider(self, token: Optional[str] = None) -> ValidatingProvider:
        return ValidatingProvider(self.url, self.token if token is None else token)

    def cleanup(self) -> None:
        self.stop()
        sandboxes = pathlib.Path(self.state_dir, "sandboxes")
        if sandboxes.is_dir() and any(sandboxes.iterdir()):
            # a test failed half-way: a daemon on the same state dir adopts them, its shutdown
            # sweep stops them
            self.start()
            self.stop()
        # A sanitizer report in the daemon's log (every run of it appends there) fails the test
        # (make asan: an ASan or UBSan error aborts the daemon, a leak is reported at its exit).
        try:
            log = pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            log = ""
        m = SANITIZER_REPORT.search(log)
        if not os.environ.get("LBT_KEEP"):
            shutil.rmtree(self.state_dir, ignore_errors=True)
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
        if self.uid_claim >= 0 and self.proc is None:
            os.close(self.uid_claim)
            self.uid_claim = -1
        if m:
            report = log[m.start():m.start() + 4000]
            raise AssertionError(f"sanitizer report in {self.log_path}:\n{report}")


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    d.cleanup()


@pytest.fixture
def own_daemon():
    """A daemon for one test (restarts, fault injection): call it with args/env."""
    made: List[Daemon] = []

    def make(args: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> Daemon:
        d = Daemon(args, env)
        made.append(d)
        return d

    yield make
    failed: List[AssertionError] = []
    for d in made:
        try:
            d.cleanup()
        except AssertionError as e:  # clean up the others first
            failed.append(e)
    if failed:
        raise failed[0]


def sandbox_dir_exists(d: Daemon, sandbox_id: str) -> bool:
    """Is the sandbox's directory (its workspace and writable layer) still on the host? The
    local provider removes it only once the sandbox is stopped."""
    return pathlib.Path(d.state_dir, "sandboxes", sandbox_id).exists()
