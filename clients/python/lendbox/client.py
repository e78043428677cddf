"""HTTP clients of lendboxd: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

One method per route of docs/api.md (the table is :data:`ROUTES`), each returning the decoded
JSON answer (a ``dict`` shaped as the ``TypedDict`` named in its annotation), raw ``bytes`` for
file downloads, or ``None`` for 204 answers. Errors are raised as :class:`lendbox.errors.LendboxError`
subclasses (status, code, message). Units follow the API: ``*_s`` seconds, ``*_ms``
milliseconds, sizes in bytes, ``*_mib`` mebibytes.

Retries: only routes that are safe to repeat (every GET, ``PUT`` of a file, seed of the same
``task_id``, seed_batch, release, release_all, close, delete, pause, resume) are retried, up to ``retries``
more times, with exponential backoff from ``backoff_s``, on a transport failure (connection
refused or reset, timeout) or a 429 ``overloaded`` / 503 ``draining`` answer. exec, execute,
create and the PTY routes are sent exactly once, except that a 429 ``overloaded`` of create
(refused before anything was made) is retried like a seed's.

A 429 ``overloaded`` with ``Retry-After`` (the daemon's admission control: too many sandboxes
starting; or ``max_sandboxes`` reached) is retried after ``Retry-After`` times a random factor
in [1, 1.5) (jitter, so that refused clients do not come back at once), as often as it comes,
until the next wait would end more than ``retry_overloaded_s`` (default 120) after the call
began: then the :class:`~lendbox.errors.Overloaded` is raised. ``retries=0`` disables every
retry, these too.

Both clients are safe to share between threads (``Client``: one keep-alive connection per
thread, over the standard library's ``http.client``) or tasks (``AsyncClient``: a pool of
keep-alive connections per event loop, over ``aiohttp``). Close them with ``close()`` /
``aclose()`` or use them as (async) context managers.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import functools
import http.client
import json
import os
import random
import select
import socket
import threading
import time
import weakref
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)
from urllib.parse import quote, urlencode, urlsplit

try:  # typing.TypedDict is 3.8+
    from typing import TypedDict
except ImportError:  # pragma: no cover
    from typing_extensions import TypedDict  # type: ignore

try:  # AsyncClient's transport; Client needs only the standard library
    import aiohttp
    import yarl
except ImportError:  # pragma: no cover - aiohttp is a declared dependency
    aiohttp = None  # type: ignore[assignment]

from .errors import LendboxError, Overloaded, TransportError, error_for

__all__ = [
    "Client",
    "AsyncClient",
    "ROUTES",
    "DEFAULT_BASE_URL",
    "Lease",
    "Access",
    "SandboxInfo",
    "ExecResult",
    "Activation",
    "FileContent",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8787"

# --- shapes (docs/api.md; every answer may carry more fields than listed) ---------------------


class Access(TypedDict, total=False):
    """The operate descriptor of a lease: what a harness needs to use the sandbox."""

    sandbox_id: str
    scope: str  # "operate"
    token: str  # the sandbox's operate token (lbo_...)
    base_url: str  # the daemon's URL
    workdir: str  # e.g. "/workspace"


class Lease(TypedDict, total=False):
    """Answer of seed and ``GET /v1/sessions/{rsid}``."""

    resources_session_id: str
    task_id: str
    sandbox_id: str
    state: str  # "lent" (or another record state in ?state= listings)
    provider: str
    image: str
    created_at: str  # RFC 3339 UTC
    expires_at: Optional[str]
    reused: bool
    access: Access
    last_activity_at: Optional[str]  # RFC 3339 UTC; idle_timeout_s counts from it


class SandboxInfo(TypedDict, total=False):
    """Answer of ``GET /v1/sandboxes/{id}``, pause and resume (records of the list add
    ``task_id``, ``stop_reason``, ``stop_attempts``, ``last_error``, ``next_attempt_at``,
    ``updated_at``)."""

    sandbox_id: str
    status: str  # starting|running|paused|stopped|error|unknown
    state: str  # starting|lent|stopping|stopped|failed_seed|stop_failed
    provider: str
    created_at: str
    expires_at: Optional[str]
    resources_session_id: Optional[str]
    last_activity_at: Optional[str]  # GET /v1/sandboxes/{id} of a lent sandbox
    stop_reason: Optional[str]  # GET only: released|ttl|deleted|lost|...; None while it runs
    usage: Dict[str, Any]  # GET only: cpu_s, memory_bytes, memory_peak_bytes, pids, oom_kills,
    # disk_bytes (None where the host cannot tell; all None once stopped)


class ExecResult(TypedDict, total=False):
    """Answer of exec. A non-zero ``return_code`` is a result, not an error; 125 with
    ``error_type`` "timeout" or "sandbox" when no process exit status exists."""

    return_code: int
    stdout: str
    stderr: str
    error_type: Optional[str]  # None|"timeout"|"sandbox"|"oom"
    message: Optional[str]
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int


class Activation(TypedDict, total=False):
    """Answer of execute, close and ``GET …/activation`` (see docs/api.md for each field)."""

    activation_id: str
    state: str
    outcome: Optional[str]
    return_code: Optional[int]
    artifacts: Optional[Dict[str, Optional[Dict[str, str]]]]
    capture_error: Optional[str]
    cleanup: Optional[Dict[str, Any]]
    output_log_bytes: int
    error: Optional[str]
    error_type: Optional[str]
    log: str
    closed: bool


FileContent = Union[str, bytes, Mapping[str, Any]]
"""A file for seed ``files`` / execute ``stage``: text (written as UTF-8), bytes, or the wire
form ``{"base64": str, "mode": int}``."""


class Route(NamedTuple):
    method: str
    pattern: str  # '*' matches one path segment, as in lendboxd's route table
    idempotent: bool


#: Every route the clients call, by method name: (HTTP method, path pattern, safe to repeat).
ROUTES: Dict[str, Route] = {
    "healthz": Route("GET", "/healthz", True),
    "readyz": Route("GET", "/readyz", True),
    "metrics": Route("GET", "/metrics", True),
    "list_sessions": Route("GET", "/v1/sessions", True),
    "get_session": Route("GET", "/v1/sessions/*", True),
    "seed": Route("POST", "/v1/sessions/*/seed", True),
    "release": Route("POST", "/v1/sessions/*/release", True),
    "release_all": Route("POST", "/v1/sessions/release_all", True),
    "seed_batch": Route("POST", "/v1/sessions/seed_batch", True),
    "execute": Route("POST", "/v1/sessions/*/execute", False),
    "close_activation": Route("POST", "/v1/sessions/*/close", True),
    "get_activation": Route("GET", "/v1/sessions/*/activation", True),
    "stop_harness": Route("POST", "/v1/sessions/*/stop_harness", True),
    "create_sandbox": Route("POST", "/v1/sandboxes", False),
    "list_sandboxes": Route("GET", "/v1/sandboxes", True),
    "get_sandbox": Route("GET", "/v1/sandboxes/*", True),
    "delete_sandbox": Route("DELETE", "/v1/sandboxes/*", True),
    "exec": Route("POST", "/v1/sandboxes/*/exec", False),
    "put_file": Route("PUT", "/v1/sandboxes/*/files", True),
    "get_file": Route("GET", "/v1/sandboxes/*/files", True),
    "put_archive": Route("PUT", "/v1/sandboxes/*/archive", True),
    "get_archive": Route("GET", "/v1/sandboxes/*/archive", True),
    "pause": Route("POST", "/v1/sandboxes/*/pause", True),
    "resume": Route("POST", "/v1/sandboxes/*/resume", True),
    "renew": Route("POST", "/v1/sandboxes/*/renew", True),
    "endpoint": Route("GET", "/v1/sandboxes/*/endpoints/*", True),
    "create_pty": Route("POST", "/v1/sandboxes/*/pty", False),
    "pty_output": Route("GET", "/v1/pty/*/output", True),
    "pty_input": Route("POST", "/v1/pty/*/input", False),
    "pty_resize": Route("POST", "/v1/pty/*/resize", True),
    "pty_signal": Route("POST", "/v1/pty/*/signal", False),
    "pty_attach": Route("POST", "/v1/pty/*/attach", False),
    "pty_wait": Route("GET", "/v1/pty/*/wait", True),
    "pty_delete": Route("DELETE", "/v1/pty/*", True),
    "create_context": Route("POST", "/v1/sandboxes/*/contexts", False),
    "run_context": Route("POST", "/v1/contexts/*/run", False),
    "interrupt_context": Route("POST", "/v1/contexts/*/interrupt", True),
    "delete_context": Route("DELETE", "/v1/contexts/*", True),
    "list_images": Route("GET", "/v1/images", True),
    "import_image": Route("POST", "/v1/images", False),
    "delete_image": Route("DELETE", "/v1/images/*", True),
    "snapshot": Route("POST", "/v1/sandboxes/*/snapshot", False),
    "fork": Route("POST", "/v1/sandboxes/*/fork", False),
    "reset": Route("POST", "/v1/sandboxes/*/reset", False),
    "events": Route("GET", "/v1/events", True),
}

# Read timeouts (seconds) of the routes that wait for a provider: a stop is bounded by
# lending.stop_timeout_s (120) and a seed may retry a pending stop first.
_STOP_WAIT_S = 300.0


class _Call(NamedTuple):
    name: str  # key of ROUTES
    path: str
    params: Optional[Dict[str, Any]] = None
    json: Any = None
    content: Optional[bytes] = None
    read_timeout_s: Optional[float] = None  # None: the client's default; math.inf: no limit
    result: str = "json"  # "json" | "bytes" | "none" | "text" | "pty"
    ok: Tuple[int, ...] = (200,)


def _seg(s: str) -> str:
    """One path segment, percent-encoded (ids never contain '/', but do not trust that)."""
    return quote(str(s), safe="")


def _file(v: FileContent) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    return v


def _files(files: Optional[Mapping[str, FileContent]]) -> Optional[Dict[str, Any]]:
    if files is None:
        return None
    return {str(p): _file(v) for p, v in files.items()}


def _body(**fields: Any) -> Dict[str, Any]:
    """A JSON body of the fields that are not None (the daemon's defaults apply to the rest)."""
    return {k: v for k, v in fields.items() if v is not None}


def _merge(body: Dict[str, Any], extra: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if extra:
        body.update(extra)
    return body


class _Routes:
    """The route methods, shared by :class:`Client` and :class:`AsyncClient`.

    Each builds a :class:`_Call` and hands it to ``self._run``, which sends it (blocking, or
    as a coroutine for the async client).
    """

    def _run(self, call: _Call) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    # --- operations ---------------------------------------------------------------------------

    def healthz(self) -> Dict[str, str]:
        """``GET /healthz`` → ``{"status": "ok"}`` while the daemon serves HTTP. No token."""
        return self._run(_Call("healthz", "/healthz"))

    def readyz(self) -> Dict[str, str]:
        """``GET /readyz`` → ``{"status": "ready"}``. Raises :class:`~lendbox.errors.Draining`
        (503) while reconciling at startup, draining or when the state dir is full."""
        return self._run(_Call("readyz", "/readyz"))

    def metrics(self) -> str:
        """``GET /metrics`` → the Prometheus text (names in docs/operations.md)."""
        return self._run(_Call("metrics", "/metrics", result="text"))

    # --- lending (admin) -----------------------------------------------------------------------

    def seed(
        self,
        rsid: str,
        task_id: str,
        *,
        files: Optional[Mapping[str, FileContent]] = None,
        image: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        ttl_s: Optional[float] = None,
        resources: Optional[Mapping[str, Any]] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        ports: Optional[Sequence[int]] = None,
        extra: Optional[Mapping[str, Any]] = None,
    ) -> Lease:
        """``POST /v1/sessions/{rsid}/seed``: lend resources session ``rsid`` a sandbox.

        Args:
            rsid: 1-128 characters of ``[A-Za-z0-9._:-]``.
            task_id: 1-1024 bytes. A repeated seed with the same ``task_id`` returns the same
                sandbox (``reused: True``; nothing else of the request is applied); another
                ``task_id`` raises :class:`~lendbox.errors.Conflict`.
            files: absolute path → text (UTF-8), bytes, or ``{"base64", "mode"}``; written before
                the lease is returned, parents created.
            image: ``"host"`` (default) or an imported image name (404 ``image_not_found``).
            env: applied to every exec of the sandbox.
            ttl_s: lifetime in seconds (lowered to ``lending.max_ttl_s``).
            resources: ``{"cpu": float, "memory_mib": int, "pids": int, "disk_mib": int, ...}``.
            network: ``{"access": "inherit"|"model_only"|"model_and_tools", "model_server": url,
                "tool_servers": [url]}`` (422 when it cannot be enforced).
            labels: stored with the record (``release_all`` filters on them).
            ports: TCP ports for :meth:`endpoint`.
            extra: more body fields, sent as given (fields newer than this client, e.g.
                ``workdir``, ``metadata``, ``ready_timeout_s``, ``provider``, ``idle_timeout_s``,
                ``on_idle``, ``ready_probe``).

        Returns: the lease; ``lease["access"]`` is the operate descriptor for a harness.
        Raises: BadRequest, Conflict, ImageNotFound, Unenforceable, Overloaded, ProviderError,
            Draining (see :mod:`lendbox.errors`).
        """
        body = _body(
            task_id=task_id,
            files=_files(files),
            image=image,
            env=dict(env) if env is not None else None,
            ttl_s=ttl_s,
            resources=dict(resources) if resources is not None else None,
            network=dict(network) if network is not None else None,
            labels=dict(labels) if labels is not None else None,
            ports=list(ports) if ports is not None else None,
        )
        return self._run(
            _Call(
                "seed",
                f"/v1/sessions/{_seg(rsid)}/seed",
                json=_merge(body, extra),
                read_timeout_s=_STOP_WAIT_S,
            )
        )

    def get_session(self, rsid: str) -> Lease:
        """``GET /v1/sessions/{rsid}`` → the session's live lease; NotFound when it has none."""
        return self._run(_Call("get_session", f"/v1/sessions/{_seg(rsid)}"))

    def list_sessions(self, state: Optional[str] = None) -> List[Lease]:
        """``GET /v1/sessions[?state=]`` → the live leases (or the records of ``state``), oldest
        first. Returns the list of the answer's ``sessions``."""
        params = {"state": state} if state else None
        r = self._run(_Call("list_sessions", "/v1/sessions", params=params, result="json:sessions"))
        return r

    def release(self, rsid: str) -> Dict[str, Any]:
        """``POST /v1/sessions/{rsid}/release`` → ``{"released": True, "sandbox_id"}`` or
        ``{"released": False}`` (nothing to stop: safe to repeat). A failed stop raises
        :class:`~lendbox.errors.ProviderError` and the daemon keeps retrying it."""
        return self._run(
            _Call(
                "release",
                f"/v1/sessions/{_seg(rsid)}/release",
                json={},
                read_timeout_s=_STOP_WAIT_S,
            )
        )

    def release_all(self, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """``POST /v1/sessions/release_all`` → ``{"released": [rsid...], "failed": [{"rsid",
        "error"}...]}``: releases every lent session (whose labels include all of ``labels``,
        when given), with the daemon's bounded stop concurrency."""
        body = {"labels": dict(labels)} if labels else {}
        return self._run(
            _Call("release_all", "/v1/sessions/release_all", json=body, read_timeout_s=900.0)
        )

    def seed_batch(self, items: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        """``POST /v1/sessions/seed_batch`` (admin): seed up to 256 sessions in one request.

        Args:
            items: seed bodies, each with its session's ``"rsid"`` and the fields of
                :meth:`seed` as the daemon takes them (``"task_id"``, ``"files"`` as
                ``{path: str | {"base64", "mode"}}``, ``"image"``, ``"labels"``, ...).

        Returns: the answer's ``results``, one per item in order: ``{"rsid", "status": 200,
            "lease"}`` or ``{"rsid", "status", "error": {"code", "message"}}`` — what a single
            seed of that item would answer (409 for a live session of another task_id or an
            rsid an earlier item names, 429 at capacity, 400 for a bad item; ``rsid`` is None
            for an item without a valid one). Items are not retried one by one: send the
            failed ones again.
        Raises: BadRequest when ``items`` is empty, longer than 256 or not a list of objects
            as a whole; Forbidden with an operate token; Draining.
        """
        return self._run(
            _Call(
                "seed_batch",
                "/v1/sessions/seed_batch",
                json={"items": [dict(i) for i in items]},
                read_timeout_s=900.0,
                result="json:results",
            )
        )

    # --- harness activations --------------------------------------------------------------------

    def execute(
        self,
        rsid: str,
        argv: Sequence[str],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        stage: Optional[Mapping[str, FileContent]] = None,
        collect: Optional[Sequence[str]] = None,
        timeout_s: Optional[float] = None,
        close_timeout_s: Optional[float] = None,
        wait: bool = True,
        extra: Optional[Mapping[str, Any]] = None,
    ) -> Activation:
        """``POST /v1/sessions/{rsid}/execute``: run a harness once under the in-sandbox
        supervisor (admin, or the sandbox's operate token).

        With ``wait=True`` (default) the call returns when the harness has ended and been
        collected (``state`` finished|timed_out|failed, ``return_code``, ``artifacts``
        path → ``{"base64"}``|None, ``cleanup``). With ``wait=False`` the daemon answers at once
        (202) with ``{"activation_id", ...}``; poll :meth:`get_activation` with ``wait_ms``.
        ``timeout_s`` defaults to 600, ``close_timeout_s`` to 60 (three cleanup phases).
        The harness's environment carries ``LENDBOX_STOP_REQUEST`` (the stop-request file).

        Raises: NotFound (no lent sandbox), Conflict (already activated, paused), ProviderError
            (cleanup not confirmed), Draining.
        """
        body = _body(
            argv=list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            user=user,
            stage=_files(stage),
            collect=list(collect) if collect is not None else None,
            timeout_s=timeout_s,
            close_timeout_s=close_timeout_s,
        )
        if not wait:
            body["wait"] = False
        return self._run(
            _Call(
                "execute",
                f"/v1/sessions/{_seg(rsid)}/execute",
                json=_merge(body, extra),
                read_timeout_s=float("inf") if wait else None,
                ok=(200, 202),
            )
        )

    def close_activation(self, rsid: str, timeout_s: Optional[float] = None) -> Activation:
        """``POST /v1/sessions/{rsid}/close``: stop the harness (stop request, TERM, KILL of every
        descendant), collect once, release the exec. Idempotent: every close answers the same
        ``{"closed": True, ...}``; ``{"closed": False}`` without an activation. Unconfirmed
        cleanup raises :class:`~lendbox.errors.ProviderError` (a later close retries)."""
        body = _body(timeout_s=timeout_s)
        wait_s = (timeout_s if timeout_s is not None else 60.0) + 120.0
        return self._run(
            _Call(
                "close_activation",
                f"/v1/sessions/{_seg(rsid)}/close",
                json=body,
                read_timeout_s=wait_s,
            )
        )

    def stop_harness(self, rsid: str, timeout_s: Optional[float] = None) -> Activation:
        """``POST /v1/sessions/{rsid}/stop_harness``: stop the running harness (stop request,
        TERM, KILL of every descendant) and wait for its confirmed cleanup, without collecting or
        closing the activation (Gym's ``SandboxSession.stop_harness``)."""
        body = _body(timeout_s=timeout_s)
        wait_s = (timeout_s if timeout_s is not None else 60.0) + 120.0
        return self._run(
            _Call(
                "stop_harness",
                f"/v1/sessions/{_seg(rsid)}/stop_harness",
                json=body,
                read_timeout_s=wait_s,
            )
        )

    def get_activation(
        self, rsid: str, *, log: bool = False, wait_ms: Optional[int] = None
    ) -> Activation:
        """``GET /v1/sessions/{rsid}/activation[?log=1][&wait_ms=]`` → the activation's record:
        ``state`` staging|running|finished|timed_out|failed|closing|closed, the receipt's
        fields, and with ``log`` the output log's tail as text. ``wait_ms`` long-polls: the
        answer comes when the harness has ended or after that many milliseconds."""
        params: Dict[str, Any] = {}
        if log:
            params["log"] = "1"
        if wait_ms is not None:
            params["wait_ms"] = int(wait_ms)
        rt = (wait_ms / 1000.0 + 30.0) if wait_ms else None
        return self._run(
            _Call(
                "get_activation",
                f"/v1/sessions/{_seg(rsid)}/activation",
                params=params or None,
                read_timeout_s=rt,
            )
        )

    # --- sandboxes ----------------------------------------------------------------------------

    def create_sandbox(
        self,
        *,
        image: Optional[str] = None,
        files: Optional[Mapping[str, FileContent]] = None,
        env: Optional[Mapping[str, str]] = None,
        ttl_s: Optional[float] = None,
        resources: Optional[Mapping[str, Any]] = None,
        network: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        ports: Optional[Sequence[int]] = None,
        extra: Optional[Mapping[str, Any]] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes`` (admin): start a sandbox that is lent to no session (Gym's
        ``AsyncSandbox.start``); the same body as :meth:`seed` without ``task_id``. Returns the
        sandbox's record with ``access`` (its operate descriptor). Stop it with
        :meth:`delete_sandbox`. Not retried (a retry would start a second sandbox), except after a
        429 ``overloaded``, which made nothing."""
        body = _body(
            image=image,
            files=_files(files),
            env=dict(env) if env is not None else None,
            ttl_s=ttl_s,
            resources=dict(resources) if resources is not None else None,
            network=dict(network) if network is not None else None,
            labels=dict(labels) if labels is not None else None,
            ports=list(ports) if ports is not None else None,
        )
        return self._run(
            _Call(
                "create_sandbox",
                "/v1/sandboxes",
                json=_merge(body, extra),
                read_timeout_s=_STOP_WAIT_S,
                ok=(200, 201),
            )
        )

    def list_sandboxes(self, state: Optional[str] = None) -> List[SandboxInfo]:
        """``GET /v1/sandboxes[?state=]`` → every record (live and recently stopped), oldest first."""
        params = {"state": state} if state else None
        return self._run(
            _Call("list_sandboxes", "/v1/sandboxes", params=params, result="json:sandboxes")
        )

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """``GET /v1/sandboxes/{id}`` → status (the provider is asked for a lent sandbox) and
        record state. NotFound for an unknown (or purged) id."""
        return self._run(_Call("get_sandbox", f"/v1/sandboxes/{_seg(sandbox_id)}"))

    def delete_sandbox(self, sandbox_id: str) -> Dict[str, Any]:
        """``DELETE /v1/sandboxes/{id}`` (admin) → ``{"deleted": bool, "sandbox_id"}``; stops
        the sandbox whatever its session. ``deleted`` is False when it was already stopped."""
        return self._run(
            _Call(
                "delete_sandbox",
                f"/v1/sandboxes/{_seg(sandbox_id)}",
                read_timeout_s=_STOP_WAIT_S,
            )
        )

    def exec(
        self,
        sandbox_id: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        stdin: Optional[str] = None,
        timeout_s: Optional[float] = None,
        preserve_background_services: Optional[bool] = None,
        encoding: Optional[str] = None,
        exclusive: Optional[bool] = None,
        agent_root: Optional[bool] = None,
    ) -> ExecResult:
        """``POST /v1/sandboxes/{id}/exec``: run ``command`` (``/bin/sh -c``) or ``argv``.

        ``timeout_s`` defaults to 180 s; at the timeout the whole process tree is killed and the
        result is ``return_code`` 125, ``error_type`` "timeout". ``cwd`` defaults to the
        workdir (``/`` when exclusive). ``encoding="base64"`` returns raw output bytes
        base64-encoded. ``exclusive`` stops every other sandbox process first and runs the
        command on the sandbox's base image with the workdir at its path (for grading);
        ``agent_root=True`` (exclusive only) runs it on the sandbox's own root instead, whose
        programs the agent could have replaced. Output is capped per stream
        (``limits.max_output_bytes``, 1 MiB; ``*_truncated`` says so).

        Raises: BadRequest, NotFound (sandbox unknown or not lent), Conflict (paused),
            SandboxLost (its init died outside lendbox's control), Overloaded, ProviderError
            (exec transport). Never retried.
        """
        body = _body(
            command=command,
            argv=list(argv) if argv is not None else None,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            user=user,
            stdin=stdin,
            timeout_s=timeout_s,
            preserve_background_services=preserve_background_services,
            encoding=encoding,
            exclusive=exclusive,
            agent_root=agent_root,
        )
        rt = (timeout_s if timeout_s is not None else 180.0) + 30.0
        return self._run(
            _Call("exec", f"/v1/sandboxes/{_seg(sandbox_id)}/exec", json=body, read_timeout_s=rt)
        )

    def put_file(
        self, sandbox_id: str, path: str, data: Union[bytes, str], mode: Optional[int] = None
    ) -> None:
        """``PUT /v1/sandboxes/{id}/files?path=&mode=``: write ``data`` (bytes; str as UTF-8) at
        absolute ``path`` inside the sandbox, parents created; ``mode`` e.g. ``0o755``."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return self._run(
            _Call(
                "put_file",
                f"/v1/sandboxes/{_seg(sandbox_id)}/files",
                params=params,
                content=content,
                result="none",
                ok=(204,),
            )
        )

    def get_file(self, sandbox_id: str, path: str) -> bytes:
        """``GET /v1/sandboxes/{id}/files?path=`` → the file's bytes. NotFound when missing."""
        return self._run(
            _Call(
                "get_file",
                f"/v1/sandboxes/{_seg(sandbox_id)}/files",
                params={"path": path},
                result="bytes",
            )
        )

    def put_archive(self, sandbox_id: str, path: str, archive: bytes) -> Dict[str, Any]:
        """``PUT /v1/sandboxes/{id}/archive?path=``: extract ``archive`` (a tar, gzip-compressed
        or not, e.g. from :mod:`tarfile`) into the directory ``path`` inside the sandbox (made
        when missing; an existing one is merged into) → ``{"path", "entries", "bytes"}``.
        BadRequest (nothing kept) for a body that is not a tar or an entry that would leave the
        directory (absolute, ``..``, a symlink out, a hard link to no earlier entry, a device
        node); PayloadTooLarge (nothing kept) past the sandbox's storage."""
        return self._run(
            _Call(
                "put_archive",
                f"/v1/sandboxes/{_seg(sandbox_id)}/archive",
                params={"path": path},
                content=bytes(archive),
                read_timeout_s=float("inf"),
            )
        )

    def get_archive(self, sandbox_id: str, path: str) -> bytes:
        """``GET /v1/sandboxes/{id}/archive?path=`` → a tar (bytes) of the directory ``path``:
        directories, regular files and symlinks, names relative to it. NotFound when missing,
        BadRequest when not a directory."""
        return self._run(
            _Call(
                "get_archive",
                f"/v1/sandboxes/{_seg(sandbox_id)}/archive",
                params={"path": path},
                result="bytes",
                read_timeout_s=float("inf"),
            )
        )

    def pause(self, sandbox_id: str) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/pause``: freeze every process (cgroup freezer) → status."""
        return self._run(_Call("pause", f"/v1/sandboxes/{_seg(sandbox_id)}/pause", json={}))

    def resume(self, sandbox_id: str) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/resume``: thaw a paused sandbox → status."""
        return self._run(_Call("resume", f"/v1/sandboxes/{_seg(sandbox_id)}/resume", json={}))

    def renew(self, sandbox_id: str, ttl_s: float) -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/renew``: the sandbox now expires ``ttl_s`` seconds from now
        (lowered to ``lending.max_ttl_s``) → ``{"sandbox_id", "expires_at"}``. Admin or the
        sandbox's operate token.

        Raises: BadRequest (``ttl_s`` <= 0 or not a number), NotFound (unknown, stopped or
            already expired: renewing is no resurrection), Conflict (its session stayed busy).
        """
        return self._run(
            _Call("renew", f"/v1/sandboxes/{_seg(sandbox_id)}/renew", json={"ttl_s": ttl_s})
        )

    def endpoint(self, sandbox_id: str, port: int) -> Dict[str, Any]:
        """``GET /v1/sandboxes/{id}/endpoints/{port}`` → ``{"endpoint": url, "headers": {}}``
        reaching a TCP server on a port declared in the seed's ``ports`` (NotFound otherwise)."""
        return self._run(
            _Call("endpoint", f"/v1/sandboxes/{_seg(sandbox_id)}/endpoints/{int(port)}")
        )

    # --- PTY (a provider without PTY sessions, e.g. docker, answers 501) ------------------------

    def create_pty(
        self,
        sandbox_id: str,
        command: Optional[str] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        rows: int = 24,
        cols: int = 80,
        pty: bool = True,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/pty`` → 201 ``{"session_id"}``. Raises
        :class:`~lendbox.errors.NotImplementedByServer` until the daemon builds PTY sessions."""
        body = _body(command=command, cwd=cwd, env=env, user=user, rows=rows, cols=cols, pty=pty)
        return self._run(
            _Call("create_pty", f"/v1/sandboxes/{_seg(sandbox_id)}/pty", json=body, ok=(200, 201))
        )

    def pty_output(
        self,
        session_id: str,
        since: int = 0,
        *,
        wait_ms: Optional[int] = None,
        stream: Optional[str] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/pty/{sid}/output?since=&wait_ms=&stream=`` → ``{"data": bytes,
        "next_offset": int, "exit_code": int|None}`` (from the X-Next-Offset / X-Exit-Code
        headers)."""
        params = _body(since=since, wait_ms=wait_ms, stream=stream)
        return self._run(
            _Call("pty_output", f"/v1/pty/{_seg(session_id)}/output", params=params, result="pty")
        )

    def pty_input(self, session_id: str, data: Union[bytes, str]) -> None:
        """``POST /v1/pty/{sid}/input``: raw bytes to the terminal."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return self._run(
            _Call(
                "pty_input",
                f"/v1/pty/{_seg(session_id)}/input",
                content=content,
                result="none",
                ok=(200, 204),
            )
        )

    def pty_resize(self, session_id: str, rows: int, cols: int) -> None:
        """``POST /v1/pty/{sid}/resize`` ``{"rows", "cols"}`` → None (204)."""
        return self._run(
            _Call(
                "pty_resize",
                f"/v1/pty/{_seg(session_id)}/resize",
                json={"rows": rows, "cols": cols},
                ok=(200, 204),
            )
        )

    def pty_signal(self, session_id: str, signal: str) -> None:
        """``POST /v1/pty/{sid}/signal`` ``{"signal": "INT"|"TERM"|"KILL"|...}`` → None (204)."""
        return self._run(
            _Call(
                "pty_signal",
                f"/v1/pty/{_seg(session_id)}/signal",
                json={"signal": signal},
                ok=(200, 204),
            )
        )

    def pty_attach(self, session_id: str, takeover: bool = False) -> Dict[str, Any]:
        """``POST /v1/pty/{sid}/attach`` ``{"takeover"}`` (Conflict if held and no takeover)."""
        return self._run(
            _Call(
                "pty_attach",
                f"/v1/pty/{_seg(session_id)}/attach",
                json={"takeover": takeover},
                ok=(200, 204),
            )
        )

    def pty_wait(self, session_id: str, timeout_ms: Optional[int] = None) -> Dict[str, Any]:
        """``GET /v1/pty/{sid}/wait?timeout_ms=`` → ``{"exit_code"}``."""
        params = _body(timeout_ms=timeout_ms)
        rt = (timeout_ms / 1000.0 + 30.0) if timeout_ms else None
        return self._run(
            _Call(
                "pty_wait",
                f"/v1/pty/{_seg(session_id)}/wait",
                params=params or None,
                read_timeout_s=rt,
            )
        )

    def pty_delete(self, session_id: str) -> None:
        """``DELETE /v1/pty/{sid}``: end the session."""
        return self._run(
            _Call("pty_delete", f"/v1/pty/{_seg(session_id)}", result="none", ok=(200, 204))
        )

    # --- code contexts (a provider without PTY sessions, e.g. docker, answers 501) ---------------

    def create_context(self, sandbox_id: str, language: str = "python") -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/contexts`` → 201 ``{"context_id", "language"}``: a Python
        interpreter in the sandbox that keeps its state between runs (and across a daemon
        restart). Unenforceable (422) when the image has no ``python3``."""
        return self._run(
            _Call(
                "create_context",
                f"/v1/sandboxes/{_seg(sandbox_id)}/contexts",
                json={"language": language},
                ok=(201,),
                read_timeout_s=90.0,
            )
        )

    def run_context(
        self, context_id: str, code: str, *, timeout_s: Optional[float] = None
    ) -> Dict[str, Any]:
        """``POST /v1/contexts/{cid}/run`` ``{"code", "timeout_s"}`` → ``{"stdout", "stderr",
        "result", "error", "duration_ms"}``: ``result`` is the repr of a last expression (or
        None), ``error`` None or ``{"name", "value", "traceback"}``. Past ``timeout_s`` (default
        60) the run is interrupted (``error["name"] == "KeyboardInterrupt"``) and the context
        lives on. Conflict while another run of the context is under way."""
        rt = (timeout_s if timeout_s is not None else 60.0) + 30.0
        return self._run(
            _Call(
                "run_context",
                f"/v1/contexts/{_seg(context_id)}/run",
                json=_body(code=code, timeout_s=timeout_s),
                read_timeout_s=rt,
            )
        )

    def interrupt_context(self, context_id: str) -> Dict[str, Any]:
        """``POST /v1/contexts/{cid}/interrupt``: KeyboardInterrupt in the run under way (nothing
        between runs) → ``{"context_id"}``."""
        return self._run(
            _Call("interrupt_context", f"/v1/contexts/{_seg(context_id)}/interrupt", json={})
        )

    def delete_context(self, context_id: str) -> None:
        """``DELETE /v1/contexts/{cid}``: end the context (its interpreter is killed)."""
        return self._run(
            _Call(
                "delete_context",
                f"/v1/contexts/{_seg(context_id)}",
                result="none",
                ok=(204,),
            )
        )

    # --- images (admin) -----------------------------------------------------------------------

    def list_images(self) -> List[Dict[str, Any]]:
        """``GET /v1/images`` → ``[{"name", "digest", "size_bytes", "created_at"}...]``."""
        return self._run(_Call("list_images", "/v1/images", result="json:images"))

    def import_image(self, name: str, archive: bytes) -> Dict[str, Any]:
        """``POST /v1/images?name=`` with a ``docker save`` / OCI archive. The daemon answers
        501 until uploads are built (use ``lendboxd image import`` on its host)."""
        return self._run(
            _Call(
                "import_image",
                "/v1/images",
                params={"name": name},
                content=bytes(archive),
                ok=(200, 201),
                read_timeout_s=float("inf"),
            )
        )

    def delete_image(self, name: str) -> None:
        """``DELETE /v1/images/{name}`` → None (204). Conflict while a live sandbox uses it."""
        return self._run(
            _Call("delete_image", f"/v1/images/{_seg(name)}", result="none", ok=(200, 204))
        )

    def snapshot(
        self, sandbox_id: str, name: str, labels: Optional[Dict[str, str]] = None
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/snapshot`` (admin) → the new image (201): ``name``,
        ``digest``, ``size_bytes``, ``created_at``, ``kind`` ("snapshot"), ``base``,
        ``source_sandbox_id``, ``labels`` (kept with the image, listed by ``list_images``). The
        sandbox's writable root layer and workdir, captured while it
        is frozen; seed it with ``image=name``. Conflict for a name in use; NotImplementedByServer (501)
        on a provider without snapshots. Not retried (a retry after a lost answer would 409)."""
        body: Dict[str, Any] = {"name": name}
        if labels is not None:
            body["labels"] = labels
        return self._run(
            _Call(
                "snapshot",
                f"/v1/sandboxes/{_seg(sandbox_id)}/snapshot",
                json=body,
                ok=(201,),
                read_timeout_s=_STOP_WAIT_S,
            )
        )

    def fork(
        self,
        sandbox_id: str,
        sessions: List[str],
        task_id: Optional[str] = None,
        labels: Optional[Dict[str, str]] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/fork`` (admin) → ``{"children": [...]}``, one per session in
        order: ``{"rsid", "status": 200, "lease"}`` or ``{"rsid", "status", "error": {"code",
        "message"}}`` (409 for a session that has a live sandbox, 429 at capacity). Each session
        gets a new sandbox whose filesystem is the parent's at the call (one implicit snapshot),
        with the parent's spec; processes are not copied. ``task_id`` and ``labels`` replace the
        parent's. BadRequest for 1 > len(sessions) > limits.max_fork, duplicates or invalid ids;
        NotImplementedByServer (501) on a provider without snapshots. Not retried (a retry after
        a lost answer would find every session live: 409)."""
        body: Dict[str, Any] = {"sessions": list(sessions)}
        if task_id is not None:
            body["task_id"] = task_id
        if labels is not None:
            body["labels"] = labels
        return self._run(
            _Call(
                "fork",
                f"/v1/sandboxes/{_seg(sandbox_id)}/fork",
                json=body,
                ok=(200,),
                read_timeout_s=_STOP_WAIT_S,
            )
        )


    # --- the event feed ------------------------------------------------------------------------

    def events(
        self,
        since: int = 0,
        *,
        wait_ms: Optional[int] = None,
        rsid: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        types: Optional[Sequence[str]] = None,
        limit: Optional[int] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/events`` (admin): the events after seq ``since`` → ``{"events": [{"seq",
        "time", "type", "sandbox_id", "rsid", "task_id", "labels", "data"}], "next": seq}``
        (``next``: the last seq returned, or ``since``). ``wait_ms`` (at most 60000) long-polls
        until an event comes; ``rsid``, ``sandbox_id`` and ``types`` filter; ``limit`` (default
        1000, at most 10000) bounds one answer.

        Raises: BadRequest (a bad parameter), Forbidden (an operate token).
        """
        params: Dict[str, Any] = {
            "since": int(since),
            "wait_ms": None if wait_ms is None else int(wait_ms),
            "rsid": rsid,
            "sandbox_id": sandbox_id,
            "types": None if types is None else ",".join(types),
            "limit": None if limit is None else int(limit),
        }
        return self._run(
            _Call(
                "events",
                "/v1/events",
                params=params,
                read_timeout_s=(wait_ms or 0) / 1000.0 + self.timeout_s,  # type: ignore[attr-defined]
            )
        )

    def reset(self, sandbox_id: str, snapshot: Optional[str] = None) -> Lease:
        """``POST /v1/sandboxes/{id}/reset`` (admin) → the lease (200): the same ``sandbox_id``,
        session and ``expires_at``, a new ``access.token`` (the old one answers 401). The
        sandbox is torn down and made again as it was seeded (or from ``snapshot``, a snapshot
        of the same base image): no process, file, IPC object or socket of before is left, and
        the seed's files are written again. NotFound for an unknown sandbox or snapshot,
        Conflict for a snapshot of another base, NotImplementedByServer (501) on a provider
        without resets, ProviderError (502) when the reset failed (the sandbox was stopped,
        reason ``reset_failed``). Not retried (a retry would reset again)."""
        body: Dict[str, Any] = {}
        if snapshot is not None:
            body["snapshot"] = snapshot
        return self._run(
            _Call(
                "reset",
                f"/v1/sandboxes/{_seg(sandbox_id)}/reset",
                json=body,
                read_timeout_s=_STOP_WAIT_S,
            )
        )


class _Response:
    """One answer: status, reason, headers (case-insensitive ``get``) and the whole body."""

    __slots__ = ("status_code", "reason_phrase", "headers", "content")

    def __init__(self, status_code: int, reason_phrase: str, headers: Any, content: bytes):
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def _decode(call: _Call, resp: _Response) -> Any:
    if resp.status_code not in call.ok:
        _raise_for(resp)
    kind = call.result
    if kind == "none" or resp.status_code == 204:  # 204 has no body (pty resize and signal)
        return None
    if kind == "bytes":
        return resp.content
    if kind == "text":
        return resp.text
    if kind == "pty":
        code = resp.headers.get("X-Exit-Code")
        return {
            "data": resp.content,
            "next_offset": int(resp.headers.get("X-Next-Offset", "0")),
            "exit_code": int(code) if code is not None else None,
        }
    data = resp.json()
    if kind.startswith("json:"):
        return data[kind[5:]]
    return data


def _raise_for(resp: _Response) -> None:
    rid = resp.headers.get("X-Request-Id")
    code, message = "http_%d" % resp.status_code, resp.reason_phrase or "error"
    try:
        err = resp.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    except Exception:  # not the documented body (a proxy's answer): keep status and text
        if resp.text:
            message = resp.text[:500]
    e = error_for(resp.status_code, code, message, rid)
    if isinstance(e, Overloaded):
        e.retry_after_s = _retry_after_s(resp.headers.get("Retry-After"))
    raise e


def _retry_after_s(value: Optional[str]) -> Optional[float]:
    """A ``Retry-After`` of whole seconds as a float; None when absent or not seconds."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


_RETRY_STATUSES = (429, 503)


def _should_retry(call: _Call, exc: LendboxError) -> bool:
    if not ROUTES[call.name].idempotent:
        return False
    return isinstance(exc, TransportError) or exc.status in _RETRY_STATUSES


def _retry_delay(
    client: "_Base", call: _Call, exc: LendboxError, attempt: int, started: float
) -> Tuple[Optional[float], bool]:
    """How long to wait before the next attempt of call after exc (None: raise it), and whether
    that attempt counts against ``retries`` (a wait a ``Retry-After`` asked for does not: those
    are bounded by ``retry_overloaded_s`` instead)."""
    if client.retries == 0:
        return None, False
    after = getattr(exc, "retry_after_s", None)
    if (
        isinstance(exc, Overloaded)
        and after is not None
        and (ROUTES[call.name].idempotent or call.name == "create_sandbox")
    ):
        delay = after * (1.0 + 0.5 * random.random())
        if time.monotonic() + delay - started > client.retry_overloaded_s:
            return None, False
        return delay, False
    if attempt >= client.retries or not _should_retry(call, exc):
        return None, False
    return client.backoff_s * (2**attempt), True


def _query_value(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    return str(v)


class _Request(NamedTuple):
    """A call ready for the wire: method, target (path and query), body, headers, timeout."""

    method: str
    target: str  # path (with the base URL's path prefix) and query string
    body: Optional[bytes]
    headers: Mapping[str, str]
    read_timeout_s: Optional[float]  # None: no limit
    idempotent: bool


class _Base(_Routes):
    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        retry_overloaded_s: float = 120.0,
        headers: Optional[Mapping[str, str]] = None,
    ):
        self.base_url = (base_url or os.environ.get("LENDBOX_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("LENDBOX_TOKEN")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = max(0, int(retries))
        self.backoff_s = backoff_s
        self.retry_overloaded_s = max(0.0, float(retry_overloaded_s))
        u = urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url must be http(s)://HOST[:PORT][/PREFIX], not {base_url!r}")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._prefix = u.path.rstrip("/")
        h = {"User-Agent": "lendbox-python/0.1"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if headers:
            h.update(headers)
        self._headers = h
        self._json_headers = {**h, "Content-Type": "application/json"}
        self._bytes_headers = {**h, "Content-Type": "application/octet-stream"}
        # Called with (method, path, answer) for every answer received, before it is decoded
        # (the tests validate answers against docs/openapi.yaml with it). Not public API.
        self._on_response: Optional[Callable[[str, str, _Response], None]] = None

    def _read_timeout_s(self, call: _Call) -> Optional[float]:
        rt = self.timeout_s if call.read_timeout_s is None else call.read_timeout_s
        if rt == float("inf"):
            return None
        if call.read_timeout_s is not None:
            rt = max(rt, self.timeout_s)
        return rt

    def _prepare(self, call: _Call) -> _Request:
        route = ROUTES[call.name]
        target = self._prefix + call.path
        if call.params:
            target += "?" + urlencode(
                [(k, _query_value(v)) for k, v in call.params.items() if v is not None]
            )
        if call.json is not None:
            body: Optional[bytes] = json.dumps(call.json, separators=(",", ":")).encode("utf-8")
            headers = self._json_headers
        elif call.content is not None:
            body, headers = call.content, self._bytes_headers
        else:
            body, headers = None, self._headers
        if body is None and route.method in ("POST", "PUT"):
            body = b""  # Content-Length: 0
        return _Request(
            route.method, target, body, headers, self._read_timeout_s(call), route.idempotent
        )

    def _answer(self, call: _Call, req: _Request, resp: _Response) -> Any:
        if self._on_response is not None:
            self._on_response(req.method, req.target.split("?", 1)[0], resp)
        return _decode(call, resp)


def _has_input(sock: socket.socket) -> bool:
    """Is a kept-alive socket readable before a request was sent? Then the server closed it
    (EOF) or sent something unasked: either way it cannot carry the next request."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(0))


class Client(_Base):
    """Blocking client of lendboxd.

    Each thread that calls it uses its own keep-alive HTTP/1.1 connection (the standard
    library's ``http.client``), opened on its first call. A kept-alive connection the daemon has
    closed (idle timeout, restart) is noticed before a request is sent and replaced; one that
    breaks while a request is in flight is re-dialled at once for idempotent routes only
    (then the usual retries apply), never for exec, execute, create or the PTY writes.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8787"``; default ``$LENDBOX_URL``, else that.
        token: the admin token, or a sandbox's operate token (then only that sandbox's routes
            work; the rest raise Forbidden); default ``$LENDBOX_TOKEN``.
        timeout_s: default per-request timeout in seconds (routes that wait for a sandbox
            stop, exec or harness get longer read timeouts derived from their own bounds).
        connect_timeout_s: TCP connect timeout in seconds.
        retries: extra attempts of idempotent routes (see the module docs); 0 disables.
        backoff_s: first retry delay in seconds, doubled for each later one.
        retry_overloaded_s: longest time in seconds a call keeps retrying 429 ``overloaded``
            answers as their ``Retry-After`` says (see the module docs); 0: raise at once.
        headers: extra headers for every request (e.g. ``X-Request-Id``).

    Raises ValueError when ``base_url`` is not an http(s) URL.
    """

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, **kw: Any):
        super().__init__(base_url, token, **kw)
        self._local = threading.local()
        # every connection a thread opened (weakly: one dies with its thread), for close()
        self._conns: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()
        self._conns_lock = threading.Lock()

    def close(self) -> None:
        """Close every thread's connection (the route ``POST …/close`` is
        :meth:`close_activation`). A later call opens a new one."""
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPConnection
            if self._scheme == "https":
                cls = http.client.HTTPSConnection
            conn = cls(self._host, self._port, timeout=self.connect_timeout_s)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.add(conn)
        return conn

    def iter_events(
        self,
        since: int = 0,
        *,
        wait_ms: int = 30000,
        rsid: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        types: Optional[Sequence[str]] = None,
    ) -> Iterator[Dict[str, Any]]:
        """Every event after seq ``since``, then each new one as it comes, forever: long-polls
        ``GET /v1/events`` (``wait_ms`` each) and resumes from the last seq it yielded, also
        after a transport error or a restart of the daemon (the feed is durable). Filters as
        :meth:`events`."""
        while True:
            try:
                page = self.events(
                    since, wait_ms=wait_ms, rsid=rsid, sandbox_id=sandbox_id, types=types
                )
            except TransportError:
                time.sleep(max(self.backoff_s, 0.1))  # the daemon restarts: read on after
                continue
            for ev in page["events"]:
                since = ev["seq"]
                yield ev
            since = max(since, int(page["next"]))

    def _exchange(self, req: _Request) -> _Response:
        conn = self._connection()
        while True:
            reused = conn.sock is not None
            if reused and _has_input(conn.sock):
                conn.close()
                reused = False
            try:
                if conn.sock is None:
                    conn.timeout = self.connect_timeout_s
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.sock.settimeout(req.read_timeout_s)
                # headers and a bytes body leave in one send
                conn.request(req.method, req.target, body=req.body, headers=req.headers)
                r = conn.getresponse()
                content = r.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and req.idempotent and not isinstance(e, socket.timeout):
                    continue  # the kept-alive connection broke: once more on a new one
                raise TransportError(f"{req.method} {req.target}: {e!r}") from e
            return _Response(r.status, r.reason, r.headers, content)

    def _run(self, call: _Call) -> Any:
        req = self._prepare(call)
        attempt, started = 0, time.monotonic()
        while True:
            try:
                return self._answer(call, req, self._exchange(req))
            except LendboxError as e:
                delay, counted = _retry_delay(self, call, e, attempt, started)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt += counted


def _close_session_now(session: Any) -> None:
    """Close an aiohttp session without waiting on its event loop, which may be closed, not
    running, or another thread's: aiohttp's close marks the connector closed and closes its
    transports at once (on a closed loop it only forgets them). Should a later aiohttp's close
    wait for something, the wait is abandoned: the connector is closed by then."""
    if session.closed:
        return
    coro = session.close()
    try:
        coro.send(None)
    except StopIteration:
        return
    except Exception:  # closing at exit or in a finalizer: nothing to report to
        pass
    coro.close()


async def _close_at_loop_end(session: Any) -> AsyncIterator[None]:
    """Started once (to its ``yield``) on the session's loop, it is one of the loop's async
    generators: ``asyncio.run`` (``loop.shutdown_asyncgens()``) closes it, and with it the
    session, while the loop still runs, before it closes the loop."""
    try:
        yield
    finally:
        if not session.closed:
            await session.close()


def _step(awaitable: Any) -> None:
    """Run an awaitable that does not suspend to its end, here (see :func:`_close_at_loop_end`)."""
    try:
        awaitable.send(None)
    except StopIteration:
        return
    except Exception:  # a finalizer or the interpreter's exit: nothing to report to
        return
    awaitable.close()


# Every AsyncClient that has opened a session, for the interpreter's exit (weakly: a client that
# goes closes its own sessions).
_OPEN_ASYNC_CLIENTS: "weakref.WeakSet[AsyncClient]" = weakref.WeakSet()


@atexit.register
def _close_async_clients_at_exit() -> None:
    for c in list(_OPEN_ASYNC_CLIENTS):
        c._close_now()


class AsyncClient(_Base):
    """asyncio client of lendboxd: the same methods as :class:`Client` (and the same arguments),
    each a coroutine function. Requests go through an ``aiohttp`` session with a pool of
    keep-alive connections (at most 100), one session per event loop the client is used on,
    made on the first call in that loop. ``aclose()`` closes the pools; so does the client's
    end (garbage collection) and the interpreter's exit, so a program that never calls
    ``aclose()`` gets no aiohttp "Unclosed client session" / "Unclosed connector" warning."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None, **kw: Any):
        if aiohttp is None:
            raise ImportError("lendbox.AsyncClient needs aiohttp (Debian: python3-aiohttp)")
        super().__init__(base_url, token, **kw)
        # one session (connection pool) per event loop the client is used on
        self._sessions: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        # every session made and not yet closed, held strongly: a loop that is gone (asyncio.run
        # returned) drops its key above, and its session must still be closed, not leaked
        self._open: List[Tuple[Any, Any]] = []  # (loop, session)
        # (loop, _close_at_loop_end of its session), held strongly: the loop holds it weakly
        self._closers: List[Tuple[Any, Any]] = []
        self._origin = f"{self._scheme}://{self._host}:{self._port}"

    async def aclose(self) -> None:
        """Close the connection pools (the current loop's at once; another loop's is closed in
        that loop if it still runs, else here and now)."""
        current = asyncio.get_running_loop()
        for loop, session in list(self._sessions.items()):
            if session.closed:
                continue
            if loop is current:
                await session.close()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(session.close(), loop)
        self._sessions = weakref.WeakKeyDictionary()
        self._close_now()

    def _close_now(self) -> None:
        """Close every session of the client at once, whatever its loop's state: on its loop
        when that is open and nothing runs (so the sockets close too), else without it (see
        :func:`_close_session_now`). Safe to repeat."""
        sessions, self._open = self._open, []
        closers, self._closers = self._closers, []
        here = asyncio._get_running_loop()
        foreign = set()
        for loop, session in sessions:
            if session.closed:
                continue
            if loop.is_running() and loop is not here:
                # another thread's running loop: its transports are touched only there
                foreign.add(loop)
                try:
                    loop.call_soon_threadsafe(_close_session_now, session)
                except RuntimeError:  # closed meanwhile
                    _close_session_now(session)
                continue
            if here is None and not loop.is_closed() and not loop.is_running():
                try:
                    loop.run_until_complete(session.close())
                except Exception:
                    pass
            _close_session_now(session)
        for loop, agen in closers:
            if loop not in foreign:  # (there the loop finalizes it when it goes)
                _step(agen.aclose())
        _OPEN_ASYNC_CLIENTS.discard(self)

    def __del__(self) -> None:
        try:
            self._close_now()
        except Exception:  # a finalizer: nothing to report to
            pass

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        s = self._sessions.get(loop)
        if s is None or s.closed:
            s = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=100),
                cookie_jar=aiohttp.DummyCookieJar(),  # lendboxd sets no cookies
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
            )
            self._sessions[loop] = s
            self._open = [(lp, o) for lp, o in self._open if not o.closed] + [(loop, s)]
            closer = _close_at_loop_end(s)
            _step(closer.asend(None))  # to its yield: the loop now knows it
            self._closers.append((loop, closer))
            _OPEN_ASYNC_CLIENTS.add(self)
        return s

    async def _exchange(self, req: _Request) -> _Response:
        session = self._session()
        url = yarl.URL(self._origin + req.target, encoded=True)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.connect_timeout_s, sock_read=req.read_timeout_s
        )
        again = req.idempotent
        while True:
            try:
                async with session.request(
                    req.method, url, data=req.body, headers=req.headers, timeout=timeout,
                    allow_redirects=False,
                ) as r:
                    content = await r.read()
                    return _Response(r.status, r.reason or "", r.headers, content)
            except aiohttp.ClientConnectorError as e:  # no connection was made
                raise TransportError(f"{req.method} {req.target}: {e!r}") from e
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                # a kept-alive connection the daemon closed: once more on a new one
                if again:
                    again = False
                    continue
                raise TransportError(f"{req.method} {req.target}: {e!r}") from e
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise TransportError(f"{req.method} {req.target}: {e!r}") from e

    async def _run(self, call: _Call) -> Any:  # type: ignore[override]
        req = self._prepare(call)
        attempt, started = 0, time.monotonic()
        while True:
            try:
                return self._answer(call, req, await self._exchange(req))
            except LendboxError as e:
                delay, counted = _retry_delay(self, call, e, attempt, started)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt += counted


async def _aiter_events(
    self: "AsyncClient",
    since: int = 0,
    *,
    wait_ms: int = 30000,
    rsid: Optional[str] = None,
    sandbox_id: Optional[str] = None,
    types: Optional[Sequence[str]] = None,
) -> AsyncIterator[Dict[str, Any]]:
    """Every event after seq ``since``, then each new one as it comes, forever (an async
    iterator): as :meth:`Client.iter_events`."""
    while True:
        try:
            page = await self.events(
                since, wait_ms=wait_ms, rsid=rsid, sandbox_id=sandbox_id, types=types
            )
        except TransportError:
            await asyncio.sleep(max(self.backoff_s, 0.1))  # the daemon restarts: read on after
            continue
        for ev in page["events"]:
            since = ev["seq"]
            yield ev
        since = max(since, int(page["next"]))


AsyncClient.iter_events = _aiter_events  # type: ignore[attr-defined]


def _make_async(name: str) -> Callable[..., Any]:
    sync = getattr(_Routes, name)

    @functools.wraps(sync)
    async def method(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
        return await sync(self, *args, **kwargs)

    return method


# Every route method of AsyncClient is a real coroutine function (inspect.iscoroutinefunction).
for _name in ROUTES:
    setattr(AsyncClient, _name, _make_async(_name))
del _name
