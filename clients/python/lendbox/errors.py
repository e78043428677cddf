"""Exceptions raised by the lendbox clients.

Every HTTP error of lendboxd is a JSON body ``{"error": {"code": str, "message": str}}`` with a
status from the API contract (docs/api.md). The clients raise it as one exception class,
:class:`LendboxError`, carrying ``status`` (int, the HTTP status; 0 when no answer came),
``code`` (the contract's error code, e.g. ``"not_found"``) and ``message`` (the daemon's
sentence), plus ``request_id`` (the ``X-Request-Id`` of the answer, for the daemon's log).

Catch :class:`LendboxError` for everything, or one of the subclasses below, chosen by status:

=====  ==========================  ==============================================================
 400   :class:`BadRequest`         malformed body, unknown field, bad id or path
 401   :class:`Unauthorized`       no token or an unknown one
 403   :class:`Forbidden`          an operate token on an admin route or another sandbox
 404   :class:`NotFound`           unknown session, sandbox, file, route (``image_not_found``:
                                   :class:`ImageNotFound`)
 405   :class:`MethodNotAllowed`   known path, wrong method
 409   :class:`Conflict`           other ``task_id`` for a live session, activation already run,
                                   paused sandbox, busy session
 410   :class:`Gone`               a PTY output offset older than the kept window
                                   (``sandbox_lost``: :class:`SandboxLost`, the sandbox died
                                   under you: drop the episode, seed again)
 413   :class:`PayloadTooLarge`    body over the limit, sandbox storage full
 416   :class:`RangeNotSatisfiable`
 422   :class:`Unenforceable`      a network policy, resource or spec field the provider cannot
                                   honour (e.g. ``gpu``)
 429   :class:`Overloaded`         queue full, ``max_sandboxes`` reached, too many sandboxes
                                   starting (retry after ``retry_after_s``)
 500   :class:`InternalError`      a daemon bug (logged with ``request_id``)
 501   :class:`NotImplementedByServer`  route or capability not built (also a
                                   ``NotImplementedError``)
 502   :class:`ProviderError`      the provider failed (create, stop, exec transport); records kept
 503   :class:`Draining`           starting up, shutting down or state dir full (retry later)
   0   :class:`TransportError`     no HTTP answer: connection refused or reset, timeout
=====  ==========================  ==============================================================
"""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
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
    "error_for",
]


class LendboxError(Exception):
    """An error answer of lendboxd (or no answer at all: :class:`TransportError`).

    Attributes:
        status: HTTP status (int); 0 when the daemon could not be reached.
        code: the contract's error code (``"not_found"``, ``"conflict"``, ...; ``"transport"``
            for :class:`TransportError`).
        message: the daemon's one-sentence explanation.
        request_id: the answer's ``X-Request-Id`` or None.
    """

    def __init__(self, status: int, code: str, message: str, request_id: Optional[str] = None):
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id


class TransportError(LendboxError):
    """No HTTP answer (connection refused or reset, timeout). ``status`` is 0."""

    def __init__(self, message: str):
        super().__init__(0, "transport", message)


class BadRequest(LendboxError):
    """400 ``bad_request``."""


class Unauthorized(LendboxError):
    """401 ``unauthorized``."""


class Forbidden(LendboxError):
    """403 ``forbidden``."""


class NotFound(LendboxError):
    """404 ``not_found`` (and ``image_not_found``)."""


class ImageNotFound(NotFound):
    """404 ``image_not_found``: the image name is not in the daemon's image store."""


class MethodNotAllowed(LendboxError):
    """405 ``method_not_allowed``."""


class Conflict(LendboxError):
    """409 ``conflict``."""


class Gone(LendboxError):
    """410 ``gone`` (and ``sandbox_lost``)."""


class SandboxLost(Gone):
    """410 ``sandbox_lost``: the sandbox's init died outside lendbox's control (killed, out of
    memory, its container removed); its record is stopped with reason ``lost``, and every
    operation on it answers this. An infrastructure failure, not the episode's: mask the episode
    and seed the session again for a new sandbox."""


class PayloadTooLarge(LendboxError):
    """413 ``payload_too_large``."""


class RangeNotSatisfiable(LendboxError):
    """416 ``range_not_satisfiable``."""


class Unenforceable(LendboxError):
    """422 ``unenforceable``."""


class Overloaded(LendboxError):
    """429 ``overloaded``: refused without effect; retry later.

    Attributes:
        retry_after_s: the answer's ``Retry-After`` in seconds (float), or None without one.
    """

    retry_after_s: Optional[float] = None


class InternalError(LendboxError):
    """500 ``internal``."""


class NotImplementedByServer(LendboxError, NotImplementedError):
    """501 ``not_implemented``: a contract route or capability the daemon has not built."""


class ProviderError(LendboxError):
    """502 ``provider_error``."""


class Draining(LendboxError):
    """503 ``draining``."""


_BY_STATUS: Dict[int, Type[LendboxError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    416: RangeNotSatisfiable,
    422: Unenforceable,
    429: Overloaded,
    500: InternalError,
    501: NotImplementedByServer,
    502: ProviderError,
    503: Draining,
}

_BY_CODE: Dict[str, Type[LendboxError]] = {
    "image_not_found": ImageNotFound,
    "sandbox_lost": SandboxLost,
}


def error_for(status: int, code: str, message: str, request_id: Optional[str] = None) -> LendboxError:
    """The exception for an error answer: the subclass of its status (``ImageNotFound`` for
    code ``image_not_found``, ``SandboxLost`` for ``sandbox_lost``), or :class:`LendboxError`
    itself for any other status."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, LendboxError)
    return cls(status, code, message, request_id)
