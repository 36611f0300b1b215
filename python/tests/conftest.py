"""Fixtures: one store of each kind, fresh scopes, and helpers shared by the test files.

Server stores come from IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL (scripts/servers.sh).
A missing one skips its cases, or fails them under IDEM_REQUIRE_SERVERS=1 (scripts/test.sh,
CI), as the C++ tests do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

import idem

HERE = Path(__file__).resolve().parent
STORES = ["memory", "sqlite", "postgres", "redis"]
SERVER_ENV = {"postgres": "IDEM_TEST_POSTGRES_URL", "redis": "IDEM_TEST_REDIS_URL"}


def servers_required() -> bool:
    return os.environ.get("IDEM_REQUIRE_SERVERS") == "1"


def server_url(kind: str) -> str:
    """The URL of a server store, or skip (fail under IDEM_REQUIRE_SERVERS=1)."""
    variable = SERVER_ENV[kind]
    url = os.environ.get(variable, "")
    if not url:
        why = f"{variable} is not set (source scripts/servers.sh; idem_start_{kind})"
        if servers_required():
            pytest.fail(f"IDEM_REQUIRE_SERVERS=1 but {why}")
        pytest.skip(why)
    return url


def store_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'idem.db'}"
    return server_url(kind)


@pytest.fixture(params=STORES)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def shared_kind(request: pytest.FixtureRequest) -> str:
    """Stores that several processes share."""
    return request.param


@pytest.fixture
def url(kind: str, tmp_path: Path) -> str:
    return store_url(kind, tmp_path)


@pytest.fixture
def shared_url(shared_kind: str, tmp_path: Path) -> str:
    return store_url(shared_kind, tmp_path)


@pytest.fixture
def store(url: str) -> idem.Store:
    """One store object (a memory store is private to its object: share this one)."""
    return idem.open_store(url)


@pytest.fixture
def scope() -> str:
    """A scope no other test (or earlier run on the same server) has used."""
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def executor(store: idem.Store):
    ex = idem.Executor(store)
    yield ex
    ex.close(timeout=0)


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Polls until check() holds; fails naming `what` after `timeout` (a hang guard, not a
    speed assertion)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def python_env() -> dict:
    """The environment for child Python processes: this package on their path."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p, "idem", "__init__.py").exists()]
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(HERE)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def spawn(script: str, *args: str, **kwargs) -> subprocess.Popen:
    """A child Python process running tests/helpers/<script> with this interpreter."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "helpers" / script), *args],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
