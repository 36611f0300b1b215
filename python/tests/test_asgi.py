"""The ASGI middleware under a real uvicorn server and a real HTTP client (httpx): the
proxy's contract in-process (SPEC §13, docs/proxy.md)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import uvicorn

import idem
from conftest import HERE, eventually, python_env
from idem.asgi import decode_record

sys.path.insert(0, str(HERE / "helpers"))
from asgi_app import make_app  # noqa: E402


class Server:
    """uvicorn serving `app` on a free loopback port, in a thread of this process."""

    def __init__(self, app) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="error", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.start()
        eventually(lambda: self.server.started, "uvicorn to start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture
def service(store):
    executor = idem.Executor(store)
    servers = []

    def start(**options):
        app = make_app(executor, **options)
        server = Server(app)
        servers.append(server)
        return server, app

    yield start
    for s in servers:
        s.stop()
    executor.close(timeout=0)


def key() -> str:
    return f'"{uuid.uuid4()}"'


def test_a_retry_gets_the_recorded_answer(service):
    server, app = service()
    k = key()
    with httpx.Client(base_url=server.url) as c:
        first = c.post("/orders", content=b"sku=42", headers={"Idempotency-Key": k})
        assert first.status_code == 201
        assert "idempotent-replayed" not in first.headers
        body = first.json()
        # The handler saw the fencing token in request.state and in the headers.
        assert body["token"] is not None and body["header_token"] == str(body["token"])
        assert body["number"] == 1 and body["header_attempt"] == "1"
        again = c.post("/orders", content=b"sku=42", headers={"Idempotency-Key": k})
        assert again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        assert again.headers["x-order"] == first.headers["x-order"]
    assert app.state.runs == ["sku=42"]


def test_the_same_key_on_another_request_is_422(service):
    server, app = service()
    k = key()
    with httpx.Client(base_url=server.url) as c:
        assert c.post("/orders", content=b"a", headers={"Idempotency-Key": k}).status_code == 201
        r = c.post("/orders", content=b"b", headers={"Idempotency-Key": k})
        assert r.status_code == 422
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "key-reuse"
    assert app.state.runs == ["a"]


def test_missing_and_malformed_keys(service):
    server, app = service()
    with httpx.Client(base_url=server.url) as c:
        # No key: passes through, twice.
        assert c.post("/orders", content=b"x").status_code == 201
        assert c.post("/orders", content=b"x").status_code == 201
        r = c.post("/orders", content=b"x", headers={"Idempotency-Key": '"unclosed'})
        assert r.status_code == 400 and r.json()["code"] == "bad-key"
        r = c.post("/orders", content=b"x", headers={"Idempotency-Key": '""'})
        assert r.status_code == 400
        # Methods that are not configured pass through whatever their headers.
        assert c.get("/orders", headers={"Idempotency-Key": '"g"'}).status_code == 201
        assert c.get("/orders", headers={"Idempotency-Key": '"g"'}).status_code == 201
    assert len(app.state.runs) == 4
    strict, app2 = service(require_key=True)
    with httpx.Client(base_url=strict.url) as c:
        r = c.post("/orders", content=b"x")
        assert r.status_code == 400 and r.json()["code"] == "missing-key"
    assert app2.state.runs == []


def test_a_duplicate_in_flight_gets_409_or_waits(service):
    server, app = service()
    waiting, _ = service(wait=30)  # another server, on the same executor
    k = key()
    # One host name for both, as behind a load balancer (the host is part of the scope).
    h = {"Idempotency-Key": k, "Host": "shop.example"}

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            slow = asyncio.create_task(
                c.post("/orders", content=b"slow", headers={**h, "X-Work-Seconds": "1"})
            )
            await asyncio.sleep(0.3)
            busy = await c.post("/orders", content=b"slow", headers=h)
            assert busy.status_code == 409 and busy.json()["code"] == "in-progress"
            assert int(busy.headers["retry-after"]) >= 1
            async with httpx.AsyncClient(base_url=waiting.url, timeout=60) as w:
                waited = await w.post("/orders", content=b"slow", headers=h)
            first = await slow
            assert waited.status_code == 201 and waited.content == first.content
            assert waited.headers["idempotent-replayed"] == "true"

    asyncio.run(main())
    assert app.state.runs == ["slow"]


def test_answers_that_say_nothing_ran_release_the_key(service):
    server, app = service()
    k = key()
    with httpx.Client(base_url=server.url) as c:
        for status in (503, 429):
            r = c.post("/orders", content=b"x", headers={"Idempotency-Key": k, "X-Status": str(status)})
            assert r.status_code == status
        ok = c.post("/orders", content=b"x", headers={"Idempotency-Key": k})
        assert ok.status_code == 201 and "idempotent-replayed" not in ok.headers
        assert ok.json()["number"] == 1  # released, not taken over
        # A 4xx that ran is recorded.
        k2 = key()
        assert c.post("/orders", content=b"y", headers={"Idempotency-Key": k2, "X-Status": "404"}).status_code == 404
        r = c.post("/orders", content=b"y", headers={"Idempotency-Key": k2})
        assert r.status_code == 404 and r.headers["idempotent-replayed"] == "true"
    assert len(app.state.runs) == 4


def test_a_handler_that_raises_releases_the_key(service):
    server, app = service()
    k = key()
    for _ in range(2):
        # A connection each: uvicorn closes one whose application raised.
        with httpx.Client(base_url=server.url) as c:
            assert c.post("/fail", headers={"Idempotency-Key": k}).status_code == 500
    assert app.state.runs == ["fail", "fail"]


def test_credentials_and_hosts_keep_records_apart(service):
    server, app = service()
    k = key()
    with httpx.Client(base_url=server.url) as c:
        alice = c.post("/orders", content=b"x", headers={"Idempotency-Key": k, "Authorization": "Bearer alice"})
        bob = c.post("/orders", content=b"x", headers={"Idempotency-Key": k, "Authorization": "Bearer bob"})
        assert "idempotent-replayed" not in bob.headers and bob.json()["order"] != alice.json()["order"]
        again = c.post("/orders", content=b"x", headers={"Idempotency-Key": k, "Authorization": "Bearer alice"})
        assert again.headers["idempotent-replayed"] == "true" and again.content == alice.content
        other_host = c.post("/orders", content=b"x",
                            headers={"Idempotency-Key": k, "Authorization": "Bearer alice", "Host": "b.example"})
        assert "idempotent-replayed" not in other_host.headers
    assert len(app.state.runs) == 3


def test_a_cookie_is_never_replayed_to_a_request_without_credentials(service):
    server, app = service()
    k = key()
    with httpx.Client(base_url=server.url) as c:
        first = c.post("/login", headers={"Idempotency-Key": k})
        assert "session=secret-1" in first.headers["set-cookie"]
    with httpx.Client(base_url=server.url) as c:
        again = c.post("/login", headers={"Idempotency-Key": k})
        assert again.headers["idempotent-replayed"] == "true" and again.text == "welcome"
        assert "set-cookie" not in again.headers
    assert app.state.runs == ["login"]


def test_an_answer_too_large_to_record_never_runs_twice(service):
    # The answer streams out before its marker is recorded; the retry waits for the marker.
    server, app = service(max_record=10_000, wait=30)
    k = key()
    with httpx.Client(base_url=server.url) as c:
        first = c.post("/big?size=50000", headers={"Idempotency-Key": k})
        assert first.status_code == 200 and len(first.content) == 50000
        assert first.headers["idempotency-not-recorded"] == "too-large"
        again = c.post("/big?size=50000", headers={"Idempotency-Key": k})
        assert again.status_code == 409 and again.json()["code"] == "not-replayable"
    assert app.state.runs == ["big"]


def test_records_are_in_the_proxys_format(service, store):
    server, app = service(scope="orders")
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/orders", content=b"z", headers={"Idempotency-Key": "plain-token"})
    host = f"127.0.0.1:{server.url.rsplit(':', 1)[1]}"
    record = store.get(f"h{len(host)}:{host} orders", "plain-token")
    flags, status, headers, body = decode_record(record["payload"])
    assert flags == 0 and status == 201 and body == r.content
    assert (b"x-order", b"1") in headers
    assert record["fingerprint"]


def test_a_store_that_fails_answers_503_and_the_handler_does_not_run(tmp_path):
    executor = idem.Executor(f"sqlite://{tmp_path / 'x.db'}")
    app = make_app(executor)
    server = Server(app)
    try:
        executor.close(timeout=0)  # every call now fails: ShutDown
        with httpx.Client(base_url=server.url) as c:
            r = c.post("/orders", content=b"x", headers={"Idempotency-Key": key()})
        assert r.status_code == 503 and r.json()["code"] == "store-unavailable"
        assert "sqlite" not in r.text and str(tmp_path) not in r.text
        assert app.state.runs == []
    finally:
        server.stop()


def test_two_uvicorn_processes_on_one_store_run_a_key_once(shared_url, tmp_path):
    runs = tmp_path / "runs.txt"
    runs.touch()
    procs, urls = [], []
    env = python_env()
    env.update(IDEM_APP_STORE=shared_url, IDEM_APP_RUNS=str(runs), IDEM_APP_WAIT="30")
    env["PYTHONPATH"] += os.pathsep + str(HERE / "helpers")
    socks = []
    try:
        for _ in range(2):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            socks.append(sock)
            urls.append("http://127.0.0.1:%d" % sock.getsockname()[1])
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "asgi_app:from_env", "--factory",
                 "--fd", str(sock.fileno()), "--log-level", "error", "--lifespan", "off"],
                env=env, pass_fds=[sock.fileno()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT))

        async def main():
            k = key()
            async with httpx.AsyncClient(timeout=60) as c:
                async def post(i):
                    return await c.post(urls[i % 2] + "/orders", content=b"raced",
                                        headers={"Idempotency-Key": k, "X-Work-Seconds": "0.2",
                                                 "Host": "shop.example"})

                for attempt in range(100):  # until both servers answer
                    try:
                        await asyncio.gather(*(c.get(u + "/orders") for u in urls))
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)
                rs = await asyncio.gather(*(post(i) for i in range(20)))
            assert {r.status_code for r in rs} == {201}
            assert len({r.content for r in rs}) == 1
            assert sum("idempotent-replayed" not in r.headers for r in rs) == 1

        asyncio.run(main())
        lines = [l for l in runs.read_text().splitlines() if l.startswith("raced")]
        assert len(lines) == 1, lines
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in socks:
            s.close()
