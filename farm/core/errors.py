"""One error hierarchy for all of Farm.

Each error knows its gRPC status name (mapped to a status code in farm.head.errors) and its CLI exit code, so that a
user sees one line and a meaningful exit status whichever layer the problem came from.
"""

from __future__ import annotations


class FarmError(Exception):
    """Base of every error Farm reports to a user."""

    grpc_status = "INTERNAL"
    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UserError(FarmError):
    """The user asked for something that cannot be done as asked: exit code 2."""

    exit_code = 2
    grpc_status = "INVALID_ARGUMENT"


class SpecError(UserError):
    """A job spec that is missing, malformed or refers to code or data that does not load."""


class AuthError(UserError):
    grpc_status = "UNAUTHENTICATED"


class NotFoundError(UserError):
    grpc_status = "NOT_FOUND"


class ConflictError(UserError):
    """The request is valid but the target's state forbids it (cancelling a finished job)."""

    grpc_status = "FAILED_PRECONDITION"


class RateLimitError(UserError):
    """Too many of something in too short a time (new nodes on one join token): try again later, as the message says."""

    grpc_status = "RESOURCE_EXHAUSTED"


class HeadUnavailableError(UserError):
    """No head answers where the CLI looked for one."""

    grpc_status = "UNAVAILABLE"


class DataError(UserError):
    """A malformed input (a bad row, a truncated file, an image that does not decode), named by its file and row:
    it fails the shard that read it, not the job's other shards. `rows`: the smallest range [start, stop) that does
    not read, in the dataset plan's units (row ids; bytes of line files), where the reader knows it: the head then
    runs the shard's other rows apart (farm.scheduler.bad_rows)."""

    def __init__(self, message: str, rows: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.rows = rows


class AgentError(FarmError):
    """The node agent could not do its part (start Ray, reach the head)."""


ERRORS_BY_STATUS: dict[str, type[FarmError]] = {
    cls.grpc_status: cls
    for cls in (FarmError, UserError, AuthError, NotFoundError, ConflictError, HeadUnavailableError, RateLimitError)
}
