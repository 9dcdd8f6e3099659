"""Interactive API docs (Swagger UI at /docs) that work offline.

FastAPI's own docs page loads Swagger UI from a CDN; the machines this service runs on
may have no way out, so the page here loads every asset (JS, CSS, favicon) from the app
itself. The assets come from the ``fastapi-offline`` package, which ships the
``swagger-ui-dist`` bundle; only its static files are used, not its ``FastAPIOffline``
factory, so the app is still built with a plain ``FastAPI(...)``.

No ReDoc page: ReDoc 2 always loads its logo from the Redocly CDN, so it cannot be
served without a request leaving the machine.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

from platform_api.security_headers import allow_inline_scripts

__all__ = ["DOCS_URL", "STATIC_URL", "install_docs"]

DOCS_URL = "/docs"
STATIC_URL = "/docs/static"
# The package, and the folder inside it, holding swagger-ui-bundle.js, swagger-ui.css and
# favicon.png.
ASSETS_PACKAGE = ("fastapi_offline", "static")


def install_docs(app: FastAPI, pages: Mapping[str, tuple[str, str]] | None = None) -> None:
    """Serve Swagger UI at ``/docs``, and its OAuth2 redirect page, from local assets.

    The app must be created with ``docs_url=None, redoc_url=None`` (FastAPI's CDN pages
    would otherwise be served too) and must keep its ``openapi_url``. ``pages``: more
    Swagger UI pages, ``{path: (title, url of their OpenAPI document)}``.
    """
    if app.openapi_url is None:
        raise ValueError("install_docs needs the OpenAPI schema; the app has openapi_url=None")
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError(
            "install_docs replaces FastAPI's CDN docs pages; "
            "create the app with FastAPI(docs_url=None, redoc_url=None)"
        )
    openapi_url = app.openapi_url
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url

    app.mount(STATIC_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-static")

    def page(path: str, title: str, document_url: str) -> None:
        @app.get(path, include_in_schema=False)
        async def swagger_ui(request: Request) -> HTMLResponse:
            return _swagger_page(app, request, title, document_url)

    page(DOCS_URL, app.title, openapi_url)
    for path, (title, document_url) in (pages or {}).items():
        page(path, title, document_url)

    if oauth2_redirect_url:

        @app.get(oauth2_redirect_url, include_in_schema=False)
        async def swagger_ui_oauth2_redirect() -> HTMLResponse:
            return allow_inline_scripts(get_swagger_ui_oauth2_redirect_html())


def _swagger_page(app: FastAPI, request: Request, title: str, openapi_url: str
                  ) -> HTMLResponse:
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url
    root = request.scope.get("root_path", "").rstrip("/")
    return allow_inline_scripts(get_swagger_ui_html(
        openapi_url=f"{root}{openapi_url}",
        title=f"{title} - Swagger UI",
        swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
        oauth2_redirect_url=f"{root}{oauth2_redirect_url}" if oauth2_redirect_url else None,
        init_oauth=app.swagger_ui_init_oauth,
        # validatorUrl None: Swagger UI would otherwise send the schema to an
        # online validator.
        swagger_ui_parameters={"validatorUrl": None, **(app.swagger_ui_parameters or {})},
    ))
