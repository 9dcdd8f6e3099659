"""The interactive API docs render in a real browser with nothing fetched from outside.

A small clinic API is served by uvicorn on 127.0.0.1 with ``install_docs`` and the
request context middleware, and Debian's Chromium opens /docs.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, expect, sync_playwright
from pydantic import BaseModel

from platform_api.docs import install_docs
from platform_api.observability import RequestContextMiddleware
from tests.browser_support import launch_chromium, run_server

pytestmark = pytest.mark.browser


class Appointment(BaseModel):
    patient_id: str
    practitioner_id: str
    start: str


def build_clinic_app() -> FastAPI:
    app = FastAPI(title="Clinic API", docs_url=None, redoc_url=None)

    @app.get("/patients/{patient_id}", tags=["patients"], summary="Read a patient")
    async def read_patient(patient_id: str) -> dict[str, str]:
        return {"id": patient_id, "family": "Odhiambo", "given": "Amina"}

    @app.post("/appointments", tags=["scheduling"], summary="Book an appointment", status_code=201)
    async def book_appointment(appointment: Appointment) -> Appointment:
        return appointment

    install_docs(app)
    app.add_middleware(RequestContextMiddleware, access_log=False)
    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with run_server(build_clinic_app()) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


class PageRecorder:
    """Every URL the browser asked for and every console error or uncaught exception."""

    def __init__(self, context: BrowserContext) -> None:
        self.urls: list[str] = []
        self.errors: list[str] = []
        context.on("request", lambda request: self.urls.append(request.url))
        context.on("console", self._on_console)
        context.on("weberror", lambda error: self.errors.append(str(error.error)))

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"{message.text} at {message.location}")

    def urls_leaving_localhost(self) -> list[str]:
        # data: and blob: URLs are made inside the page and fetch nothing.
        return [
            url
            for url in self.urls
            if urlsplit(url).scheme not in ("data", "blob")
            and urlsplit(url).hostname != "127.0.0.1"
        ]


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    yield context
    context.close()


def test_swagger_ui_renders_operations_from_openapi_json_using_only_local_assets(
    base_url: str, context: BrowserContext
) -> None:
    recorder = PageRecorder(context)
    page = context.new_page()

    response = page.goto(f"{base_url}/docs")

    assert response is not None and response.ok
    assert response.headers["x-request-id"]
    read_patient = page.locator(".opblock-get").filter(has_text="/patients/{patient_id}")
    expect(read_patient).to_be_visible()
    expect(read_patient).to_contain_text("Read a patient")
    expect(page.locator(".opblock-post").filter(has_text="/appointments")).to_be_visible()
    # Let late requests (favicon, fonts) and their errors arrive before judging them.
    page.wait_for_load_state("networkidle")
    assert f"{base_url}/openapi.json" in recorder.urls
    assert f"{base_url}/docs/static/swagger-ui-bundle.js" in recorder.urls
    assert recorder.urls_leaving_localhost() == []
    assert recorder.errors == []


def test_the_real_app_docs_render_every_area_offline(tmp_path, context: BrowserContext) -> None:
    from platform_api.app import create_app
    from tests.conftest import make_settings

    recorder = PageRecorder(context)
    with run_server(create_app(make_settings(tmp_path))) as url:
        page = context.new_page()
        response = page.goto(f"{url}/docs")
        assert response is not None and response.ok
        # The first request for /openapi.json builds the document (305 paths, 1.2 MB):
        # 3 s on a quiet machine, more than the 5 s default wait while the suite runs
        # beside it (CI saw the page still "loading").
        expect(page.locator(".opblock-post").filter(has_text="/api/auth/login").first
               ).to_be_visible(timeout=60_000)
        expect(page.locator(".opblock-post").filter(has_text="/api/patients").first
               ).to_be_visible()
        expect(page.locator(".opblock").filter(has_text="/fhir/{resource_type}/{resource_id}")
               .first).to_be_visible()
        page.wait_for_load_state("networkidle")
        assert recorder.urls_leaving_localhost() == []
        assert recorder.errors == []
