"""lendbox: Python client of lendboxd, the sandbox-lending daemon.

* :class:`Client` / :class:`AsyncClient` — one method per HTTP route (docs/api.md,
  docs/openapi.yaml), errors raised as :class:`LendboxError` (status, code, message).
* :mod:`lendbox.gym` — NeMo Gym's ``AsyncSandbox``, ``Sandbox``, ``LentSandboxes`` and
  ``SandboxSession`` on top of it.
"""

from .client import ROUTES, AsyncClient, Client
from .errors import (
    BadRequest,
    Conflict,
    Draining,
    Forbidden,
    Gone,
    ImageNotFound,
    InternalError,
    LendboxError,
    MethodNotAllowed,
    NotFound,
    NotImplementedByServer,
    Overloaded,
    PayloadTooLarge,
    ProviderError,
    RangeNotSatisfiable,
    SandboxLost,
    TransportError,
    Unauthorized,
    Unenforceable,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "ROUTES",
    "LendboxError",
    "TransportError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "ImageNotFound",
    "MethodNotAllowed",
    "Conflict",
    "Gone",
    "SandboxLost",
    "PayloadTooLarge",
    "RangeNotSatisfiable",
    "Unenforceable",
    "Overloaded",
    "InternalError",
    "NotImplementedByServer",
    "ProviderError",
    "Draining",
]
