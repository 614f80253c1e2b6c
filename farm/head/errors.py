"""FarmError → gRPC status, in one place, for unary and server-streaming handlers."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from pydantic import ValidationError

from farm.core.errors import FarmError, UserError

log = logging.getLogger("farm.head")
Reply = TypeVar("Reply")


def status_of(error: FarmError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.grpc_status, grpc.StatusCode.INTERNAL)


def request_error(exc: ValidationError) -> UserError:
    """A request whose fields the wire types allow but Farm's models refuse (an empty backend name, an unknown power
    source): the sender's mistake, in one line, rather than an unhandled exception (UNKNOWN)."""
    problem = exc.errors()[0]
    field = ".".join(str(part) for part in problem["loc"])
    return UserError(f"malformed request: {exc.title}{'.' + field if field else ''}: {problem['msg']}")


def unary(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Reply]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Reply]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Reply:
        try:
            return await handler(self, request, context)
        except (FarmError, ValidationError) as caught:
            exc = caught if isinstance(caught, FarmError) else request_error(caught)
            log.info("%s refused: %s", handler.__name__, exc.message)
            await context.abort(status_of(exc), exc.message)
            raise  # abort raises; this line is never reached

    return wrapper


def streaming(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Reply]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Reply]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Reply]:
        try:
            async for reply in handler(self, request, context):
                yield reply
        except (FarmError, ValidationError) as caught:
            exc = caught if isinstance(caught, FarmError) else request_error(caught)
            log.info("%s refused: %s", handler.__name__, exc.message)
            await context.abort(status_of(exc), exc.message)

    return wrapper
