"""NeMo Gym's sandbox classes, backed by lendboxd.

A resources server or agent written against NeMo Gym's sandbox API runs on lendbox by changing
its imports to this module::

    from lendbox.gym import AsyncSandbox, Sandbox, SandboxSpec, LentSandboxes, SandboxSession

The classes keep NeMo Gym's names, argument names and order, defaults (``timeout_s=180``),
async-ness and result conventions (``return_code`` 125 = :data:`SANDBOX_RUNTIME_RETURN_CODE`
with ``error_type`` "timeout" or "sandbox" when no process exit status exists):

* :class:`AsyncSandbox` / :class:`Sandbox` (``nemo_gym.sandbox``): start, exec, upload,
  download, status, stop, pause, resume, renew, endpoint, serialize/connect, disconnect, pty.
  :class:`LendboxProvider` is a :class:`RenewableProvider` (lifetimes renewed from now).
* :class:`LentSandboxes` (``nemo_gym.server_runtime.sandbox_lending``): lend, get, release,
  release_all, network_access, model_server, tool_servers.

lendbox's extensions (not in NeMo Gym): ``snapshot``, ``fork`` and ``reset`` on
:class:`AsyncSandbox` (and ``snapshot``/``reset`` on :class:`Sandbox`), ``fork`` and ``reset`` on
:class:`LentSandboxes`, the provider protocols :class:`SnapshotProvider`,
:class:`ForkableProvider` and :class:`ResettableProvider` (docs/rl-recipe.md shows them in use).
* :class:`SandboxSession` (``nemo_gym.agent_utils.sandbox_session``): execute, close,
  stop_harness, read_output_log, stop_request_path.

**Provider.** Wherever NeMo Gym takes a provider (``AsyncSandbox(provider, spec)``,
``LentSandboxes(sandbox_provider, ...)``), this module takes ``"lendbox"``, a mapping
``{"name": "lendbox", "base_url": ..., "token": ...}`` (or Gym's single-key form
``{"lendbox": {"base_url": ..., "token": ...}}``), or a :class:`LendboxProvider`. A missing
``base_url`` / ``token`` falls back to the ``LENDBOX_URL`` / ``LENDBOX_TOKEN`` environment
variables (then ``http://127.0.0.1:8787``). The token is the daemon's admin token, or for an
agent holding an operate descriptor, nothing at all: the descriptor carries its token.

**Errors.** HTTP failures raise :class:`lendbox.errors.LendboxError` subclasses (status, code,
message): e.g. :class:`~lendbox.errors.Unenforceable` (422) for a ``gpu`` or a network policy
the daemon cannot enforce, :class:`~lendbox.errors.ProviderError` (502) when a sandbox cannot
start or stop. Facade misuse raises NeMo Gym's errors (RuntimeError "Sandbox has not been
started", ValueError for a bad port, ...).

**Differences from NeMo Gym** (documented, deliberate): a failed ``stop()`` can be retried on
the same object (the daemon keeps the record and retries too); ``SandboxSpec.files`` are written
by the daemon before ``start()`` returns (a failure stops the sandbox, nothing is left);
``SandboxResources.disk_gib`` becomes ``resources.disk_mib``; ``entrypoint`` is refused by the
local provider (422); the harness supervisor is lendbox's own (``SandboxCommand.python`` is not
used).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import enum
import logging
import os
import pathlib
import threading
import uuid
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Generic,
    List,
    Literal,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    runtime_checkable,
)

from .client import AsyncClient
from .errors import (
    BadRequest,
    Draining,
    LendboxError,
    MethodNotAllowed,
    NotFound,
    TransportError,
    error_for,
)

__all__ = [
    "SANDBOX_RUNTIME_RETURN_CODE",
    "SANDBOX_PTY_RUNTIME_RETURN_CODE",
    "SYNC_OPERATION_TIMEOUT_S",
    "SYNC_LOOP_CLOSE_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "SHUTDOWN_STOP_CONCURRENCY",
    "LentSandboxNetworkAccess",
    "SandboxResources",
    "SandboxSpec",
    "SandboxConfig",
    "SandboxExecResult",
    "ExecResult",
    "SandboxStatus",
    "SandboxEndpoint",
    "SandboxHandle",
    "SandboxCommand",
    "DirectSandboxConnection",
    "SandboxAccess",
    "LendboxProvider",
    "RenewableProvider",
    "SnapshotProvider",
    "ForkableProvider",
    "ResettableProvider",
    "ForkedSandbox",
    "AsyncSandbox",
    "Sandbox",
    "SandboxPty",
    "LentSandboxes",
    "SandboxSession",
]

LOG = logging.getLogger(__name__)

#: return_code of a result without a process exit status (timeout, sandbox runtime failure).
SANDBOX_RUNTIME_RETURN_CODE = 125
SANDBOX_PTY_RUNTIME_RETURN_CODE = 125
#: Longest a :class:`Sandbox` (sync) call waits for its operation, seconds.
SYNC_OPERATION_TIMEOUT_S = 3600.0
#: Longest :meth:`Sandbox.stop` waits for the sync loop to close, seconds.
SYNC_LOOP_CLOSE_TIMEOUT_S = 5.0
#: Longest a :class:`LentSandboxes` stop is waited for, seconds (the daemon finishes it anyway).
STOP_TIMEOUT_S = 120.0
#: Stops in flight during :meth:`LentSandboxes.release_all` (the daemon's stop_concurrency).
SHUTDOWN_STOP_CONCURRENCY = 64

LentSandboxNetworkAccess = Literal["inherit", "model_only", "model_and_tools"]

T = TypeVar("T")
Artifacts = TypeVar("Artifacts")

_POOL_LABEL = "lendbox.gym/pool"


# --- data model (NeMo Gym's, field order kept) -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SandboxResources:
    """Resource limits. ``cpu`` in CPUs (fractional), ``memory_mib`` MiB, ``disk_gib`` GiB (sent
    as ``disk_mib`` = ×1024), ``gpu`` count and ``gpu_type`` (the local provider has no GPUs: a
    ``gpu`` > 0 or a ``gpu_type`` is refused with 422), and lendbox's ``pids`` (process count)."""

    cpu: Optional[float] = None
    memory_mib: Optional[int] = None
    disk_gib: Optional[int] = None
    gpu: Optional[int] = None
    gpu_type: Optional[str] = None
    pids: Optional[int] = None

    @classmethod
    def from_mapping(cls, value: Union["SandboxResources", Mapping[str, Any], None]) -> "SandboxResources":
        """Coerce a mapping (``{"cpu": "0.5", "memory_mib": "4096"}``); unknown keys → ValueError."""
        if value is None:
            return cls()
        if isinstance(value, SandboxResources):
            return value
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"Unknown sandbox resource keys: {unknown}; expected keys: {sorted(known)}"
            )
        conv = {"cpu": float, "memory_mib": int, "disk_gib": int, "gpu": int, "gpu_type": str,
                "pids": int}
        return cls(**{k: (None if v is None else conv[k](v)) for k, v in value.items()})

    def to_api(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.cpu is not None:
            out["cpu"] = self.cpu
        if self.memory_mib is not None:
            out["memory_mib"] = self.memory_mib
        if self.pids is not None:
            out["pids"] = self.pids
        if self.disk_gib is not None:
            out["disk_mib"] = int(self.disk_gib) * 1024
        if self.gpu is not None:
            out["gpu"] = self.gpu
        if self.gpu_type is not None:
            out["gpu_type"] = self.gpu_type
        return out


def _ports(value: Any) -> Tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise TypeError("SandboxSpec.ports must be a list or tuple of TCP ports")
    out = []
    for p in value:
        if isinstance(p, bool) or isinstance(p, float):
            raise ValueError(f"Invalid sandbox TCP port: {p!r}")
        try:
            n = int(p)
        except (TypeError, ValueError):
            raise ValueError(f"Invalid sandbox TCP port: {p!r}") from None
        if not 1 <= n <= 65535:
            raise ValueError(f"Sandbox TCP port {n} must be between 1 and 65535")
        if n in out:
            raise ValueError(f"Duplicate sandbox TCP port: {n}")
        out.append(n)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """What to start (NeMo Gym's ``SandboxSpec``, same field order).

    image: ``"host"`` or an image imported into lendboxd (None: the daemon's default).
    ttl_s: lifetime in seconds, enforced by the daemon. ready_timeout_s: start deadline, s.
    workdir: the private writable directory and default ``cwd`` (daemon default
    ``/workspace``). env: applied to every exec. files: absolute path → text, written before
    ``start()`` returns. metadata: labels. resources: :class:`SandboxResources` or mapping.
    entrypoint: refused by the local provider (422). provider_options: lendbox's own keys,
    ``provider`` (a provider name configured in the daemon), ``network``
    (``{"access", "model_server", "tool_servers"}``) and ``ready_probe`` (``{"command",
    "interval_ms"}``: the start returns only once the command exits 0 in the sandbox, else
    ProviderError at ``ready_timeout_s``); others → ValueError. ports: TCP ports for
    :meth:`AsyncSandbox.endpoint`.
    """

    image: Optional[str] = None
    ttl_s: Optional[float] = None
    ready_timeout_s: Optional[float] = None
    workdir: Optional[str] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resources: Any = dataclasses.field(default_factory=SandboxResources)
    entrypoint: Optional[Sequence[str]] = None
    provider_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    ports: Any = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", SandboxResources.from_mapping(self.resources))
        object.__setattr__(self, "ports", _ports(self.ports))

    def to_api(self) -> Dict[str, Any]:
        """The body of ``POST /v1/sandboxes`` (and the spec part of a seed)."""
        body: Dict[str, Any] = {}
        for k in ("image", "ttl_s", "ready_timeout_s", "workdir"):
            v = getattr(self, k)
            if v is not None:
                body[k] = v
        if self.env:
            body["env"] = dict(self.env)
        if self.files:
            body["files"] = {p: _file_content(v) for p, v in self.files.items()}
        if self.metadata:
            body["labels"] = dict(self.metadata)  # lendboxd's name for Gym's metadata
        res = self.resources.to_api()
        if res:
            body["resources"] = res
        if self.entrypoint is not None:
            body["entrypoint"] = list(self.entrypoint)
        if self.ports:
            body["ports"] = list(self.ports)
        opts = dict(self.provider_options or {})
        unknown = sorted(set(opts) - {"provider", "network", "ready_probe"})
        if unknown:
            raise ValueError(
                f"Unknown lendbox provider_options: {unknown}; expected 'provider', 'network', "
                "'ready_probe'"
            )
        if opts.get("provider") is not None:
            body["provider"] = opts["provider"]
        if opts.get("network") is not None:
            body["network"] = dict(opts["network"])
        if opts.get("ready_probe") is not None:
            body["ready_probe"] = dict(opts["ready_probe"])
        return body


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """A resources server's sandbox configuration (``LentSandboxes(sandbox_config=...)``): the
    spec fields that are the same for every lent sandbox. A plain mapping with these keys works
    too. ``ttl_s`` should exceed the episode deadline plus grading and cleanup time."""

    ttl_s: Optional[float] = None
    ready_timeout_s: Optional[float] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    resources: Any = dataclasses.field(default_factory=SandboxResources)
    entrypoint: Optional[Sequence[str]] = None
    provider_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SandboxExecResult:
    """One exec's result. ``return_code`` is the exit status (non-zero is a result, not an
    error; 128+N after signal N); 125 with ``error_type`` "timeout" (the whole process tree was
    killed at ``timeout_s``) or "sandbox" (runtime failure); "oom": the memory limit killed it
    (137). ``stdout``/``stderr``: text, each capped at the daemon's 1 MiB."""

    stdout: Optional[str]
    stderr: Optional[str]
    return_code: int
    error_type: Optional[str] = None
    message: Optional[str] = None
    duration_ms: Optional[int] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False


ExecResult = SandboxExecResult


class SandboxStatus(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class SandboxEndpoint:
    """A URL reaching a declared sandbox port from the daemon's host, and headers to send."""

    endpoint: str
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        url = (self.endpoint or "").strip()
        if "://" not in url or not url.split("://", 1)[1]:
            raise ValueError("Sandbox endpoint must be a non-empty absolute URL")
        if not isinstance(self.headers, Mapping):
            raise TypeError("Sandbox endpoint headers must be a mapping")
        object.__setattr__(self, "endpoint", url)
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})


@dataclasses.dataclass
class SandboxHandle:
    """A started sandbox: ``sandbox_id`` (``sbx-…``), ``provider_name`` ("lendbox"), and
    ``raw`` (base_url, token, scope, workdir, resources_session_id) that callers must not use."""

    sandbox_id: str
    provider_name: str
    raw: Any = None


@dataclasses.dataclass
class SandboxCommand:
    """What ``stage_activation`` returns: the harness ``argv`` (and Gym's supervisor
    interpreter ``python``, unused: lendbox's supervisor is built in)."""

    argv: list
    python: str = "python3"


@dataclasses.dataclass(frozen=True)
class DirectSandboxConnection:
    kind: str
    provider_config_ref: str
    descriptor: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class SandboxAccess:
    """What :meth:`LentSandboxes.lend` returns for the harness: ``connection.descriptor`` is the
    operate descriptor (``AsyncSandbox.connect`` rebuilds the sandbox from it in the agent's
    process), ``workdir`` the sandbox's workdir."""

    connection: DirectSandboxConnection
    workdir: str

    @property
    def descriptor(self) -> Mapping[str, Any]:
        return self.connection.descriptor

    def to_dict(self) -> Dict[str, Any]:
        return {
            "connection": {
                "kind": self.connection.kind,
                "provider_config_ref": self.connection.provider_config_ref,
                "descriptor": dict(self.connection.descriptor),
            },
            "workdir": self.workdir,
        }


def _file_content(v: Union[str, bytes]) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, str):
        return v
    raise TypeError(f"file contents must be str or bytes, not {type(v).__name__}")


# --- the provider ------------------------------------------------------------------------------


@runtime_checkable
class RenewableProvider(Protocol):
    """NeMo Gym's renewable provider: ``renew(handle, ttl_s)`` makes the sandbox expire ``ttl_s``
    seconds from now (not from its current expiry). Renewing a sandbox that has expired or was
    stopped is an error (:class:`~lendbox.errors.NotFound` here), never a resurrection."""

    async def renew(self, handle: SandboxHandle, ttl_s: float) -> None: ...


@runtime_checkable
class SnapshotProvider(Protocol):
    """lendbox's extension: ``snapshot(handle, name, labels)`` captures the running sandbox's
    file system (root layer and workdir; not processes, ``/tmp``, ``/run``) as the image
    ``name`` and returns its description; a sandbox or spec seeded with ``image=name`` starts
    from it. ``delete_snapshot(name)`` removes it."""

    async def snapshot(self, handle: SandboxHandle, name: str,
                       labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]: ...

    async def delete_snapshot(self, name: str) -> None: ...


@runtime_checkable
class ForkableProvider(Protocol):
    """lendbox's extension: ``fork(handle, resources_session_ids, task_id, labels)`` captures
    the sandbox once and lends each session a new sandbox started from that capture with the
    parent's spec; one ``(rsid, handle or error)`` per session, in order."""

    async def fork(self, handle: SandboxHandle, resources_session_ids: Sequence[str],
                   task_id: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                   ) -> List[Tuple[str, Union[SandboxHandle, LendboxError]]]: ...


@runtime_checkable
class ResettableProvider(Protocol):
    """lendbox's extension: ``reset(handle, snapshot)`` tears the lent sandbox down and makes it
    again under the same id, as it was seeded (or from the snapshot ``snapshot`` of the same
    base image); returns the handle with the new operate token (the old one is refused)."""

    async def reset(self, handle: SandboxHandle, snapshot: Optional[str] = None) -> SandboxHandle: ...


class LendboxProvider:
    """NeMo Gym's provider protocol over lendboxd's HTTP API (name ``"lendbox"``).

    Args:
        base_url: the daemon (default ``$LENDBOX_URL``, else ``http://127.0.0.1:8787``).
        token: admin token (default ``$LENDBOX_TOKEN``); handles rebuilt from an operate
            descriptor use the descriptor's token instead.
        client_options: keyword arguments for :class:`lendbox.AsyncClient` (timeouts, retries,
            ``retry_overloaded_s``: how long a 429 ``overloaded`` is retried as its ``Retry-After``
            says).

    Capabilities: connect (serialize_handle/connect), endpoint, pause/resume, renew
    (:class:`RenewableProvider`; the daemon caps ``ttl_s`` at ``lending.max_ttl_s``), snapshot,
    fork and reset (:class:`SnapshotProvider`, :class:`ForkableProvider`,
    :class:`ResettableProvider`: admin token only; NotImplementedByServer (501) on a daemon
    provider without them, e.g. docker for fork and reset), PTY sessions
    (``sandbox.pty.create`` returns ``{"session_id"}``; on a provider without PTY sessions, e.g.
    docker, the daemon answers 501, raised as :class:`lendbox.errors.NotImplementedByServer`).
    Registered, when NeMo Gym is installed, under the ``nemo_gym.sandbox_providers`` entry point
    ``lendbox``.
    """

    name = "lendbox"

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None,
                 **client_options: Any):
        self.base_url = (base_url or os.environ.get("LENDBOX_URL") or "http://127.0.0.1:8787").rstrip("/")
        self.token = token if token is not None else os.environ.get("LENDBOX_TOKEN")
        self._options = client_options
        self._clients: Dict[Tuple[str, Optional[str]], AsyncClient] = {}

    def client(self, handle: Optional[SandboxHandle] = None) -> AsyncClient:
        """The HTTP client for ``handle`` (its own base_url and token), or the provider's own."""
        raw = (handle.raw or {}) if handle is not None else {}
        key = (raw.get("base_url") or self.base_url, raw.get("token") or self.token)
        c = self._clients.get(key)
        if c is None:
            c = AsyncClient(key[0], key[1] or "", **self._options)
            self._clients[key] = c
        return c

    # Gym's required methods
    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        lease = await self.client().create_sandbox(extra=spec.to_api())
        return self._handle(lease, scope="owner")

    def _handle(self, lease: Mapping[str, Any], scope: str, token: Optional[str] = None) -> SandboxHandle:
        access = lease.get("access") or {}
        raw = {
            "base_url": self.base_url,
            "token": token,
            "scope": scope,
            "operate_token": access.get("token"),
            "operate_base_url": access.get("base_url"),
            "workdir": access.get("workdir"),
            "resources_session_id": lease.get("resources_session_id"),
        }
        return SandboxHandle(lease["sandbox_id"], self.name, raw)

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: Optional[str] = None,
                   env: Optional[Mapping[str, str]] = None, timeout_s: Optional[float] = 180,
                   user: Union[str, int, None] = None,
                   preserve_background_services: bool = False) -> SandboxExecResult:
        r = await self.client(handle).exec(
            handle.sandbox_id,
            command,
            cwd=cwd,
            env=env,
            user=None if user is None else str(user),
            timeout_s=timeout_s,
            preserve_background_services=preserve_background_services or None,
        )
        return SandboxExecResult(
            stdout=r.get("stdout"),
            stderr=r.get("stderr"),
            return_code=int(r["return_code"]),
            error_type=r.get("error_type"),
            message=r.get("message"),
            duration_ms=r.get("duration_ms"),
            stdout_truncated=bool(r.get("stdout_truncated")),
            stderr_truncated=bool(r.get("stderr_truncated")),
        )

    async def upload_file(self, handle: SandboxHandle, local_path: Union[str, pathlib.Path],
                          remote_path: str) -> None:
        p = pathlib.Path(local_path)
        data = await asyncio.to_thread(p.read_bytes)
        await self.client(handle).put_file(handle.sandbox_id, remote_path, data,
                                           mode=p.stat().st_mode & 0o777)

    async def download_file(self, handle: SandboxHandle, remote_path: str,
                            local_path: Union[str, pathlib.Path]) -> None:
        data = await self.client(handle).get_file(handle.sandbox_id, remote_path)
        p = pathlib.Path(local_path)

        def write() -> None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

        await asyncio.to_thread(write)

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            r = await self.client(handle).get_sandbox(handle.sandbox_id)
        except NotFound:
            return SandboxStatus.STOPPED
        try:
            return SandboxStatus(r.get("status", "unknown"))
        except ValueError:
            return SandboxStatus.UNKNOWN

    async def close(self, handle: SandboxHandle) -> None:
        """Stop the sandbox (``DELETE /v1/sandboxes/{id}``); already stopped is success."""
        try:
            await self.client(handle).delete_sandbox(handle.sandbox_id)
        except NotFound:
            pass

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.aclose()

    # optional capabilities
    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        r = await self.client(handle).endpoint(handle.sandbox_id, port)
        return SandboxEndpoint(r["endpoint"], r.get("headers") or {})

    async def pause(self, handle: SandboxHandle) -> None:
        await self.client(handle).pause(handle.sandbox_id)

    async def resume(self, handle: SandboxHandle) -> SandboxHandle:
        await self.client(handle).resume(handle.sandbox_id)
        return handle

    async def renew(self, handle: SandboxHandle, ttl_s: float) -> None:
        """The sandbox now expires ``ttl_s`` seconds from now. NotFound when it is no longer
        live (expired, stopped); BadRequest for ``ttl_s`` <= 0."""
        await self.client(handle).renew(handle.sandbox_id, ttl_s)

    async def snapshot(self, handle: SandboxHandle, name: str,
                       labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """``POST /v1/sandboxes/{id}/snapshot``: the new image (``name``, ``digest``,
        ``size_bytes``, ``base``, ...). Conflict (409) for a name in use, Forbidden (403) with an
        operate token."""
        return await self.client(handle).snapshot(
            handle.sandbox_id, name, labels=None if labels is None else dict(labels))

    async def delete_snapshot(self, name: str) -> None:
        """``DELETE /v1/images/{name}``; Conflict (409) while a live sandbox stands on it."""
        await self.client().delete_image(name)

    async def fork(self, handle: SandboxHandle, resources_session_ids: Sequence[str],
                   task_id: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                   ) -> List[Tuple[str, Union[SandboxHandle, LendboxError]]]:
        """``POST /v1/sandboxes/{id}/fork``: per session, in order, the child's owner handle or
        its own error (Conflict 409 for a session with a live sandbox, Overloaded 429 at
        capacity, ProviderError 502). A failure of the whole call (BadRequest, NotFound,
        NotImplementedByServer) raises."""
        r = await self.client(handle).fork(
            handle.sandbox_id, list(resources_session_ids), task_id=task_id,
            labels=None if labels is None else dict(labels))
        out: List[Tuple[str, Union[SandboxHandle, LendboxError]]] = []
        for child in r.get("children", []):
            rsid = child.get("rsid")
            if child.get("status") == 200 and child.get("lease"):
                out.append((rsid, self._handle(child["lease"], scope="owner",
                                               token=(handle.raw or {}).get("token"))))
            else:
                err = child.get("error") or {}
                out.append((rsid, error_for(int(child.get("status") or 500),
                                            err.get("code") or "", err.get("message") or "")))
        return out

    async def reset(self, handle: SandboxHandle, snapshot: Optional[str] = None) -> SandboxHandle:
        """``POST /v1/sandboxes/{id}/reset``; updates ``handle`` in place with the new operate
        token and returns it. NotFound (404) for a sandbox no longer live (or an unknown
        snapshot), Conflict (409) for a snapshot of another base image, ProviderError
        (502) when the reset failed (the sandbox was stopped)."""
        lease = await self.client(handle).reset(handle.sandbox_id, snapshot=snapshot)
        raw = handle.raw if isinstance(handle.raw, dict) else {}
        access = lease.get("access") or {}
        raw["operate_token"] = access.get("token")
        if access.get("workdir"):
            raw["workdir"] = access.get("workdir")
        handle.raw = raw
        return handle

    def serialize_handle(self, handle: SandboxHandle, *, scope: Optional[str] = None) -> Dict[str, Any]:
        raw = handle.raw or {}
        scope = scope or ("operate" if raw.get("operate_token") or raw.get("scope") == "operate" else "owner")
        desc: Dict[str, Any] = {
            "provider": self.name,
            "base_url": raw.get("operate_base_url") or raw.get("base_url") or self.base_url,
            "sandbox_id": handle.sandbox_id,
            "scope": scope,
            "workdir": raw.get("workdir"),
            "resources_session_id": raw.get("resources_session_id"),
        }
        if scope == "operate":
            token = raw.get("operate_token") or (raw.get("token") if raw.get("scope") == "operate" else None)
            if not token:
                raise RuntimeError(f"no operate token is known for sandbox {handle.sandbox_id}")
            desc["token"] = token
        elif scope != "owner":
            raise ValueError(f"unknown scope {scope!r}: 'operate' or 'owner'")
        # an owner descriptor carries no token: the connecting process brings its admin token
        return desc

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        d = dict(descriptor)
        if "sandbox_id" not in d:
            raise ValueError("descriptor has no sandbox_id")
        scope = d.get("scope") or ("operate" if d.get("token") else "owner")
        raw = {
            "base_url": d.get("base_url") or self.base_url,
            "token": d.get("token") or self.token,
            "scope": scope,
            "operate_token": d.get("token") if scope == "operate" else None,
            "workdir": d.get("workdir"),
            "resources_session_id": d.get("resources_session_id"),
        }
        handle = SandboxHandle(str(d["sandbox_id"]), self.name, raw)
        info = await self.client(handle).get_sandbox(handle.sandbox_id)  # health check: 404 raises
        if raw["resources_session_id"] is None:
            raw["resources_session_id"] = info.get("resources_session_id")
        if raw["workdir"] is None:
            raw["workdir"] = info.get("workdir")
        return handle


def _resolve_provider(provider: Any) -> Tuple[LendboxProvider, str]:
    """(provider, config name) from "lendbox", a mapping, or a LendboxProvider."""
    if isinstance(provider, LendboxProvider):
        return provider, provider.name
    if provider is None or provider == "lendbox":
        return LendboxProvider(), "lendbox"
    if isinstance(provider, str):
        raise ValueError(f"Unknown sandbox provider {provider!r}; available: ['lendbox']")
    if isinstance(provider, Mapping):
        p = dict(provider)
        if "name" in p:
            name = p.pop("name")
            if name != "lendbox":
                raise ValueError(f"Unknown sandbox provider {name!r}; available: ['lendbox']")
            return LendboxProvider(**p), "lendbox"
        if len(p) == 1 and "lendbox" in p:  # Gym's {name: kwargs}
            return LendboxProvider(**(p["lendbox"] or {})), "lendbox"
        raise ValueError("provider mapping needs 'name': 'lendbox' (or the form {'lendbox': {...}})")
    raise TypeError(f"provider must be 'lendbox', a mapping or a LendboxProvider, not {type(provider).__name__}")


# --- AsyncSandbox ---------------------------------------------------------------------------------


class AsyncSandbox:
    """Async sandbox object backed by lendboxd (NeMo Gym's ``nemo_gym.sandbox.AsyncSandbox``).

    Args:
        provider: ``"lendbox"``, ``{"name": "lendbox", "base_url", "token"}`` or a
            :class:`LendboxProvider` (see the module docs for the environment fallback).
        spec: what :meth:`start` starts when it is given none.
        owns_provider: with False, the caller closes a shared provider after all its sandboxes
            stopped.

    Lifecycle: new → :meth:`start` (or :meth:`connect`) → :meth:`stop` / :meth:`disconnect`.
    Operations before start raise RuntimeError "Sandbox has not been started".
    """

    def __init__(self, provider: Any, spec: Optional[SandboxSpec] = None, owns_provider: bool = True):
        self._provider, self._provider_ref = _resolve_provider(provider)
        self._spec = spec
        self._owns_provider = owns_provider
        self._handle: Optional[SandboxHandle] = None
        self._stopped = False
        self._borrowed = False
        self.pty = SandboxPty(self)

    # context manager
    async def __aenter__(self) -> "AsyncSandbox":
        if self._handle is None and not self._stopped:
            await self.start()
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.stop()

    def _require_handle(self) -> SandboxHandle:
        if self._stopped:
            raise RuntimeError("Sandbox has been stopped")
        if self._handle is None:
            raise RuntimeError("Sandbox has not been started")
        return self._handle

    @property
    def sandbox_id(self) -> Optional[str]:
        """The daemon's id (``sbx-…``) once started, else None."""
        return self._handle.sandbox_id if self._handle else None

    @property
    def resources_session_id(self) -> Optional[str]:
        """The session the sandbox is lent to (None for a sandbox from :meth:`start`)."""
        return (self._handle.raw or {}).get("resources_session_id") if self._handle else None

    @property
    def client(self) -> AsyncClient:
        """The :class:`lendbox.AsyncClient` this sandbox's calls go through."""
        return self._provider.client(self._require_handle())

    async def start(self, spec: Optional[SandboxSpec] = None) -> "AsyncSandbox":
        """Start a sandbox lent to no session (``POST /v1/sandboxes``): the spec's files are
        written before this returns. Raises ValueError without a spec; LendboxError from the
        daemon (e.g. Unenforceable 422 for ``gpu``, ProviderError 502 when it cannot start)."""
        if self._stopped:
            raise RuntimeError("Sandbox has been stopped")
        if self._handle is not None:
            raise RuntimeError("Sandbox is already started")
        spec = spec or self._spec
        if spec is None:
            raise ValueError("AsyncSandbox.start() requires a SandboxSpec")
        self._spec = spec
        self._handle = await self._provider.create(spec)
        return self

    async def start_with_setup(self, spec: Optional[SandboxSpec],
                               setup: Callable[["AsyncSandbox"], Awaitable[None]]) -> "AsyncSandbox":
        """Start, then run ``setup(self)``; if setup raises, the sandbox is stopped first."""
        await self.start(spec)
        try:
            await setup(self)
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        return self

    @classmethod
    async def connect(cls, descriptor: Mapping[str, Any], provider: Any = None,
                      owns_provider: bool = True) -> "AsyncSandbox":
        """Rebuild a sandbox in this process from :meth:`serialize`'s descriptor. With no
        ``provider``, the descriptor's ``base_url`` and (operate) ``token`` are used. Checks the
        sandbox exists (``GET /v1/sandboxes/{id}``; NotFound otherwise). A sandbox connected
        from an operate descriptor is borrowed: :meth:`stop` only disconnects it."""
        if hasattr(descriptor, "to_dict"):
            descriptor = descriptor.to_dict()
        if provider is None:
            provider = LendboxProvider(base_url=descriptor.get("base_url"),
                                       token=descriptor.get("token"))
        sb = cls(provider, SandboxSpec(workdir=descriptor.get("workdir")), owns_provider)
        sb._handle = await sb._provider.connect(descriptor)
        sb._borrowed = (sb._handle.raw or {}).get("scope") == "operate"
        return sb

    async def disconnect(self) -> None:
        """Release this client without stopping a borrowed sandbox (one from :meth:`connect`)."""
        self._stopped = True
        if self._owns_provider:
            await self._provider.aclose()

    async def serialize(self, scope: Optional[str] = None) -> Dict[str, Any]:
        """A JSON descriptor another process rebuilds this sandbox from with :meth:`connect`:
        ``{"provider": "lendbox", "base_url", "sandbox_id", "scope", "token", "workdir",
        "resources_session_id"}``. ``scope="operate"`` (the default when an operate token is
        known) carries the sandbox's operate token: exec, files, status, pause/resume,
        endpoints and its session's harness, but never stop. ``scope="owner"`` carries no token
        (the connecting process brings the admin token). The admin token is never included."""
        handle = self._require_handle()
        desc = self._provider.serialize_handle(handle, scope=scope)
        if desc.get("workdir") is None:
            desc["workdir"] = self._spec.workdir if self._spec else None
        return desc

    async def exec(self, command: str, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, timeout_s: Union[int, float, None] = 180,
                   user: Union[str, int, None] = None,
                   preserve_background_services: bool = False) -> SandboxExecResult:
        """Run ``command`` with ``/bin/sh -c``; ``cwd`` defaults to the spec's workdir (then
        the daemon's). ``timeout_s`` seconds (None: the daemon's default, 180): on timeout the
        whole process tree is killed and the result is 125/"timeout". ``user``: root only on the
        local provider (else BadRequest). With ``preserve_background_services`` processes the
        command leaves running (services; redirect their output) survive it.
        Raises LendboxError for HTTP failures (NotFound: sandbox gone; Conflict: paused)."""
        handle = self._require_handle()
        if cwd is None and self._spec is not None:
            cwd = self._spec.workdir
        return await self._provider.exec(handle, command, cwd=cwd, env=env, timeout_s=timeout_s,
                                         user=user,
                                         preserve_background_services=preserve_background_services)

    _exec_uninstrumented = exec

    async def upload(self, local_path: Union[pathlib.Path, str], remote_path: str) -> None:
        """Copy the local file into the sandbox at absolute ``remote_path`` (parents created,
        the local file's permission bits kept)."""
        await self._provider.upload_file(self._require_handle(), local_path, remote_path)

    async def download(self, remote_path: str, local_path: Union[pathlib.Path, str]) -> None:
        """Copy ``remote_path`` out of the sandbox to ``local_path`` (parents created).
        NotFound when the file is missing."""
        await self._provider.download_file(self._require_handle(), remote_path, local_path)

    async def status(self) -> SandboxStatus:
        """unknown before start; stopped after :meth:`stop`; else the daemon's status."""
        if self._stopped:
            return SandboxStatus.STOPPED
        if self._handle is None:
            return SandboxStatus.UNKNOWN
        return await self._provider.status(self._handle)

    async def stop(self) -> None:
        """Stop the sandbox (``DELETE /v1/sandboxes/{id}``, bounded by the daemon's
        ``stop_timeout_s``); safe to repeat. A borrowed sandbox (operate descriptor) is only
        disconnected: its owner stops it. A failed stop raises ProviderError and may be retried
        (the daemon also retries it)."""
        if self._stopped:
            return
        if self._handle is not None and not self._borrowed:
            await self._provider.close(self._handle)
        self._stopped = True
        if self._owns_provider:
            await self._provider.aclose()

    async def pause(self) -> None:
        """Freeze every process of the sandbox (cgroup freezer)."""
        await self._provider.pause(self._require_handle())

    async def resume(self) -> None:
        """Thaw a paused sandbox."""
        self._handle = await self._provider.resume(self._require_handle())

    async def renew(self, ttl_s: float) -> None:
        """Expire ``ttl_s`` seconds from now (RenewableProvider). Renewing a sandbox that
        expired or was stopped raises :class:`~lendbox.errors.NotFound`."""
        await self._provider.renew(self._require_handle(), ttl_s)

    async def snapshot(self, name: str, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """lendbox's extension: capture this sandbox's file system as the image ``name`` (see
        :class:`SnapshotProvider`); returns the image's description. Start sandboxes from it
        with ``SandboxSpec(image=name)``, or :meth:`reset` a lent one to it."""
        return await self._provider.snapshot(self._require_handle(), name, labels)

    async def fork(self, resources_session_ids: Sequence[str], task_id: Optional[str] = None,
                   labels: Optional[Mapping[str, str]] = None) -> List["ForkedSandbox"]:
        """lendbox's extension: one new sandbox per resources session, each starting from this
        sandbox's file system as it is now (one capture; processes are not copied), with this
        sandbox's spec (``task_id`` and ``labels`` replace its own when given). Returns one
        :class:`ForkedSandbox` per session, in order: its started :class:`AsyncSandbox` (an
        owner handle sharing this provider; :meth:`stop` it, or release its session), or its
        own error. Whole-call errors raise (see :class:`ForkableProvider`)."""
        res = await self._provider.fork(self._require_handle(), list(resources_session_ids),
                                        task_id, labels)
        out: List[ForkedSandbox] = []
        for rsid, r in res:
            if isinstance(r, LendboxError):
                out.append(ForkedSandbox(rsid, None, r))
                continue
            child = AsyncSandbox(self._provider, self._spec, owns_provider=False)
            child._handle = r
            out.append(ForkedSandbox(rsid, child, None))
        return out

    async def reset(self, snapshot: Optional[str] = None) -> None:
        """lendbox's extension, for a sandbox lent to a session (:meth:`LentSandboxes.lend`, a
        :meth:`fork` child): return it, in place (same ``sandbox_id``), to how
        it was seeded, or to the snapshot ``snapshot`` of its base image: every process and
        file of before is gone, the seed's files are written again. A new operate token is
        minted (descriptors serialized before now are refused: :meth:`serialize` again)."""
        await self._provider.reset(self._require_handle(), snapshot)

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """URL reaching TCP ``port`` in the sandbox from the daemon's host; the port must be in
        ``SandboxSpec.ports`` (ValueError otherwise; checked by the daemon for a connected
        sandbox)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"Sandbox TCP port {port!r} must be between 1 and 65535")
        handle = self._require_handle()
        if self._spec is not None and self._spec.ports and port not in self._spec.ports:
            raise ValueError(f"Sandbox port {port} was not declared in SandboxSpec.ports; "
                             f"declared ports: {list(self._spec.ports)}")
        return await self._provider.endpoint(handle, port)

    def _telemetry_provider_name(self) -> str:
        return "lendbox"


@dataclasses.dataclass
class ForkedSandbox:
    """One child of :meth:`AsyncSandbox.fork`: its session, and either its started ``sandbox``
    or the ``error`` that kept it from starting (a :class:`~lendbox.errors.LendboxError`)."""

    resources_session_id: str
    sandbox: Optional[AsyncSandbox]
    error: Optional[LendboxError] = None


class SandboxPty:
    """PTY namespace of a sandbox: :meth:`create` opens a session on the daemon (its id in
    ``{"session_id"}``; read, write and wait through the client's ``pty_*`` calls). On a provider
    without PTY sessions (docker) they raise :class:`lendbox.errors.NotImplementedByServer` (a
    ``NotImplementedError``); use ``sandbox.exec`` instead."""

    def __init__(self, sandbox: AsyncSandbox):
        self._sandbox = sandbox

    async def create(self, command: Optional[str] = None, cwd: Optional[str] = None,
                     env: Optional[Dict[str, str]] = None, rows: int = 24, cols: int = 80,
                     user: Union[str, int, None] = None, pty: bool = True) -> Any:
        sb = self._sandbox
        return await sb.client.create_pty(sb._require_handle().sandbox_id, command, cwd=cwd,
                                          env=env, user=None if user is None else str(user),
                                          rows=rows, cols=cols, pty=pty)

    async def exec(self, command: str, session: Any = None, cwd: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None, timeout_s: Union[int, float, None] = 180,
                   user: Union[str, int, None] = None, rows: int = 24, cols: int = 80,
                   pty: bool = True, detach: bool = False, poll_interval_s: float = 15.0) -> Any:
        await self.create(command, cwd=cwd, env=env, rows=rows, cols=cols, user=user, pty=pty)

    async def attach(self, session_id: str, takeover: bool = True, since: Optional[int] = None) -> Any:
        return await self._sandbox.client.pty_attach(session_id, takeover)


# --- Sandbox (sync) -------------------------------------------------------------------------------


def _ensure_can_block(operation: str) -> None:
    """RuntimeError when this thread runs an event loop (NeMo Gym's check, and message)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"Sandbox.{operation}() is blocking; use AsyncSandbox in async code instead.")


class _AsyncLoopRunner:
    """Runs async sandbox operations for sync callers on a private event-loop thread."""

    def __init__(self, wait_timeout_s: float = SYNC_OPERATION_TIMEOUT_S,
                 close_timeout_s: float = SYNC_LOOP_CLOSE_TIMEOUT_S):
        self._wait_timeout_s = wait_timeout_s
        self._close_timeout_s = close_timeout_s
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run_loop, name="lendbox-sync-loop", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def run(self, operation: str, awaitable_factory: Callable[[], Awaitable[T]]) -> T:
        if self._closed:
            raise RuntimeError(f"Sandbox.{operation}: sync loop is closed")
        _ensure_can_block(operation)

        async def call() -> T:
            return await awaitable_factory()

        fut = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return fut.result(self._wait_timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"Sandbox.{operation}: timed out waiting for the sync loop") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self._close_timeout_s)
        if not self._thread.is_alive():
            self._loop.close()


class Sandbox:
    """Synchronous wrapper around :class:`AsyncSandbox` (same arguments and methods, blocking;
    ``pty``, ``serialize``, ``connect`` and ``fork`` are async-only). Its operations run on an
    event loop of its own, in a thread of its own (as NeMo Gym's ``_AsyncLoopRunner``), so any
    thread without a running event loop may call it, also while other threads run loops. As in
    NeMo Gym, a call from a thread whose event loop is running (a coroutine, a notebook cell)
    raises RuntimeError ("Sandbox.exec() is blocking; use AsyncSandbox in async code
    instead."): it would stall that loop for the whole operation."""

    def __init__(self, provider: Any, spec: Optional[SandboxSpec] = None):
        _ensure_can_block("__init__")
        self._async_sandbox = AsyncSandbox(provider, spec)
        self._runner = _AsyncLoopRunner()

    def __enter__(self) -> "Sandbox":
        if self._async_sandbox._handle is None and not self._async_sandbox._stopped:
            self.start()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        runner = getattr(self, "_runner", None)
        if runner is not None and not runner._closed:
            try:
                runner.close()
            except Exception:
                pass

    @property
    def sandbox_id(self) -> Optional[str]:
        return self._async_sandbox.sandbox_id

    def start(self, spec: Optional[SandboxSpec] = None) -> "Sandbox":
        self._runner.run("start", lambda: self._async_sandbox.start(spec))
        return self

    def exec(self, command: str, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             timeout_s: Union[int, float, None] = 180, user: Union[str, int, None] = None,
             preserve_background_services: bool = False) -> SandboxExecResult:
        return self._runner.run("exec", lambda: self._async_sandbox.exec(
            command, cwd, env, timeout_s, user, preserve_background_services))

    def upload(self, local_path: Union[pathlib.Path, str], remote_path: str) -> None:
        self._runner.run("upload", lambda: self._async_sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: Union[pathlib.Path, str]) -> None:
        self._runner.run("download", lambda: self._async_sandbox.download(remote_path, local_path))

    def status(self) -> SandboxStatus:
        return self._runner.run("status", self._async_sandbox.status)

    def pause(self) -> None:
        self._runner.run("pause", self._async_sandbox.pause)

    def resume(self) -> None:
        self._runner.run("resume", self._async_sandbox.resume)

    def renew(self, ttl_s: float) -> None:
        self._runner.run("renew", lambda: self._async_sandbox.renew(ttl_s))

    def snapshot(self, name: str, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        return self._runner.run("snapshot", lambda: self._async_sandbox.snapshot(name, labels))

    def reset(self, snapshot: Optional[str] = None) -> None:
        self._runner.run("reset", lambda: self._async_sandbox.reset(snapshot))

    def endpoint(self, port: int) -> SandboxEndpoint:
        return self._runner.run("endpoint", lambda: self._async_sandbox.endpoint(port))

    def stop(self) -> None:
        """Stop the sandbox (safe to repeat), then close the sync loop."""
        if self._runner._closed:
            return
        self._runner.run("stop", self._async_sandbox.stop)
        self._runner.close()


# --- LentSandboxes --------------------------------------------------------------------------------


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


_CONFIG_KEYS = {"ttl_s", "ready_timeout_s", "env", "files", "metadata", "resources", "entrypoint",
                "provider_options"}


def _task_id_str(task_id: Any) -> str:
    """NeMo Gym's TaskId ``{taskset, task_id}`` (mapping or object) → ``"taskset/task_id"``."""
    if isinstance(task_id, str):
        return task_id
    taskset = _config_get(task_id, "taskset")
    tid = _config_get(task_id, "task_id")
    if taskset is None or tid is None:
        raise TypeError("task_id must be a str or a TaskId with taskset and task_id")
    return f"{taskset}/{tid}"


class LentSandboxes:
    """Start, lend and stop one sandbox per resources session, from the server's sandbox
    configuration (NeMo Gym's ``LentSandboxes``), as lendboxd seeds and releases.

    Args:
        sandbox_provider: ``"lendbox"`` or a provider mapping (see the module docs).
        sandbox_config: :class:`SandboxConfig` or a mapping with its keys (``ttl_s``,
            ``ready_timeout_s``, ``env``, ``files``, ``metadata``, ``resources``, ``entrypoint``,
            ``provider_options``); None for none. Unknown mapping keys → ValueError.
        image: image of every sandbox (None: the daemon's default, ``host``).
        workdir: workdir of every sandbox (None: the daemon's, ``/workspace``).
        network_access: ``"inherit"``, ``"model_only"`` (only ``model_server``'s host) or
            ``"model_and_tools"`` (also ``tool_servers``' hosts); Unenforceable (422) where the
            daemon cannot enforce it.

    Call :meth:`lend` from the episode seed and :meth:`release` from its close (under the
    server's per-session lock), and :meth:`release_all` at shutdown. The daemon keeps each
    session's record, so the sandbox survives a restart of the resources server or the daemon;
    :meth:`get` knows the sandboxes lent by this object.
    """

    def __init__(self, sandbox_provider: Any, sandbox_config: Any, image: Optional[str],
                 workdir: Optional[str], network_access: LentSandboxNetworkAccess = "inherit",
                 model_server: Optional[str] = None, tool_servers: Sequence[str] = ()):
        if isinstance(sandbox_config, Mapping):
            unknown = sorted(set(sandbox_config) - _CONFIG_KEYS)
            if unknown:
                raise ValueError(f"Unknown SandboxConfig keys: {unknown}")
        if network_access not in ("inherit", "model_only", "model_and_tools"):
            raise ValueError(f"network_access must be inherit, model_only or model_and_tools, "
                             f"not {network_access!r}")
        self._provider, self._provider_ref = _resolve_provider(sandbox_provider)
        self.sandbox_config = sandbox_config
        self.image = image
        self.workdir = workdir
        self.network_access = network_access
        self.model_server = model_server
        self._tool_servers = tuple(tool_servers)
        self._sandboxes: Dict[str, AsyncSandbox] = {}
        self._failed_seed_sandboxes: Dict[str, AsyncSandbox] = {}
        self._pool_id = uuid.uuid4().hex[:12]

    @property
    def tool_servers(self) -> Tuple[str, ...]:
        return self._tool_servers

    @property
    def client(self) -> AsyncClient:
        """The admin :class:`lendbox.AsyncClient`."""
        return self._provider.client()

    def _seed_body(self, files: Optional[Mapping[str, Union[str, bytes]]]) -> Dict[str, Any]:
        cfg = self.sandbox_config
        spec = SandboxSpec(
            image=self.image,
            ttl_s=_config_get(cfg, "ttl_s"),
            ready_timeout_s=_config_get(cfg, "ready_timeout_s"),
            workdir=self.workdir,
            env=_config_get(cfg, "env") or {},
            files={**(_config_get(cfg, "files") or {}), **(files or {})},
            metadata={**(_config_get(cfg, "metadata") or {}), _POOL_LABEL: self._pool_id},
            resources=_config_get(cfg, "resources"),
            entrypoint=_config_get(cfg, "entrypoint"),
            provider_options=_config_get(cfg, "provider_options") or {},
        )
        body = spec.to_api()
        if self.network_access != "inherit" or "network" not in body:
            net: Dict[str, Any] = {"access": self.network_access}
            if self.model_server is not None:
                net["model_server"] = self.model_server
            if self._tool_servers:
                net["tool_servers"] = list(self._tool_servers)
            if self.network_access != "inherit" or len(net) > 1:
                body["network"] = net
        return body

    async def lend(self, resources_session_id: str, task_id: Any,
                   files: Optional[Mapping[str, Union[str, bytes]]] = None) -> SandboxAccess:
        """Return the access a harness needs to the session's sandbox, starting it on the first
        call (``POST /v1/sessions/{rsid}/seed``).

        ``files``: absolute sandbox path → ``str`` (written as UTF-8) or ``bytes``; written
        before this returns. A repeated call returns the same sandbox; another ``task_id`` for
        a live session raises Conflict (409). If the new sandbox cannot start or receive its
        files, the daemon stops it and the error is raised (ProviderError 502, BadRequest 400
        for a bad path, Unenforceable 422); a sandbox whose stop failed too is kept by the
        daemon and stopped by the session's next lend or release.
        """
        body = self._seed_body(files)
        task = _task_id_str(task_id)
        lease = await self.client.seed(resources_session_id, task, extra=body)
        return await self._lent(resources_session_id, lease, body)

    async def _lent(self, resources_session_id: str, lease: Mapping[str, Any],
                    body: Mapping[str, Any]) -> SandboxAccess:
        """Record the sandbox of ``lease`` (seeded with ``body``) as the session's; its access."""
        sb = AsyncSandbox(self._provider, SandboxSpec(workdir=lease["access"].get("workdir"),
                                                      ports=body.get("ports", ())),
                          owns_provider=False)
        sb._handle = self._provider._handle(lease, scope="owner")
        self._sandboxes[resources_session_id] = sb
        desc = await sb.serialize(scope="operate")
        return SandboxAccess(
            DirectSandboxConnection("direct", self._provider_ref, desc),
            lease["access"].get("workdir") or self.workdir or "",
        )

    async def lend_many(
        self, sessions: Mapping[str, Any],
        files: Optional[Mapping[str, Mapping[str, Union[str, bytes]]]] = None,
    ) -> Dict[str, Union[SandboxAccess, LendboxError]]:
        """lendbox's extension: :meth:`lend` for many sessions at once (``sessions``:
        resources_session_id → task_id; ``files``: resources_session_id → its files, as
        :meth:`lend` takes them), in requests of at most 256 seeds
        (``POST /v1/sessions/seed_batch``, 8 seeding at a time on the daemon). Returns, per
        session, its :class:`SandboxAccess` or its own error (Conflict 409 for a live session of
        another task, Overloaded 429 at capacity, ProviderError 502, BadRequest 400); one
        session's failure fails no other. A failure of a whole request raises."""
        out: Dict[str, Union[SandboxAccess, LendboxError]] = {}
        rsids = list(sessions)
        for k in range(0, len(rsids), 256):
            chunk = rsids[k:k + 256]
            items = []
            for rsid in chunk:
                item = self._seed_body((files or {}).get(rsid))
                item.update(rsid=rsid, task_id=_task_id_str(sessions[rsid]))
                items.append(item)
            results = await self.client.seed_batch(items)
            for rsid, item, res in zip(chunk, items, results):
                if res.get("status") == 200 and res.get("lease"):
                    out[rsid] = await self._lent(rsid, res["lease"], item)
                    continue
                err = res.get("error") or {}
                out[rsid] = error_for(int(res.get("status") or 500), err.get("code") or "",
                                      err.get("message") or "")
        return out

    def get(self, resources_session_id: str) -> Optional[AsyncSandbox]:
        """The sandbox lent (by this object) for ``resources_session_id``, or None."""
        return self._sandboxes.get(resources_session_id)

    async def release(self, resources_session_id: str) -> None:
        """Stop the session's sandbox (``POST …/release``), closing its harness first; safe to
        repeat and for an unknown session. A failed stop raises ProviderError (502) and keeps
        the record, so a later release (or the daemon's retry loop) stops it. The stop
        finishes on the daemon even if this call is cancelled."""
        await asyncio.wait_for(asyncio.shield(self.client.release(resources_session_id)),
                               STOP_TIMEOUT_S + 60.0)
        sb = self._sandboxes.pop(resources_session_id, None)
        if sb is not None:
            sb._stopped = True

    async def _access(self, sb: AsyncSandbox) -> SandboxAccess:
        desc = await sb.serialize(scope="operate")
        return SandboxAccess(DirectSandboxConnection("direct", self._provider_ref, desc),
                             (sb._handle.raw or {}).get("workdir") or self.workdir or "")

    async def fork(self, resources_session_id: str, resources_session_ids: Sequence[str],
                   task_id: Any = None) -> Dict[str, Union[SandboxAccess, LendboxError]]:
        """lendbox's extension: lend each of ``resources_session_ids`` a new sandbox starting
        from the file system of the sandbox lent (by this object) to ``resources_session_id``
        as it is now (e.g. prepared once, then one child per attempt of a GRPO group). The
        children keep the parent's configuration and this object's pool (:meth:`get`,
        :meth:`release` and :meth:`release_all` know them); ``task_id`` replaces the parent's.
        Returns, per session, its :class:`SandboxAccess` or the error that kept its sandbox
        from starting. KeyError for a parent this object did not lend."""
        parent = self._sandboxes.get(resources_session_id)
        if parent is None:
            raise KeyError(f"no sandbox lent by this object for {resources_session_id!r}")
        task = None if task_id is None else _task_id_str(task_id)
        children = await parent.fork(list(resources_session_ids), task)
        out: Dict[str, Union[SandboxAccess, LendboxError]] = {}
        for ch in children:
            if ch.sandbox is None:
                out[ch.resources_session_id] = ch.error or LendboxError(500, "internal", "no child")
                continue
            self._sandboxes[ch.resources_session_id] = ch.sandbox
            out[ch.resources_session_id] = await self._access(ch.sandbox)
        return out

    async def reset(self, resources_session_id: str, snapshot: Optional[str] = None) -> SandboxAccess:
        """lendbox's extension: return the session's sandbox, in place, to how it was lent (or
        to the snapshot ``snapshot`` of its image), e.g. between two attempts at a task: no
        process or file of the previous attempt is left, the lend's ``files`` are written
        again. Returns the new access: the old descriptor's token is refused from now on.
        KeyError for a session this object did not lend; NotFound if it is no longer lent."""
        sb = self._sandboxes.get(resources_session_id)
        if sb is None:
            raise KeyError(f"no sandbox lent by this object for {resources_session_id!r}")
        await sb.reset(snapshot)
        return await self._access(sb)

    async def release_all(self) -> None:
        """Stop every sandbox this object lent (``POST /v1/sessions/release_all`` filtered on
        this object's pool label; at most ``stop_concurrency`` stops in flight), as at server
        shutdown. A failed stop is logged and the rest go on."""
        try:
            await self._release_all()
        finally:
            # at shutdown nothing of Gym's API closes the client: close it here (a later call
            # opens a new one)
            await self._provider.aclose()

    async def _release_all(self) -> None:
        try:
            r = await self.client.release_all(labels={_POOL_LABEL: self._pool_id})
        except (NotFound, MethodNotAllowed):  # a daemon without the route: one by one
            sem = asyncio.Semaphore(SHUTDOWN_STOP_CONCURRENCY)

            async def one(rsid: str) -> None:
                async with sem:
                    try:
                        await self.release(rsid)
                    except LendboxError as e:
                        LOGGER.warning("release of %s failed: %s", rsid, e)

            await asyncio.gather(*(one(rsid) for rsid in list(self._sandboxes)))
            return
        for rsid in r.get("released", []):
            sb = self._sandboxes.pop(rsid, None)
            if sb is not None:
                sb._stopped = True
        for f in r.get("failed", []):
            LOGGER.warning("release of %s failed: %s", f.get("resources_session_id"), f.get("error"))


LOGGER = LOG


# --- SandboxSession -------------------------------------------------------------------------------


@dataclasses.dataclass
class SandboxSession(Generic[Artifacts]):
    """Execute, stop, capture, then release an owned or borrowed sandbox (NeMo Gym's
    ``SandboxSession``): one supervised harness activation of a **lent** sandbox, run by
    lendboxd's in-sandbox supervisor (``POST /v1/sessions/{rsid}/execute``) — with the operate
    descriptor (agent side) or the admin token.

    Args:
        sandbox: the :class:`AsyncSandbox` (e.g. ``await AsyncSandbox.connect(descriptor)``).
        session_dir: kept for NeMo Gym compatibility; lendbox's activation directory is
            ``/run/lendbox/<activation_id>`` (see :attr:`stop_request_path`).
        workdir: the harness's ``cwd`` (None: the sandbox's workdir).
        harness: a name for messages.
        owns_sandbox: True: :meth:`close` stops the sandbox; False (borrowed): it only
            disconnects (the resources server releases it).
    """

    sandbox: AsyncSandbox
    session_dir: str
    workdir: Optional[str]
    harness: str
    owns_sandbox: bool = False
    artifacts: Any = dataclasses.field(default=None, init=False)
    capture_error: Optional[BaseException] = dataclasses.field(default=None, init=False)
    cleanup: Optional[Dict[str, Any]] = dataclasses.field(default=None, init=False)
    launch_started: bool = dataclasses.field(default=False, init=False)
    sandbox_stopped: bool = dataclasses.field(default=False, init=False)
    _capture_attempted: bool = dataclasses.field(default=False, init=False)
    _close_task: Optional["asyncio.Task[None]"] = dataclasses.field(default=None, init=False)
    _collect: Optional[Callable[[], Awaitable[Any]]] = dataclasses.field(default=None, init=False)
    _finalize_task: Optional["asyncio.Task[None]"] = dataclasses.field(default=None, init=False)
    _activated: bool = dataclasses.field(default=False, init=False)
    _closing: bool = dataclasses.field(default=False, init=False)
    _closed: bool = dataclasses.field(default=False, init=False)
    _activation: Optional[Dict[str, Any]] = dataclasses.field(default=None, init=False)
    _rsid: Optional[str] = dataclasses.field(default=None, init=False)

    @property
    def closed(self) -> bool:
        """Whether close completed successfully."""
        return self._closed

    @property
    def closing(self) -> bool:
        """Whether close has been requested, including a failed attempt."""
        return self._closing

    @property
    def stop_request_path(self) -> Optional[str]:
        """The stop-request file inside the sandbox (``/run/lendbox/<activation_id>/stop.request``),
        known once :meth:`execute` launched the harness (None before). The harness also gets it
        in its environment as ``LENDBOX_STOP_REQUEST``."""
        return (self._activation or {}).get("stop_request_path")

    async def _session_id(self) -> str:
        if self._rsid is None:
            rsid = self.sandbox.resources_session_id
            if rsid is None:
                info = await self.sandbox.client.get_sandbox(self.sandbox._require_handle().sandbox_id)
                rsid = info.get("resources_session_id")
            if not rsid:
                raise RuntimeError(f"{self.harness}: harness activations need a sandbox lent to a "
                                   "resources session (LentSandboxes.lend); this one is not")
            self._rsid = rsid
        return self._rsid

    def _record(self, act: Mapping[str, Any]) -> None:
        self._activation = dict(act)
        if act.get("cleanup") is not None:
            self.cleanup = dict(act["cleanup"])

    def _receipt_confirmed(self) -> bool:
        return bool(self.cleanup and self.cleanup.get("cleanup_confirmed"))

    async def execute(self, stage_activation: Callable[[], Awaitable[SandboxCommand]],
                      collect: Callable[[], Awaitable[Any]], timeout: float,
                      close_timeout: float) -> Any:
        """Run the harness once and return ``collect()``'s artifacts.

        ``stage_activation()`` stages input (e.g. with ``sandbox.upload``) and returns a
        :class:`SandboxCommand`; the harness ``argv`` then runs under the supervisor in
        :attr:`workdir` with ``timeout`` seconds (its whole process tree is stopped then:
        TERM, KILL, descendants drained, in three phases of ``close_timeout / 3``). After the
        confirmed cleanup, ``collect()`` runs once (bounded by ``close_timeout``).

        Raises: RuntimeError if closing or already activated; TimeoutError when the harness
        hit ``timeout``; RuntimeError "<harness> sandbox execution failed: ..." when it could not
        run (the daemon's ``error``); the capture error if ``collect`` failed. A non-zero exit
        of the harness is not an error. On cancellation the harness is stopped first.
        """
        if self._closing or self._activated:
            raise RuntimeError(f"{self.harness} session is closing or already activated")
        self._activated = True
        self._collect = collect
        command = await asyncio.shield(asyncio.ensure_future(stage_activation()))
        if self._closing:
            raise RuntimeError(f"{self.harness} session was closed before launch")
        rsid = await self._session_id()
        client = self.sandbox.client
        try:
            self.launch_started = True
            try:
                started = await client.execute(rsid, list(command.argv), cwd=self.workdir,
                                               timeout_s=timeout, close_timeout_s=close_timeout,
                                               wait=False)
            except BadRequest as e:
                if "'wait'" not in e.message:
                    raise
                # a daemon before "wait": false: the execute answers when the harness ended
                started = await client.execute(rsid, list(command.argv), cwd=self.workdir,
                                               timeout_s=timeout, close_timeout_s=close_timeout)
            act: Dict[str, Any] = dict(started)
            # the daemon may restart meanwhile (the harness lives on in the sandbox): poll on
            # through transport errors and 503s until the harness's own deadline has passed
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout + close_timeout + 60.0
            while act.get("outcome") is None and act.get("state") not in ("finished", "timed_out",
                                                                            "failed", "closed"):
                try:
                    act = await client.get_activation(rsid, wait_ms=30000)
                except (TransportError, Draining):
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            self._record(act)
        except BaseException:
            try:
                await asyncio.wait_for(asyncio.shield(self._finalize(close_timeout)), close_timeout + 30)
            except BaseException as e:  # logged, never masks the original error
                LOG.warning("%s cleanup remains unconfirmed; close must retry: %r", self.harness, e)
            raise
        outcome = act.get("outcome") or act.get("state")
        error: Optional[BaseException] = None
        if outcome == "timed_out":
            error = TimeoutError(f"{self.harness} supervisor exceeded its execution deadline")
        elif outcome == "failed":
            error = RuntimeError(f"{self.harness} sandbox execution failed: "
                                 f"{act.get('error_type') or 'sandbox'}: {act.get('error')}")
        await asyncio.shield(self._finalize(close_timeout))
        if error is not None:
            if self.capture_error is not None:
                raise error from self.capture_error
            raise error
        if self.capture_error is not None:
            raise self.capture_error
        return self.artifacts

    async def _finalize(self, timeout: float) -> None:
        task = self._finalize_task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._finalize_task = asyncio.ensure_future(self._finish(timeout))
        await asyncio.shield(task)

    async def _finish(self, timeout: float) -> None:
        await self.stop_harness(timeout)
        if self.launch_started and not self._capture_attempted and self._collect is not None:
            self._capture_attempted = True
            if self.sandbox_stopped:
                self.capture_error = RuntimeError("sandbox stopped before artifact capture")
            else:
                try:
                    self.artifacts = await asyncio.wait_for(self._collect(), timeout)
                except Exception as e:  # recorded; does not prevent release
                    self.capture_error = e

    async def stop_harness(self, timeout: float) -> None:
        """Stop the harness (``POST …/stop_harness``: stop request, TERM, KILL, descendant
        drain) and confirm its cleanup, within ``timeout`` seconds; nothing to do when it was
        never launched or has ended. RuntimeError when cleanup is not confirmed."""
        if not self.launch_started or self.sandbox_stopped or self._receipt_confirmed():
            return
        rsid = await self._session_id()
        try:
            act = await self.sandbox.client.stop_harness(rsid, timeout_s=timeout)
        except (NotFound, MethodNotAllowed) as e:
            if "route" not in e.message and e.status != 405:
                raise
            # a daemon without the stop_harness route: close stops the harness too
            act = await self.sandbox.client.close_activation(rsid, timeout_s=timeout)
        self._record(act)
        if not self._receipt_confirmed():
            raise RuntimeError(f"{self.harness} sandbox cleanup was not confirmed: "
                               f"{(self.cleanup or {}).get('error')}")

    async def close(self, timeout: float) -> None:
        """Stop the harness, collect once, close the activation, then stop (owned) or disconnect
        (borrowed) the sandbox; concurrent and repeated closes share one finalization and never
        collect twice. A failure leaves the session closing, and a later close retries."""
        self._closing = True
        task = self._close_task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._close_task = asyncio.ensure_future(self._close(timeout))
        await asyncio.shield(task)

    async def _close(self, timeout: float) -> None:
        try:
            await self._finalize(timeout)
        except Exception:
            if not self.owns_sandbox:
                raise
            LOG.warning("%s finalization failed; stopping the sandbox", self.harness, exc_info=True)
            if not self._capture_attempted:
                self._capture_attempted = True
                self.capture_error = RuntimeError("artifact capture unavailable during forced stop")
        if self.launch_started and not self.sandbox_stopped:
            rsid = await self._session_id()
            act = await self.sandbox.client.close_activation(rsid, timeout_s=timeout)
            self._record(act)
        if self.owns_sandbox:
            await asyncio.wait_for(self.sandbox.stop(), timeout + STOP_TIMEOUT_S)
            self.sandbox_stopped = True
        else:
            await self.sandbox.disconnect()
        self._closed = True

    async def read_output_log(self) -> str:
        """The harness's combined output log (supervisor and harness stdout/stderr) as text;
        ``""`` on any error, so diagnostics never mask the original failure."""
        try:
            rsid = await self._session_id()
            act = await self.sandbox.client.get_activation(rsid, log=True)
            return act.get("log") or ""
        except Exception:
            return ""
