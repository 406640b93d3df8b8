"""The one exception tree of trainport.

::

    TrainportError
    ├── ValidationError        a request or input that cannot be accepted (ValidationException)
    │   └── NotFoundError      a job or object that does not exist (ValidationException)
    ├── ResourceInUseError     a job name that is already taken (ResourceInUse)
    ├── StoreError             the object store failed or cannot be reached
    ├── DatabaseError          the job database cannot be read or written (a full disk,
    │                          a damaged or empty file)
    ├── SandboxError           the sandbox runner cannot isolate a job on this machine
    └── JobError               a job-level failure while running (reported as FailureReason)

Every message names the field, object or job involved and says what to do about it.
Foreign exceptions are translated at the boundary with ``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "DatabaseError",
    "JobError",
    "NotFoundError",
    "ResourceInUseError",
    "SandboxError",
    "StoreError",
    "TrainportError",
    "ValidationError",
]


class TrainportError(Exception):
    """Root of every error trainport raises on purpose."""

    #: The error code the SageMaker API uses for this class of error.
    api_code = "InternalFailure"


class ValidationError(TrainportError):
    api_code = "ValidationException"


class NotFoundError(ValidationError):
    api_code = "ValidationException"


class ResourceInUseError(TrainportError):
    api_code = "ResourceInUse"


class StoreError(TrainportError):
    api_code = "ValidationException"


class DatabaseError(TrainportError):
    pass


class SandboxError(TrainportError):
    pass


class JobError(TrainportError):
    pass
