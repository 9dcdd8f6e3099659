"""``/oauth2/manage`` (SMART ``management_endpoint``): where a user sees which apps can
reach their records and revokes them.

The user signs in on the page (password, then the second factor when they have MFA, as
on the authorization pages); the page then lists their live SMART authorizations (the
``smart`` refresh-token families: app, scopes, patient, since when) with a button that
revokes one at once (its access and refresh tokens stop working). The signed-in page is
a ``smart_manage_sessions`` document under the SHA-256 of a random id carried by the page
and bound to the browser's cookie, valid ``HEALTHPLATFORM_SMART_AUTHORIZE_TTL_SECONDS``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from platform_api.auth.dependencies import client_info
from platform_api.auth.refresh import FAMILIES
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError
from platform_api.smart import pages
from platform_api.smart.authorize import COOKIE, PAGE_ANSWERS, request_hash
from platform_api.smart.oauth import MANAGE_PATH, MANAGE_SESSIONS, SMART_FAMILY
from platform_api.smart.server import SmartServer, smart_server

router = APIRouter(tags=["SMART authorization server"])
JSON = dict[str, Any]
SESSIONS = MANAGE_SESSIONS
MFA_PATH = f"{MANAGE_PATH}/mfa"
APPS_PATH = f"{MANAGE_PATH}/apps"


@router.get(MANAGE_PATH, summary="Apps with access to your records: sign in",
            response_class=Response, responses=PAGE_ANSWERS)
async def manage(request: Request) -> Response:
    response = pages.sign_in_page(MANAGE_PATH, "", {})
    if COOKIE not in request.cookies:
        response.set_cookie(COOKIE, secrets.token_urlsafe(32), httponly=True, samesite="lax",
                            secure=request.url.scheme == "https", path="/oauth2")
    return response


@router.post(MANAGE_PATH, summary="Apps with access to your records: signed in",
             response_class=Response, responses=PAGE_ANSWERS)
async def manage_sign_in(request: Request) -> Response:
    server = smart_server(request)
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    browser = request.cookies.get(COOKIE)
    if not browser:
        return pages.error_page("Cookies are needed to manage your apps: reload the page.")
    auth = server.services.auth
    try:
        user = await auth.verify_password(form.get("email", ""), form.get("password", ""),
                                          client_info(request))
    except ApiError as refused:
        return pages.sign_in_page(MANAGE_PATH, "", {}, refused.message,
                                  form.get("email", ""), pages.refusal_status(refused.status))
    session_id = secrets.token_urlsafe(32)
    session: JSON = {"id": request_hash(session_id), "browser": request_hash(browser),
                     "user_id": user["id"], "mfa": None, "expires_at": rfc3339(
                         time.time() + server.settings.smart_authorize_ttl_seconds)}
    if await auth.mfa.is_active(user["id"]):
        challenge = await auth.mfa.open_challenge(user["id"], "smart-manage")
        session["mfa"] = request_hash(challenge.mfa_token)
        await _save(server, session)
        return pages.mfa_page(MFA_PATH, {"session": session_id,
                                         "mfa_token": challenge.mfa_token})
    await _save(server, session)
    return await _apps(server, session, session_id)


@router.post(MFA_PATH, summary="Apps with access to your records: second factor",
             response_class=Response, responses=PAGE_ANSWERS)
async def manage_mfa(request: Request) -> Response:
    server = smart_server(request)
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    session = await _session(server, request, form)
    mfa_token = form.get("mfa_token", "")
    if session is None or session["mfa"] != request_hash(mfa_token):
        return pages.error_page("Sign in again.", 400)
    try:
        await server.redeem_second_factor(mfa_token, form.get("code", ""))
    except ApiError as refused:
        return pages.mfa_page(MFA_PATH, {"session": form["session"], "mfa_token": mfa_token},
                              refused.message, pages.refusal_status(refused.status))
    session["mfa"] = "passed"
    await _save(server, session)
    return await _apps(server, session, form["session"])


@router.post(APPS_PATH, summary="Apps with access to your records: revoke one",
             response_class=Response, responses=PAGE_ANSWERS)
async def revoke_app(request: Request) -> Response:
    server = smart_server(request)
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    session = await _session(server, request, form)
    if session is None or session["mfa"] not in (None, "passed"):
        return pages.error_page("Sign in again.", 400)
    family = await server.services.store.get_document(FAMILIES, form.get("revoke", ""))
    notice = None
    if family is not None and family.get("kind") == SMART_FAMILY and \
            family["user_id"] == session["user_id"]:
        await server.services.auth.refresh_tokens.revoke_family(
            family["id"], "revoked by the user (management page)")
        notice = "Access revoked."
    return await _apps(server, session, form["session"], notice)


async def _session(server: SmartServer, request: Request, form: dict[str, str]
                   ) -> JSON | None:
    session = await server.services.store.get_document(
        SESSIONS, request_hash(form.get("session", "")))
    browser = request.cookies.get(COOKIE, "")
    if session is None or request_hash(browser) != session["browser"] or \
            parse_rfc3339(session["expires_at"]) <= time.time():
        return None
    return session


async def _save(server: SmartServer, session: JSON) -> None:
    async with server.services.store.unit_of_work() as uow:
        uow.put_document(SESSIONS, session["id"], session)
        await uow.commit()


async def _apps(server: SmartServer, session: JSON, session_id: str,
                notice: str | None = None) -> Response:
    families = await server.services.store.find_documents(
        FAMILIES, {"user_id": session["user_id"], "kind": SMART_FAMILY, "revoked_at": None},
        limit=200)
    apps = []
    for family in families:
        client = await server.registry.get(family["client_id"])
        apps.append(pages.AuthorizedApp(
            family["id"], client["client_name"] if client else family["client_id"],
            family["scope"], family["created_at"][:10], family.get("patient")))
    return pages.apps_page(APPS_PATH, {"session": session_id}, apps, notice)
