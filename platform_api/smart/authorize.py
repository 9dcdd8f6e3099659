"""``/oauth2/authorize`` (SMART app-launch.md "Obtain authorization code"; RFC 6749 4.1,
RFC 7636): by GET and by form POST, then HTML pages the server itself serves.

1. **The request.** ``client_id`` must be an active app registered for
   ``authorization_code`` and ``redirect_uri`` exactly one of its redirect URIs; until both
   hold, refusals are an HTML error page (never a redirect to an unchecked URI). After that
   every refusal goes back to the app as the OAuth error redirect (``error``,
   ``error_description``, ``state``; RFC 6749 4.1.2.1) when an administrator registered or
   reviewed the app; for an app registered by a developer's key and not reviewed the error
   is a page of this server with a link back to the app (RFC 9700 4.11.2: the server is no
   open redirector before anyone signed in): ``response_type`` must be ``code``; ``state``
   is required; PKCE with ``code_challenge_method=S256`` is required (``plain`` is refused,
   SMART: "SHALL NOT support the plain method"); ``aud`` must be this server's FHIR base;
   an EHR ``launch`` must be live, unspent and this client's (it is spent now); the scopes
   that may be granted (:meth:`SmartServer.grantable`) must not be none
   (``invalid_scope``). ``patient/`` scopes without a launch ask for a patient
   (``launch/patient`` inferred, as the IG allows).
2. **Sign-in**: e-mail and password (the platform's lockout and audit apply), then the
   TOTP or recovery code when the user has MFA. An EHR launch must be completed by the
   user who created it.
3. **Patient picker** for standalone launches that need a patient: the patients the user
   could reach through the app (their own record; their organizations' patients and those
   who consented, by name).
4. **Consent**: each scope with what it means; the user may untick the optional ones
   (data scopes, ``fhirUser``, ``online_access``/``offline_access``). Deny answers
   ``access_denied``; Allow opens the authorization (a ``smart`` refresh-token family,
   :mod:`platform_api.smart.issuance`) and redirects with a one-time ``code`` (valid
   ``HEALTHPLATFORM_SMART_CODE_TTL_SECONDS``) and the ``state``.

The pending request is a ``smart_auth_requests`` document under the SHA-256 of its
random id (a hidden field of each page), bound to a random cookie of the browser that
started it (``HttpOnly``, ``SameSite=Lax``): a page posted from another browser, or
after ``HEALTHPLATFORM_SMART_AUTHORIZE_TTL_SECONDS``, is refused.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from fhir_server.search.plan import SearchError
from fhir_server.smart_scopes import PATIENT, ScopeSet, parse_resource_scope
from fhir_server.store import DuplicateDocument
from platform_api.auth import users
from platform_api.auth.dependencies import client_info
from platform_api.auth.principal import Principal
from platform_api.auth.tokens import parse_rfc3339, rfc3339
from platform_api.envelope import ApiError
from platform_api.smart import pages
from platform_api.smart.issuance import access_kind
from platform_api.smart.launch import launch_hash
from platform_api.smart.oauth import (
    AUTH_REQUESTS,
    AUTHORIZE_PATH,
    CODES,
    LAUNCH_USES,
    LAUNCHES,
    SMART_FAMILY,
    urls,
)
from platform_api.smart.server import SmartServer, as_app_of, smart_server
from platform_api.smart.token import code_hash

router = APIRouter(tags=["SMART authorization server"])
# The pages answer HTML (200, or an error page when the request cannot go back to the
# app) or send the browser on (303: the next page, or the app's redirect_uri).
PAGE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "An HTML page", "content": {"text/html": {}}},
    303: {"description": "On to the next page, or back to the app with a code or an error"},
    400: {"description": "An HTML error page", "content": {"text/html": {}}},
}
JSON = dict[str, Any]
COOKIE = "hp_smart_browser"
SIGN_IN, MFA, PATIENT_STEP, CONSENT = (f"{AUTHORIZE_PATH}/sign-in", f"{AUTHORIZE_PATH}/mfa",
                                       f"{AUTHORIZE_PATH}/patient", f"{AUTHORIZE_PATH}/consent")
PATIENT_SEARCH = f"{AUTHORIZE_PATH}/patient-search"
_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43,128}$")
PICKER_SIZE = 20
# Scopes the consent page does not let the user untick: the launch itself and sign-in.
REQUIRED_SCOPES = frozenset({"launch", "launch/patient", "launch/encounter", "openid"})
DESCRIPTIONS = {
    "launch": "Open with the patient and encounter the EHR has in context",
    "launch/patient": "Know which patient's record it opens",
    "launch/encounter": "Know which encounter it opens",
    "openid": "Know who you are (sign you in)",
    "fhirUser": "See your own FHIR record (who you are in the records)",
    "profile": "See your name",
    "email": "See your e-mail address",
    "offline_access": "Keep access after you close it, until you revoke it",
    "online_access": "Keep access while you use it today",
}
VERBS = {"c": "create", "r": "read", "u": "update", "d": "delete", "s": "search"}


def request_hash(request_id: str) -> str:
    return hashlib.sha256(request_id.encode()).hexdigest()


class AuthorizeRedirect(Exception):
    """An OAuth error to send back to the app's (already checked) redirect URI."""

    def __init__(self, redirect_uri: str, state: str | None, error: str, description: str):
        super().__init__(description)
        self.redirect_uri, self.state = redirect_uri, state
        self.error, self.description = error, description

    def location(self) -> str:
        params = {"error": self.error, "error_description": self.description}
        if self.state:
            params["state"] = self.state
        separator = "&" if "?" in self.redirect_uri else "?"
        return f"{self.redirect_uri}{separator}{urlencode(params)}"

    def response(self) -> Response:
        return RedirectResponse(self.location(), status_code=303, headers=_NO_REFERRER)


_NO_REFERRER = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def back_to_app(redirect_uri: str, params: dict[str, str]) -> Response:
    separator = "&" if "?" in redirect_uri else "?"
    return RedirectResponse(f"{redirect_uri}{separator}{urlencode(params)}", status_code=303,
                            headers=_NO_REFERRER)


# -- 1. the authorization request ----------------------------------------------------------
@router.get(AUTHORIZE_PATH, summary="Authorization endpoint (GET): starts the sign-in pages",
            response_class=Response, responses=PAGE_ANSWERS)
async def authorize_get(request: Request) -> Response:
    return await _authorize(request, dict(request.query_params))


@router.post(AUTHORIZE_PATH, summary="Authorization endpoint (form POST, authorize-post)",
             response_class=Response, responses=PAGE_ANSWERS)
async def authorize_post(request: Request) -> Response:
    form = await request.form()
    return await _authorize(request, {k: v for k, v in form.items() if isinstance(v, str)})


async def _authorize(request: Request, params: dict[str, str]) -> Response:
    server = smart_server(request)
    client = await server.registry.active(params.get("client_id", ""))
    if client is None or "authorization_code" not in client["grant_types"]:
        return pages.error_page("Unknown or disabled app (client_id).")
    redirect_uri = params.get("redirect_uri", "")
    if redirect_uri not in client["redirect_uris"]:
        return pages.error_page("The redirect_uri is not one this app registered.")
    try:
        pending = await _pending_request(server, request, client, params)
    except AuthorizeRedirect as refusal:
        if not client.get("reviewed"):  # before sign-in: no open redirector (RFC 9700)
            return pages.unreviewed_app_error_page(client["client_name"],
                                                   refusal.description, refusal.location())
        return refusal.response()
    request_id = secrets.token_urlsafe(32)
    browser = request.cookies.get(COOKIE) or secrets.token_urlsafe(32)
    pending.update({"id": request_hash(request_id), "browser": request_hash(browser)})
    async with server.services.store.unit_of_work() as uow:
        uow.insert_document(AUTH_REQUESTS, pending["id"], pending)
        await uow.commit()
    response = pages.sign_in_page(SIGN_IN, client["client_name"], {"request": request_id})
    response.set_cookie(COOKIE, browser, httponly=True, samesite="lax",
                        secure=request.url.scheme == "https", path="/oauth2")
    return response


async def _pending_request(server: SmartServer, request: Request, client: JSON,
                           params: dict[str, str]) -> JSON:
    redirect_uri, state = params["redirect_uri"], params.get("state")

    def refuse(error: str, description: str) -> AuthorizeRedirect:
        return AuthorizeRedirect(redirect_uri, state, error, description)

    if params.get("response_type") != "code":
        raise refuse("unsupported_response_type", "response_type must be code")
    if not state:
        raise refuse("invalid_request", "state is required")
    method = params.get("code_challenge_method")
    if method != "S256":
        raise refuse("invalid_request", "PKCE is required with code_challenge_method=S256"
                     + (" (plain is not supported)" if method == "plain" else ""))
    if not _CHALLENGE.match(params.get("code_challenge", "")):
        raise refuse("invalid_request", "code_challenge must be the base64url S256 of the "
                     "code_verifier")
    fhir_base = urls(request).fhir
    if params.get("aud", "").rstrip("/") != fhir_base:
        raise refuse("invalid_request", f"aud must be this server's FHIR base {fhir_base}")
    launch = await _launch(server, client, params.get("launch"), refuse)
    requested = params.get("scope", "")
    if launch is None:
        requested = " ".join(s for s in requested.split() if s != "launch")
    offered = server.grantable(requested, client, backend=False)
    if not offered.names:
        raise refuse("invalid_scope", "none of the requested scopes may be granted to this "
                     f"app (it registered: {client['scope']})")
    patient_scopes = any(s.context == PATIENT for s in offered.resources)
    needs_patient = launch is None and ("launch/patient" in offered or patient_scopes)
    if needs_patient and "launch/patient" not in offered:
        offered = ScopeSet.parse([*offered.names, "launch/patient"])
    now = time.time()
    return {
        "client_id": client["id"], "redirect_uri": redirect_uri, "state": state,
        "code_challenge": params["code_challenge"], "nonce": params.get("nonce"),
        "offered": list(offered.names), "launch": launch, "needs_patient": needs_patient,
        "user_id": None, "mfa": None, "patient": launch["patient"] if launch else None,
        "created_at": rfc3339(now),
        "expires_at": rfc3339(now + server.settings.smart_authorize_ttl_seconds),
    }


async def _launch(server: SmartServer, client: JSON, launch: str | None, refuse: Any
                  ) -> JSON | None:
    """The EHR launch context the request presents, spent now (single use)."""
    if not launch:
        return None
    store = server.services.store
    context = await store.get_document(LAUNCHES, launch_hash(launch))
    if context is None or context["client_id"] != client["id"]:
        raise refuse("invalid_request", "unknown launch (or another app's)")
    if parse_rfc3339(context["expires_at"]) <= time.time():
        raise refuse("invalid_request", "the launch expired: launch the app again")
    try:
        async with store.unit_of_work() as uow:
            uow.insert_document(LAUNCH_USES, context["id"],
                                {"id": context["id"], "used_at": rfc3339(time.time())})
            await uow.commit()
    except DuplicateDocument:
        raise refuse("invalid_request", "this launch was already used: launch the app "
                     "again") from None
    return {k: context[k] for k in ("user_id", "patient", "encounter",
                                    "need_patient_banner", "intent")}


# -- the pending request, page after page ----------------------------------------------------
class PageError(Exception):
    def __init__(self, response: Response):
        self.response = response


async def _pending(request: Request) -> tuple[SmartServer, JSON, dict[str, str], JSON]:
    """(server, pending request, form, client) of a page's POST; PageError otherwise."""
    server = smart_server(request)
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    request_id = form.get("request", "")
    pending = await server.services.store.get_document(AUTH_REQUESTS,
                                                       request_hash(request_id))
    browser = request.cookies.get(COOKIE, "")
    if pending is None or not browser or request_hash(browser) != pending["browser"]:
        raise PageError(pages.error_page("This sign-in is not the one this browser "
                                         "started. Start again from the app.", 400))
    if parse_rfc3339(pending["expires_at"]) <= time.time():
        raise PageError(pages.error_page("This sign-in took too long. Start again from "
                                         "the app.", 400))
    client = await server.registry.active(pending["client_id"])
    if client is None:
        raise PageError(pages.error_page("This app was disabled.", 400))
    return server, pending, form, client


async def _save(server: SmartServer, pending: JSON) -> None:
    async with server.services.store.unit_of_work() as uow:
        uow.put_document(AUTH_REQUESTS, pending["id"], pending)
        await uow.commit()


def _hidden(form: dict[str, str]) -> dict[str, str]:
    return {"request": form["request"]}


async def _user(server: SmartServer, pending: JSON) -> JSON:
    user = await server.services.store.get_document(users.COLLECTION, pending["user_id"])
    if user is None or user["status"] != users.ACTIVE:
        raise PageError(pages.error_page("This account cannot authorize apps.", 400))
    return user


def _principal(user: JSON) -> Principal:
    return Principal(user_id=user["id"], email=user["email"],
                     roles=frozenset(user.get("roles", [])))


# -- 2. sign-in ------------------------------------------------------------------------------
@router.post(SIGN_IN, summary="Sign-in page of the authorization",
             response_class=Response, responses=PAGE_ANSWERS)
async def sign_in(request: Request) -> Response:
    try:
        server, pending, form, client = await _pending(request)
    except PageError as error:
        return error.response
    auth = server.services.auth
    try:
        user = await auth.verify_password(form.get("email", ""), form.get("password", ""),
                                          client_info(request))
    except ApiError as refused:
        return pages.sign_in_page(SIGN_IN, client["client_name"], _hidden(form),
                                  refused.message, form.get("email", ""),
                                  pages.refusal_status(refused.status))
    launch = pending["launch"]
    if launch is not None and launch["user_id"] != user["id"]:
        return AuthorizeRedirect(pending["redirect_uri"], pending["state"], "access_denied",
                                 "the EHR launch belongs to another user").response()
    pending["user_id"] = user["id"]
    if await auth.mfa.is_active(user["id"]):
        challenge = await auth.mfa.open_challenge(user["id"], "smart")
        pending["mfa"] = request_hash(challenge.mfa_token)
        await _save(server, pending)
        return pages.mfa_page(MFA, {**_hidden(form), "mfa_token": challenge.mfa_token})
    await _save(server, pending)
    return await _next_page(server, pending, form, client)


@router.post(MFA, summary="Second factor of the sign-in",
             response_class=Response, responses=PAGE_ANSWERS)
async def second_factor(request: Request) -> Response:
    try:
        server, pending, form, client = await _pending(request)
    except PageError as error:
        return error.response
    mfa_token = form.get("mfa_token", "")
    if pending.get("mfa") is None or request_hash(mfa_token) != pending["mfa"]:
        return pages.error_page("Sign in again from the app.", 400)
    try:
        await server.redeem_second_factor(mfa_token, form.get("code", ""))
    except ApiError as refused:
        if refused.code in ("INVALID_MFA_TOKEN",):
            return pages.error_page("This sign-in expired. Start again from the app.")
        return pages.mfa_page(MFA, {**_hidden(form), "mfa_token": mfa_token},
                              refused.message, pages.refusal_status(refused.status))
    pending["mfa"] = "passed"
    await _save(server, pending)
    return await _next_page(server, pending, form, client)


def _signed_in(pending: JSON) -> bool:
    return pending.get("user_id") is not None and pending.get("mfa") in (None, "passed")


async def _next_page(server: SmartServer, pending: JSON, form: dict[str, str], client: JSON
                     ) -> Response:
    user = await _user(server, pending)
    if pending["needs_patient"] and pending.get("patient") is None:
        return await _picker(server, pending, form, client, user, "")
    return _consent(server, pending, form, client, user)


# -- 3. the patient picker --------------------------------------------------------------------
async def _candidates(server: SmartServer, client: JSON, user: JSON, query: str
                      ) -> list[pages.PatientChoice]:
    fhir = await as_app_of(server.services, _principal(user), client["id"],
                           "user/Patient.rs patient/Patient.rs")
    params = [("_count", str(PICKER_SIZE))]
    if query.strip():
        params.append(("name", query.strip()))
    try:
        plan = await fhir.parse(["Patient"], params)
        page = await fhir.search_page(plan)
    except (SearchError, ApiError):
        return []
    return [_choice(orjson.loads(stored.body)) for stored in page.resources]


def _choice(patient: JSON) -> pages.PatientChoice:
    names = patient.get("name") or [{}]
    name = names[0] if isinstance(names[0], dict) else {}
    text = name.get("text") or " ".join([*name.get("given", []), name.get("family", "")])
    return pages.PatientChoice(patient["id"], text.strip() or f"Patient/{patient['id']}",
                               str(patient.get("birthDate", "unknown")))


async def _picker(server: SmartServer, pending: JSON, form: dict[str, str], client: JSON,
                  user: JSON, query: str, error: str | None = None) -> Response:
    choices = await _candidates(server, client, user, query)
    return pages.patient_page(PATIENT_STEP, PATIENT_SEARCH, _hidden(form), choices, query,
                              error)


@router.post(PATIENT_SEARCH, summary="Patient picker: search by name",
             response_class=Response, responses=PAGE_ANSWERS)
async def patient_search(request: Request) -> Response:
    try:
        server, pending, form, client = await _pending(request)
        if not _signed_in(pending):
            raise PageError(pages.error_page("Sign in first.", 400))
        user = await _user(server, pending)
    except PageError as error:
        return error.response
    return await _picker(server, pending, form, client, user, form.get("name", ""))


@router.post(PATIENT_STEP, summary="Patient picker: the chosen patient",
             response_class=Response, responses=PAGE_ANSWERS)
async def choose_patient(request: Request) -> Response:
    try:
        server, pending, form, client = await _pending(request)
        if not _signed_in(pending) or not pending["needs_patient"]:
            raise PageError(pages.error_page("Sign in first.", 400))
        user = await _user(server, pending)
    except PageError as error:
        return error.response
    chosen = form.get("patient", "")
    fhir = await as_app_of(server.services, _principal(user), client["id"],
                           "user/Patient.rs patient/Patient.rs")
    try:
        await fhir.read("Patient", chosen)
    except Exception:  # unknown, deleted or not the user's to see: one answer for all
        return await _picker(server, pending, form, client, user, "",
                             "Choose one of the patients listed.")
    pending["patient"] = chosen
    await _save(server, pending)
    return _consent(server, pending, form, client, user)


# -- 4. consent -------------------------------------------------------------------------------
def _describe(name: str) -> str:
    scope = parse_resource_scope(name)
    if scope is None:
        return DESCRIPTIONS.get(name, name)
    verbs = ", ".join(VERBS[c] for c in scope.letters)
    what = "all kinds of records" if scope.resource_type == "*" else \
        f"{scope.resource_type} records"
    whose = {"patient": "of this patient", "user": "you can see",
             "system": ""}[scope.context]
    limits = "".join(f" where {param} is {' or '.join(values)}"
                     for param, values in scope.constraints)
    return f"{verbs.capitalize()} {what} {whose}{limits}"


def _consent(server: SmartServer, pending: JSON, form: dict[str, str], client: JSON,
             user: JSON) -> Response:
    choices = [pages.ScopeChoice(name, _describe(name), name not in REQUIRED_SCOPES)
               for name in pending["offered"]]
    patient = f"Patient/{pending['patient']}" if pending.get("patient") else None
    return pages.consent_page(CONSENT, client["client_name"], _hidden(form), choices,
                              patient, user["email"])


@router.post(CONSENT, summary="Consent: allow or deny the app",
             response_class=Response, responses=PAGE_ANSWERS)
async def consent(request: Request) -> Response:
    try:
        server, pending, _form, _client = await _pending(request)
        if not _signed_in(pending) or (pending["needs_patient"] and not pending["patient"]):
            raise PageError(pages.error_page("Sign in first.", 400))
        user = await _user(server, pending)
    except PageError as error:
        return error.response
    form = await request.form()
    await _forget(server, pending)
    if form.get("decision") != "allow":
        return AuthorizeRedirect(pending["redirect_uri"], pending["state"], "access_denied",
                                 "the user denied access").response()
    ticked = {v for v in form.getlist("scope") if isinstance(v, str)}
    granted = [name for name in pending["offered"] if name in ticked or
               name in REQUIRED_SCOPES]
    fhir_user = await _fhir_user(server, user) if "fhirUser" in granted else None
    if fhir_user is None and "fhirUser" in granted:
        granted.remove("fhirUser")  # the user has no FHIR record to point at
    code = await _open_authorization(server, pending, user, ScopeSet.parse(granted),
                                     fhir_user)
    return back_to_app(pending["redirect_uri"], {"code": code, "state": pending["state"]})


async def _forget(server: SmartServer, pending: JSON) -> None:
    """A pending request answers once: allowed or denied, it is gone."""
    async with server.services.store.unit_of_work() as uow:
        uow.delete_document(AUTH_REQUESTS, pending["id"])
        await uow.commit()


async def _fhir_user(server: SmartServer, user: JSON) -> str | None:
    """The user as a FHIR resource: their Practitioner record, else their own Patient."""
    subject = await server.services.policy.subject(_principal(user))
    if subject.practitioner_ids:
        return f"Practitioner/{sorted(subject.practitioner_ids)[0]}"
    return f"Patient/{subject.patient_id}" if subject.patient_id else None


async def _open_authorization(server: SmartServer, pending: JSON, user: JSON,
                              granted: ScopeSet, fhir_user: str | None) -> str:
    """Stage the authorization (a ``smart`` family) and its one-time code."""
    launch = pending["launch"] or {}
    code = secrets.token_urlsafe(32)
    now = time.time()
    async with server.services.store.unit_of_work() as uow:
        _, family_id = server.services.auth.refresh_tokens.open_family(
            uow, user["id"], first_token=False, kind=SMART_FAMILY,
            client_id=pending["client_id"], scope=str(granted),
            patient=pending.get("patient"), encounter=launch.get("encounter"),
            need_patient_banner=launch.get("need_patient_banner", True),
            intent=launch.get("intent"), fhir_user=fhir_user, access=access_kind(granted))
        uow.insert_document(CODES, code_hash(code), {
            "id": code_hash(code), "client_id": pending["client_id"],
            "redirect_uri": pending["redirect_uri"],
            "code_challenge": pending["code_challenge"], "nonce": pending.get("nonce"),
            "family_id": family_id, "user_id": user["id"], "used_at": None,
            "created_at": rfc3339(now),
            "expires_at": rfc3339(now + server.settings.smart_code_ttl_seconds)})
        await uow.commit()
    return code

