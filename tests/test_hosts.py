"""The `Host` allowlist (functions/http/hosts.py): duly dev's own names, DULY_ALLOWED_HOSTS."""

from __future__ import annotations

import pytest

from functions import examples
from functions.app import create_app
from functions.http.hosts import allowed_hosts_of, dev_hosts, host_allowed, host_name
from functions.local.dev import create_dev_app
from tests.conftest import Database
from tests.helpers import serving


def test_a_host_header_is_named_without_its_port() -> None:
    assert host_name("LocalHost:8000") == "localhost"
    assert host_name("[::1]:8000") == "[::1]"
    assert host_name("[::1]") == "[::1]"
    assert host_name("duly.example") == "duly.example"
    assert host_name("") == ""


def test_a_pattern_allows_subdomains_only() -> None:
    allowed = {"*.duly.example", "api.test"}
    assert host_allowed("a.duly.example", allowed)
    assert host_allowed("api.test", allowed)
    assert not host_allowed("duly.example", allowed)
    assert not host_allowed("evilduly.example", allowed)
    assert not host_allowed("api.test.evil.example", allowed)


def test_duly_dev_answers_to_loopback_and_its_bound_host_unless_told_otherwise() -> None:
    assert dev_hosts("127.0.0.1", {}) == {"localhost", "127.0.0.1", "[::1]"}
    assert dev_hosts("192.168.1.7", {}) == {"localhost", "127.0.0.1", "[::1]", "192.168.1.7"}
    assert dev_hosts("::", {}) == {"localhost", "127.0.0.1", "[::1]", "[::]"}
    told = {"DULY_ALLOWED_HOSTS": " Duly.Example, ,*.lan "}
    assert dev_hosts("127.0.0.1", told) == {"duly.example", "*.lan"}
    assert allowed_hosts_of({}) is None
    assert allowed_hosts_of({"DULY_ALLOWED_HOSTS": " , "}) is None


async def test_duly_devs_app_refuses_a_rebound_host_and_serves_its_own(db: Database) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_dev_app(Session, run_worker=False)) as client:
        port = client.base_url.port
        evil = await client.get("/workflows", headers={"Host": f"evil.example:{port}"})
        evil_write = await client.post(
            "/dev/clock", json={"days": 1}, headers={"Host": "evil.example"}
        )
        own = await client.get("/workflows")  # Host: 127.0.0.1:<port>
        named = await client.get("/workflows", headers={"Host": f"localhost:{port}"})
        ipv6 = await client.get("/console", headers={"Host": f"[::1]:{port}"})
        health = await client.get("/healthz", headers={"Host": "10.0.0.9"})
        shift = await client.post("/dev/clock", json={})
    assert evil.status_code == 421
    assert evil.json() == {
        "detail": "This server does not answer to the host 'evil.example': "
        "add it to DULY_ALLOWED_HOSTS to serve it."
    }
    assert evil.headers["x-content-type-options"] == "nosniff"  # inside SecurityHeaders
    assert evil_write.status_code == 421
    assert shift.json() == {"shift_seconds": 0.0}  # the refused move moved nothing
    assert (own.status_code, named.status_code, ipv6.status_code) == (200, 200, 200)
    assert health.status_code == 200  # a load balancer probes by address


async def test_allowed_hosts_from_the_environment_hold_for_the_deployed_app(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    Session = await db.create(examples.Base.metadata)
    async with serving(create_app(Session, run_worker=False)) as client:
        anywhere = await client.get("/workflows", headers={"Host": "evil.example"})
    monkeypatch.setenv("DULY_ALLOWED_HOSTS", "duly.example,*.duly.example")
    async with serving(create_app(Session, run_worker=False)) as client:
        named = await client.get("/workflows", headers={"Host": "duly.example"})
        sub = await client.get("/workflows", headers={"Host": "eu.duly.example:443"})
        loopback = await client.get("/workflows")
        evil = await client.get("/workflows", headers={"Host": "evil.example"})
    assert anywhere.status_code == 200  # unset: any host
    assert (named.status_code, sub.status_code) == (200, 200)
    assert (loopback.status_code, evil.status_code) == (421, 421)
