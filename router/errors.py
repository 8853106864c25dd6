"""OpenAI-shaped errors: every error the router makes itself is
``{"error": {"message", "type", "param", "code"}}`` with ``code`` a string (what the
OpenAI SDKs parse), raised as ``RouterError`` by any step and rendered once by the app.
Errors a replica answers are passed through as they are (status and body)."""

from __future__ import annotations

import json


class RouterError(Exception):
    """A request the router refuses or cannot serve. ``reason`` labels the
    ``anchorage_router_rejected_total`` series (None: not counted there)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 reason: str | None = "invalid_request", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.code = code or type_
        self.param, self.reason, self.headers = param, reason, headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param,
                                 "code": str(code)}}).encode()


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> RouterError:
    return RouterError(400, message, "invalid_request_error", code, param)


def model_not_found(model: str) -> RouterError:
    return RouterError(404, f"The model `{model}` does not exist.", "invalid_request_error",
                       "model_not_found", "model", reason="model_not_found")


def unavailable(message: str) -> RouterError:
    return RouterError(503, message, "service_unavailable", "service_unavailable",
                       reason="unavailable")


def saturated(retry_after_s: int) -> RouterError:
    return RouterError(429, "every replica is at capacity; retry later", "rate_limit_error",
                       "saturated", reason="saturated",
                       headers={"retry-after": str(retry_after_s)})
