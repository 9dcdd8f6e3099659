"""Shared fixtures: the whole app on a temporary SQLite store, reached over ASGI."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings

_users = itertools.count(1)


def _stores_line() -> str:
    from tests.contract.conftest import ADAPTERS, mongodb_description

    return (f"store adapters under contract (tests/contract): {', '.join(ADAPTERS)}; "
            f"{mongodb_description()}; app-level tests on {APP_STORE}")


def pytest_report_header(config: pytest.Config) -> str:
    return _stores_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Said again at the end, where ``-q`` (which hides the header) shows it too."""
    terminalreporter.write_line(_stores_line())


# HEALTHPLATFORM_TEST_STORE=mongodb runs the app-level tests on the MongoDB adapter (the
# in-process fake unless HEALTHPLATFORM_TEST_MONGODB_URI names a server); sqlite otherwise.
APP_STORE = os.environ.get("HEALTHPLATFORM_TEST_STORE", "sqlite")


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path, "argon2_time_cost": 1, "argon2_memory_kib": 8192,
        "access_log": False, "log_level": "WARNING",
        # The MPI links certain duplicates in the background, writing Patient.link: on in
        # its own tests (tests/platform_api/mpi), off where tests count versions.
        "mpi_auto_link": False,
    }
    if APP_STORE == "mongodb":
        from tests.contract.conftest import store_url

        values["store"] = store_url("mongodb", tmp_path)
    values.update(overrides)
    return Settings(**values)


def served_at(settings: Settings, base: str) -> None:
    """A server started on a port chosen at start (run_server): its public URL is that
    address, as HEALTHPLATFORM_BASE_URL would say (the request's Host is never used)."""
    settings.base_url = base
    settings.__dict__.pop("public_base_url", None)


@pytest.fixture(scope="session", autouse=True)
def app_store() -> Iterator[None]:
    """With HEALTHPLATFORM_TEST_STORE=mongodb and no server named, the fake serves."""
    from tests.contract.conftest import MONGODB_URI

    if APP_STORE != "mongodb" or MONGODB_URI:
        yield
        return
    from tests.contract.mongo_fake import installed

    with installed():
        yield


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[Any]:
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        yield application


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


async def register_and_login(client: httpx.AsyncClient, *, first_name: str = "Amina",
                             last_name: str = "Odhiambo", role: str | None = None,
                             email: str | None = None) -> dict[str, Any]:
    """Register a fresh user and log in; returns {user, token, refresh_token, device (the
    device cookie), headers}."""
    email = email or f"user{next(_users)}@clinic.example.org"
    payload: dict[str, Any] = {"email": email, "password": "correct horse battery",
                               "first_name": first_name, "last_name": last_name}
    if role:
        payload["registration_role"] = role
    response = await client.post("/api/auth/register", json=payload)
    assert response.status_code == 201, response.text
    login = await client.post("/api/auth/login",
                              json={"email": email, "password": "correct horse battery"})
    assert login.status_code == 200, login.text
    data = login.json()["data"]
    return {"user": data["user"], "token": data["token"],
            "refresh_token": data["refresh_token"], "device": login.cookies.get("hp_device"),
            "headers": {"Authorization": f"Bearer {data['token']}"}}


async def make_admin(app: Any, client: httpx.AsyncClient) -> dict[str, Any]:
    user = await register_and_login(client, first_name="Grace", last_name="Admin")
    await app.state.services.auth.create_admin(user["user"]["email"], "correct horse battery",
                                               "Grace", "Admin")
    login = await client.post("/api/auth/login", json={"email": user["user"]["email"],
                                                       "password": "correct horse battery"})
    token = login.json()["data"]["token"]
    return {**user, "token": token, "headers": {"Authorization": f"Bearer {token}"}}


async def make_clinic_admin(client: httpx.AsyncClient, *, name: str = "Kibera Community "
                            "Clinic", first_name: str = "Wanjiku", last_name: str = "Kamau"
                            ) -> dict[str, Any]:
    """A user who founded an organization (its ORG:ADMIN); ``org_id`` is its id. What they
    write on /fhir is owned by that organization."""
    founder = await register_and_login(client, first_name=first_name, last_name=last_name)
    response = await client.post("/api/organizations", headers=founder["headers"],
                                 json={"name": name, "country": "KE"})
    assert response.status_code == 201, response.text
    return {**founder, "org_id": response.json()["data"]["id"]}


async def add_member(app: Any, org_id: str, user: dict[str, Any], role: str) -> None:
    """Make ``user`` a member of ``org_id`` with ``role`` (the invitation flow's effect)."""
    from platform_api.organizations import MEMBERS, member_document

    services = app.state.services
    member = member_document(org_id, user["user"]["id"], role, user["user"])
    async with services.store.unit_of_work() as uow:
        uow.put_document(MEMBERS, member["id"], member)
        await uow.commit()
    services.policy.membership_changed(user["user"]["id"])


@pytest.fixture
async def user(client: httpx.AsyncClient) -> dict[str, Any]:
    return await register_and_login(client)


@pytest.fixture
async def clinic_admin(client: httpx.AsyncClient) -> dict[str, Any]:
    return await make_clinic_admin(client)


@pytest.fixture
async def admin(app: Any, client: httpx.AsyncClient) -> dict[str, Any]:
    return await make_admin(app, client)
