"""FarmError → gRPC status, in one place, for unary and server-streaming handlers."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from farm.core.errors import FarmError

log = logging.getLogger("farm.head")
Reply = TypeVar("Reply")


def status_of(error: FarmError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.grpc_status, grpc.StatusCode.INTERNAL)


def unary(
    handler: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Reply]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Reply]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Reply:
        try:
            return await handler(self, request, context)
        except FarmError as exc:
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
        except FarmError as exc:
            log.info("%s refused: %s", handler.__name__, exc.message)
            await context.abort(status_of(exc), exc.message)

    return wrapper
