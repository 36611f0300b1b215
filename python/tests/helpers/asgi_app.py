"""A Starlette service behind IdempotencyMiddleware, for test_asgi.py (in-process and as a
uvicorn process of its own: `python -m uvicorn asgi_app:from_env --factory --fd N`)."""

from __future__ import annotations

import asyncio
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import idem
from idem.asgi import IdempotencyMiddleware


def make_app(executor: idem.Executor, runs_file: str | None = None, **options) -> Starlette:
    runs: list = []

    def note(what: str) -> None:
        runs.append(what)
        if runs_file:
            with open(runs_file, "a") as f:  # O_APPEND: one line per run, from any process
                f.write(f"{what} {os.getpid()}\n")

    async def orders(request: Request) -> Response:
        body = await request.body()
        attempt = request.state.idempotency if hasattr(request.state, "idempotency") else None
        await asyncio.sleep(float(request.headers.get("x-work-seconds", "0")))
        note(body.decode())
        status = int(request.headers.get("x-status", "201"))
        return JSONResponse(
            {
                "order": len(runs),
                "body": body.decode(),
                "token": attempt.token if attempt else None,
                "number": attempt.number if attempt else None,
                "header_token": request.headers.get("idempotency-token"),
                "header_attempt": request.headers.get("idempotency-attempt"),
            },
            status_code=status,
            headers={"x-order": str(len(runs))},
        )

    async def fail(request: Request) -> Response:
        note("fail")
        raise RuntimeError("the handler failed")

    async def big(request: Request) -> Response:
        note("big")
        size = int(request.query_params["size"])

        async def chunks():
            for _ in range(size // 1000):
                yield b"x" * 1000

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def login(request: Request) -> Response:
        note("login")
        r = PlainTextResponse("welcome")
        r.set_cookie("session", f"secret-{len(runs)}")
        return r

    app = Starlette(
        routes=[
            Route("/orders", orders, methods=["POST", "PATCH", "GET"]),
            Route("/fail", fail, methods=["POST"]),
            Route("/big", big, methods=["POST"]),
            Route("/login", login, methods=["POST"]),
        ]
    )
    app.add_middleware(IdempotencyMiddleware, executor=executor, **options)
    app.state.runs = runs
    return app


def from_env() -> Starlette:
    """For a uvicorn process: the store from IDEM_APP_STORE, runs noted in IDEM_APP_RUNS."""
    executor = idem.Executor(os.environ["IDEM_APP_STORE"])
    return make_app(executor, os.environ["IDEM_APP_RUNS"], wait=float(os.environ.get("IDEM_APP_WAIT", "0")))
