"""Access control: one declarative table, enforced by one middleware.

**The table.** Every route of the app has one :class:`Rule`, keyed by ``(method, path
template)``:

- the spec's operations (``access_rules.OPERATIONS``, transcribed from
  spec/operations.tsv) map by their access column: ``public`` → no credentials;
  ``auth`` → any signed-in user; ``admin`` → platform administrators (SUPER:ADMIN or
  APP:ADMIN; in the Auth area, user administration and system health, SUPER:ADMIN
  only, spec: Authentication 6); ``webhook`` → no token (the handler verifies the
  signature, spec: Authentication 7);
- ``OVERRIDES`` hold the few deliberate departures, each with its reason;
- ``PLATFORM_RULES`` cover the routes the spec does not list: /fhir, /healthz, the docs.

A rule also names the API-key scope a route needs (``<resource>:<action>``: the first
path segment after ``/api``, ``read`` for GET and ``write`` otherwise; on /fhir the
resource type, e.g. ``Patient:read``) or ``None`` where API keys may not go (the
account, its keys, administration), and the rate-limit class of the route.

**The middleware.** :class:`AccessMiddleware` (pure ASGI) matches each request to its
rule, authenticates the ``Authorization: Bearer`` token or ``X-API-Key``, refuses with
401 (no or bad credentials), 403 (role or scope missing, suspended account) or 429 (rate
limit, with ``Retry-After``), puts the principal on ``request.state.principal`` for the
handlers, and adds ``RateLimit-*`` headers to the answer. A route of the app that the
table does not list is left to its own dependencies, and API keys never reach it;
``tests/platform_api/test_access.py`` fails, naming it, until the table lists it.

Cost per request: one dict lookup for static paths or a walk of a segment trie for
templated ones, the cached token check of ``AuthService.authenticate``, and an in-memory
counter: a few microseconds (``bench/auth.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import Mount, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fhir_server.validation import resource_types
from platform_api.access_rules import OPERATIONS
from platform_api.audit import NO_CLIENT, ClientInfo
from platform_api.auth.devices import PATH as DEVICE_COOKIE_PATH
from platform_api.auth.devices import cookie_value
from platform_api.auth.errors import missing_token
from platform_api.auth.principal import APP_ADMIN, SUPER_ADMIN, Principal
from platform_api.client_origin import client_origin
from platform_api.envelope import ApiError, forbidden
from platform_api.rate_limit import Decision, MemoryLimiter, rate_limited
from platform_api.refusals import refusal_response

PUBLIC = "public"  # no credentials
AUTHENTICATED = "authenticated"  # a user's token or an API key (see Rule.roles, .scope)
WEBHOOK = "webhook"  # no token: the handler verifies the sender's signature
MFA_TOKEN = "mfa-token"  # the MFA token a login returned (Bearer mfa_…)
# CDS Hooks: the handler authenticates the bearer itself (a CDS client's JWT, CDS Hooks 2.0
# "Trusting CDS Clients", or an access token) and answers in CDS Hooks' own terms.
CDS_JWT = "cds-jwt"

PLATFORM_ADMINS = frozenset({SUPER_ADMIN, APP_ADMIN})
SUPER_ADMINS = frozenset({SUPER_ADMIN})


@dataclass(frozen=True, slots=True)
class Rule:
    access: str
    roles: frozenset[str] = frozenset()  # any of these (SUPER:ADMIN passes all); empty: anyone
    scope: str | None = None  # API-key scope; "{0}" is the first path parameter; None: no keys
    # rate-limit class (platform_api.rate_limit.DEFAULT_LIMITS); None: no budget at all
    limit: str | None = "read"
    reason: str = ""  # why this departs from the spec, when it does

    def required_scope(self, params: list[str]) -> str | None:
        if self.scope is None or "{" not in self.scope:
            return self.scope
        return self.scope.format(*params)


# -- the table -------------------------------------------------------------------------
# Areas whose "admin" operations are for the Super Admin alone (spec: Authentication 6).
SUPER_ADMIN_AREAS = frozenset({"Auth"})
# API keys are for server-to-server data access: never for the account, its keys or
# administration (a leaked key must not mint keys or change who may do what).
KEYLESS_PREFIXES = ("/api/auth/", "/api/developer/", "/api/admin/", "/admin/")
# The sign-in routes each have a budget of their own (rate_limit.DEFAULT_LIMITS), so that
# one kind (70 bad logins from a clinic's NAT) never uses up another (refreshing tokens).
AUTH_ROUTE_CLASSES: dict[str, str] = {
    "/api/auth/login": "login", "/api/auth/social-login": "login",
    "/api/auth/mfa/challenge": "login", "/api/auth/mfa/verify": "login",
    "/api/auth/mfa/disable": "login",
    "/api/auth/refresh": "refresh",
    "/api/auth/register": "register",
    "/api/auth/verify-email": "recovery", "/api/auth/forgot-password": "recovery",
    "/api/auth/reset-password": "recovery",
}

OVERRIDES: dict[tuple[str, str], Rule] = {
    ("GET", "/api/auth/me"): Rule(
        AUTHENTICATED, limit="read",
        reason="The spec marks it Public, but without a token there is no current user; "
               "a 401 tells the client to log in.",
    ),
    ("POST", "/cds-hooks/:hook_id"): Rule(
        CDS_JWT, limit="read",
        reason="CDS Hooks 2.0: the caller is a CDS client (an EHR) whose JWT the handler "
               "verifies against HEALTHPLATFORM_CDS_CLIENTS (or an app's access token); "
               "errors are CDS Hooks OperationOutcomes, not the /api envelope. Budgeted "
               "per address as reads (a call writes nothing; one EHR serves a whole "
               "hospital from one address).",
    ),
    ("POST", "/api/auth/mfa/challenge"): Rule(
        MFA_TOKEN, limit="login",
        reason="Completes a login that returned mfa_required: the credential is the MFA "
               "token from that login (Authorization: Bearer mfa_…), not an access token.",
    ),
    ("POST", "/api/appointments"): Rule(
        PUBLIC, limit="booking",
        reason="Public as the spec says, on a budget of its own: a booking may register a "
               "patient and e-mails the address it is given, so it is held tighter than "
               "other public routes.",
    ),
    ("POST", "/api/feedback/anonymous"): Rule(
        PUBLIC, limit="feedback",
        reason="Public as the spec says, on a budget of its own per address: anonymous "
               "feedback is stored for staff to read, so a flood is held tighter than "
               "other public routes (the spam checks are the handler's).",
    ),
}


def _fhir_rules() -> dict[tuple[str, str], Rule]:
    """/fhir: token required (SMART scopes come later); API keys with ``<Type>:read`` or
    ``<Type>:write`` reach the type they name. What spans types (system search and
    history, ``$everything``) needs ``*:read``; a transaction or batch bundle ``*:write``;
    a compartment search the type searched for (its third segment)."""
    read = Rule(AUTHENTICATED, scope="{0}:read", limit="read")
    write = Rule(AUTHENTICATED, scope="{0}:write", limit="write")
    all_read = Rule(AUTHENTICATED, scope="*:read", limit="read")
    return {
        ("GET", "/fhir/metadata"): Rule(PUBLIC, limit="public"),
        ("GET", "/fhir"): all_read,
        ("POST", "/fhir/_search"): all_read,
        ("POST", "/fhir"): Rule(AUTHENTICATED, scope="*:write", limit="write"),
        ("GET", "/fhir/_history"): all_read,
        ("GET", "/fhir/{}"): read,
        ("POST", "/fhir/{}/_search"): read,
        ("GET", "/fhir/{}/_history"): read,
        ("POST", "/fhir/{}"): write,
        ("PUT", "/fhir/{}"): write,
        ("PATCH", "/fhir/{}"): write,
        ("DELETE", "/fhir/{}"): write,
        ("GET", "/fhir/{}/{}"): read,
        ("PUT", "/fhir/{}/{}"): write,
        ("PATCH", "/fhir/{}/{}"): write,
        ("DELETE", "/fhir/{}/{}"): write,
        ("GET", "/fhir/{}/{}/_history"): read,
        ("GET", "/fhir/{}/{}/_history/{}"): read,
        ("GET", "/fhir/Patient/{}/$everything"): all_read,
        # $match (PDQm ITI-119) reads Patients, what the caller may see of them
        ("POST", "/fhir/Patient/$match"): Rule(AUTHENTICATED, scope="Patient:read",
                                               limit="read"),
        # $validate stores nothing (reads, for mode=delete/update): the type's read scope;
        # the write budget, as it costs what a write's validation costs and more.
        ("POST", "/fhir/{}/$validate"): Rule(AUTHENTICATED, scope="{0}:read", limit="write"),
        ("POST", "/fhir/{}/{}/$validate"): Rule(AUTHENTICATED, scope="{0}:read", limit="write"),
        ("GET", "/fhir/{}/{}/{}"): Rule(AUTHENTICATED, scope="{2}:read", limit="read"),
        # Bulk Data export spans types (what it holds is the policy's, as for a system
        # search): *:read; its status, files and cancel are the exporting client's only.
        **{(method, path): all_read for method in ("GET", "POST")
           for path in ("/fhir/$export", "/fhir/Patient/$export", "/fhir/Group/{}/$export")},
        ("GET", "/fhir/$export-status/{}"): all_read,
        ("DELETE", "/fhir/$export-status/{}"): all_read,
        ("GET", "/fhir/$export-file/{}/{}"): all_read,
        # Terminology operations read code systems, value sets and concept maps (GET or
        # POST with a Parameters body, storing nothing): the type's read scope.
        **{(method, f"/fhir/{kind}/{operation}"): Rule(AUTHENTICATED, scope=f"{kind}:read",
                                                       limit="read")
           for method in ("GET", "POST")
           for kind, operation in (
               ("CodeSystem", "$lookup"), ("CodeSystem", "$validate-code"),
               ("CodeSystem", "{}/$validate-code"), ("CodeSystem", "$subsumes"),
               ("CodeSystem", "{}/$subsumes"), ("ValueSet", "$expand"),
               ("ValueSet", "{}/$expand"), ("ValueSet", "$validate-code"),
               ("ValueSet", "{}/$validate-code"), ("ConceptMap", "$translate"),
               ("ConceptMap", "{}/$translate"))},
        # SQL on FHIR v2: a view reads the resources of its type (what the caller may
        # search, as for a system search: *:read), and a stored view; its export is a Bulk
        # export (status, result and cancel the exporting client's only, files as $export's).
        **{(method, path): all_read for method in ("GET", "POST")
           for path in ("/fhir/ViewDefinition/$run", "/fhir/$viewdefinition-run",
                        "/fhir/ViewDefinition/{}/$run")},
        **{("POST", path): all_read for path in ("/fhir/ViewDefinition/$viewdefinition-export",
                                                 "/fhir/$viewdefinition-export")},
        ("GET", "/fhir/$viewdefinition-export-status/{}"): all_read,
        ("DELETE", "/fhir/$viewdefinition-export-status/{}"): all_read,
        ("GET", "/fhir/$viewdefinition-export-result/{}"): all_read,
        # Subscription operations read the Subscriptions they name
        ("GET", "/fhir/Subscription/{}/$status"): Rule(AUTHENTICATED, scope="Subscription:read",
                                                       limit="read"),
        **{(method, "/fhir/Subscription/$status"): Rule(
            AUTHENTICATED, scope="Subscription:read", limit="read")
           for method in ("GET", "POST")},
        ("POST", "/fhir/Subscription/$get-ws-binding-token"): Rule(
            AUTHENTICATED, scope="Subscription:read", limit="write"),
        ("POST", "/fhir/Subscription/{}/$get-ws-binding-token"): Rule(
            AUTHENTICATED, scope="Subscription:read", limit="write"),
    }


def _smart_rules() -> dict[tuple[str, str], Rule]:
    """The SMART authorization server (platform_api.smart). The spec lists discovery and
    the EHR launch; OAuth 2.0 and SMART need the rest, each authenticating its callers
    itself as the OAuth RFCs say (client credentials, PKCE, signed-in pages)."""
    oauth = "OAuth endpoint: the client authenticates in the request (RFC 6749 2.3)"
    page = "SMART authorization page: the user signs in on it"
    discovery = "SMART / OpenID Connect discovery: public by definition"
    admins = "Administrators manage the registered SMART clients (SMART IG: registration)"
    return {
        ("GET", "/fhir/.well-known/smart-configuration"): Rule(PUBLIC, limit="public",
                                                                reason=discovery),
        ("GET", "/fhir/.well-known/openid-configuration"): Rule(PUBLIC, limit="public",
                                                                 reason=discovery),
        ("GET", "/oauth2/jwks"): Rule(PUBLIC, limit="public", reason=discovery),
        ("GET", "/oauth2/smart-style.json"): Rule(PUBLIC, limit="public", reason=discovery),
        ("POST", "/oauth2/token"): Rule(PUBLIC, limit="login", reason=oauth),
        ("POST", "/oauth2/introspect"): Rule(PUBLIC, limit="read", reason=oauth),
        ("POST", "/oauth2/revoke"): Rule(PUBLIC, limit="write", reason=oauth),
        ("GET", "/oauth2/authorize"): Rule(PUBLIC, limit="public", reason=page),
        ("POST", "/oauth2/authorize"): Rule(PUBLIC, limit="public", reason=page),
        ("POST", "/oauth2/authorize/sign-in"): Rule(PUBLIC, limit="login", reason=page),
        ("POST", "/oauth2/authorize/mfa"): Rule(PUBLIC, limit="login", reason=page),
        ("POST", "/oauth2/authorize/patient"): Rule(PUBLIC, limit="public", reason=page),
        ("POST", "/oauth2/authorize/patient-search"): Rule(PUBLIC, limit="public",
                                                            reason=page),
        ("POST", "/oauth2/authorize/consent"): Rule(PUBLIC, limit="public", reason=page),
        ("GET", "/oauth2/manage"): Rule(PUBLIC, limit="public", reason=page),
        ("POST", "/oauth2/manage"): Rule(PUBLIC, limit="login", reason=page),
        ("POST", "/oauth2/manage/mfa"): Rule(PUBLIC, limit="login", reason=page),
        ("POST", "/oauth2/manage/apps"): Rule(PUBLIC, limit="write", reason=page),
        ("POST", "/oauth2/register"): Rule(
            AUTHENTICATED, scope="smart:register", limit="write",
            reason="RFC 7591 registration: a platform administrator or an API key with "
                   "smart:register (the handler checks which)"),
        ("GET", "/api/smart/clients"): Rule(AUTHENTICATED, roles=PLATFORM_ADMINS,
                                            limit="read", reason=admins),
        ("GET", "/api/smart/clients/{}"): Rule(AUTHENTICATED, roles=PLATFORM_ADMINS,
                                               limit="read", reason=admins),
        ("PATCH", "/api/smart/clients/{}"): Rule(AUTHENTICATED, roles=PLATFORM_ADMINS,
                                                 limit="write", reason=admins),
    }


PLATFORM_RULES: dict[tuple[str, str], Rule] = {
    # A load balancer probes as often as it likes: a budget would let its probes (or
    # anyone's) turn the service "down", and use up the public budget of /fhir/metadata.
    ("GET", "/healthz"): Rule(PUBLIC, limit=None),
    ("GET", "/openapi.json"): Rule(PUBLIC, limit="public"),
    ("GET", "/openapi/fhir.json"): Rule(PUBLIC, limit="public"),  # the FHIR API by type
    ("GET", "/docs"): Rule(PUBLIC, limit="public"),
    ("GET", "/docs/fhir"): Rule(PUBLIC, limit="public"),  # the FHIR document's page
    ("GET", "/docs/oauth2-redirect"): Rule(PUBLIC, limit="public"),
    ("GET", "/docs/static/{path}"): Rule(PUBLIC, limit="public"),
    # Organizations area (issue 19): what its clients need beyond the spec's list.
    ("GET", "/api/organizations/{}/admissions/{}"): Rule(
        AUTHENTICATED, scope="organizations:read", limit="read",
        reason="One admission (after an admit, transfer or discharge answered with it)"),
    ("GET", "/api/organizations/{}/invoices/{}"): Rule(
        AUTHENTICATED, scope="organizations:read", limit="read",
        reason="One invoice with its balance (a payment desk re-reads it)"),
    ("GET", "/api/organizations/{}/conversations/{}/stream"): Rule(
        AUTHENTICATED, scope="organizations:read", limit="read",
        reason="New messages pushed live (server-sent events): a chat's users expect them "
               "without polling"),
    **_fhir_rules(),
    **_smart_rules(),
    # Patients area: what its workflows need beyond the spec's operations.
    ("GET", "/api/eprescriptions"): Rule(
        AUTHENTICATED, scope="eprescriptions:read", limit="read",
        reason="A pharmacy's queue: the spec transmits e-prescriptions to pharmacies and "
               "lets them dispense, but gives them no way to find what was sent to them."),
    ("GET", "/api/eprescriptions/{}"): Rule(
        AUTHENTICATED, scope="eprescriptions:read", limit="read",
        reason="One e-prescription, for the pharmacy and the prescriber (see the queue)."),
    ("POST", "/api/patients/{}/dsr/{}/approve"): Rule(
        AUTHENTICATED, roles=PLATFORM_ADMINS, limit="write",
        reason="An erasure request is reviewed by a platform administrator (the spec files "
               "the request and lists it, but names no way to decide it)."),
    ("POST", "/api/patients/{}/dsr/{}/reject"): Rule(
        AUTHENTICATED, roles=PLATFORM_ADMINS, limit="write",
        reason="The refusal of an erasure request, with its reason (see approve)."),
    # Scheduling: a booking made without signing in holds the contact it gave (it never
    # names a registered patient: issue 31) until the clinic says whom it is for.
    ("POST", "/api/appointments/{}/confirm-patient"): Rule(
        AUTHENTICATED, scope="appointments:write", limit="write",
        reason="The public booking holds its contact unverified; the organization's staff "
               "confirm whom it is for (link a Patient or register the contact): the spec "
               "books in a patient's name, which let anyone learn who is a patient where."),
    # CDS Hooks 2.0 routes the spec's operation list leaves out (it lists discovery and
    # /cds-hooks/:hook_id): the standard service path and its feedback, authenticated by
    # the handler as /cds-hooks/:hook_id is; the feedback reports for administrators; the
    # interaction table for whoever may check interactions (the knowledge is no secret).
    ("POST", "/cds-services/{}"): Rule(CDS_JWT, limit="read"),
    ("POST", "/cds-services/{}/feedback"): Rule(CDS_JWT, limit="write"),
    ("GET", "/api/cds/drug-interactions"): Rule(AUTHENTICATED, scope="cds:read", limit="read"),
    ("GET", "/api/cds/feedback"): Rule(AUTHENTICATED, roles=PLATFORM_ADMINS, limit="read"),
    ("GET", "/api/cds/feedback/summary"): Rule(AUTHENTICATED, roles=PLATFORM_ADMINS,
                                               limit="read"),
    # Sessions (platform_api/sessions): reads the spec's operations need beside them.
    ("GET", "/api/sessions/recordings/{}/audio"): Rule(
        AUTHENTICATED, scope="sessions:read", limit="read",
        reason="Plays back the audio a recording's upload stored (its Media's content.url)"),
    ("GET", "/api/sessions/transcripts/{}"): Rule(
        AUTHENTICATED, scope="sessions:read", limit="read",
        reason="Follows a transcription job POST /api/sessions/transcripts queued "
               "(status, progress) and reads the transcript"),
}


def normalize(path: str) -> str:
    """A path template with parameter names erased: ``/a/:id`` and ``/a/{x}`` → ``/a/{}``;
    a catch-all (``{p:path}``) → ``{path}``."""
    segments = []
    for segment in path.split("/"):
        if segment.startswith("{") and segment.endswith("}"):
            segments.append("{path}" if segment.endswith(":path}") else "{}")
        elif segment.startswith(":"):
            segments.append("{}")
        else:
            segments.append(segment)
    return "/".join(segments)


def derived_scope(method: str, path: str) -> str:
    """``<first segment after /api>:<read|write>``, e.g. ``vitals:read``."""
    segments = [s for s in path.split("/") if s]
    if segments and segments[0] == "api" and len(segments) > 1:
        segments = segments[1:]
    resource = segments[0] if segments else "root"
    return f"{resource}:{'read' if method in ('GET', 'HEAD') else 'write'}"


def spec_rule(area: str, method: str, path: str, access: str) -> Rule:
    """The rule of one spec operation before overrides."""
    limit: str
    if path in AUTH_ROUTE_CLASSES:
        limit = AUTH_ROUTE_CLASSES[path]
    elif access == PUBLIC:
        limit = "public"
    elif access == WEBHOOK:
        limit = "webhook"
    else:
        limit = "read" if method == "GET" else "write"
    if access == PUBLIC:
        return Rule(PUBLIC, limit=limit)
    if access == WEBHOOK:
        return Rule(WEBHOOK, limit=limit)
    if access == "admin":
        roles = SUPER_ADMINS if area in SUPER_ADMIN_AREAS else PLATFORM_ADMINS
        return Rule(AUTHENTICATED, roles=roles, limit=limit)
    keyless = path.startswith(KEYLESS_PREFIXES)
    return Rule(AUTHENTICATED, scope=None if keyless else derived_scope(method, path),
                limit=limit)


def build_table() -> dict[tuple[str, str], Rule]:
    """The whole access table, keyed by ``(method, normalized path)``."""
    table: dict[tuple[str, str], Rule] = {}
    for area, operations in OPERATIONS.items():
        for method, path, access in operations:
            table[(method, normalize(path))] = spec_rule(area, method, path, access)
    for (method, path), rule in OVERRIDES.items():
        table[(method, normalize(path))] = rule
    table.update(PLATFORM_RULES)
    return table


ACCESS_TABLE: dict[tuple[str, str], Rule] = build_table()


def scope_resources() -> frozenset[str]:
    """The resources an API-key scope may name: /api resources, FHIR types, ``*``."""
    named = {rule.scope.partition(":")[0] for rule in ACCESS_TABLE.values()
             if rule.scope is not None and "{" not in rule.scope}
    return frozenset(named | resource_types() | {"*"})


SCOPE_ACTIONS = ("read", "write", "*")
ALL_SCOPES = "*:*"  # every resource, every action; "*" alone means the same
# API-key scopes that are not <resource>:<read|write>: what a named route alone accepts.
SPECIAL_SCOPES = frozenset({"smart:register"})


# An /api collection's name → the FHIR type its facade serves ("patients" → "Patient"),
# from the routes the facade kit built (``bind_resource_routes``): a key's scope and a
# route's required scope are compared in FHIR types, whichever spelling either uses.
SCOPE_ALIASES: dict[str, str] = {}


def _granted(scopes: frozenset[str], required: str) -> bool:
    if required in scopes:
        return True
    resource, _, action = required.partition(":")
    return f"{resource}:*" in scopes or f"*:{action}" in scopes or ALL_SCOPES in scopes \
        or "*" in scopes


def _canonical(scope: str) -> str:
    resource, colon, action = scope.partition(":")
    return f"{SCOPE_ALIASES.get(resource, resource)}{colon}{action}"


def scope_granted(scopes: frozenset[str], required: str) -> bool:
    """Whether a key's ``scopes`` cover ``required`` (``<resource>:<action>``, wildcards
    on either side; an /api collection name and its FHIR type are one resource)."""
    if _granted(scopes, required):
        return True
    if not SCOPE_ALIASES:
        return False
    return _granted(frozenset(_canonical(s) for s in scopes), _canonical(required))


def resource_routes(app_routes: Iterable[Any]) -> dict[tuple[str, str], str]:
    """``(method, normalized path)`` → the FHIR type, for each route the facade kit built
    (its endpoints carry ``fhir_type``)."""
    found: dict[tuple[str, str], str] = {}
    for context in iter_route_contexts(list(app_routes)):
        kind = getattr(getattr(context.original_route, "endpoint", None), "fhir_type", None)
        if kind is None or context.path is None:
            continue
        for method in context.methods or ():
            if method != "HEAD":
                found[(method, normalize(context.path))] = kind
    return found


def with_resource_scopes(table: Mapping[tuple[str, str], Rule],
                         resources: Mapping[tuple[str, str], str]
                         ) -> dict[tuple[str, str], Rule]:
    """The table with each facade route's API-key scope named by the FHIR type it acts on
    (``GET /api/organizations/{id}/patients`` needs ``Patient:read``, which
    ``patients:read`` also names), not by its URL's first segment."""
    scoped = dict(table)
    for key, kind in resources.items():
        rule = scoped.get(key)
        if rule is None or rule.scope is None or "{" in rule.scope:
            continue
        verb = "read" if key[0] in ("GET", "HEAD") else "write"
        scoped[key] = replace(rule, scope=f"{kind}:{verb}")
    return scoped


def bind_resource_routes(app_routes: Iterable[Any]) -> dict[tuple[str, str], Rule]:
    """The access table for an app's routes, and the /api collection names as aliases of
    their FHIR types (an /api collection at ``/api/<name>`` whose facade serves one type)."""
    resources = resource_routes(app_routes)
    named: dict[str, set[str]] = {}
    for (_method, path), kind in resources.items():
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) in (2, 3) and (len(parts) == 2 or parts[2] == "{}"):
            named.setdefault(parts[1], set()).add(kind)
    SCOPE_ALIASES.update({name: kinds.pop() for name, kinds in named.items()
                          if len(kinds) == 1})
    return with_resource_scopes(ACCESS_TABLE, resources)


# -- matching requests -----------------------------------------------------------------
@dataclass(slots=True)
class _Node:
    static: dict[str, _Node] = field(default_factory=dict)
    param: _Node | None = None
    rest: dict[str, Rule] | None = None  # a {path} catch-all below this node
    rules: dict[str, Rule] = field(default_factory=dict)  # method -> rule


def app_route_templates(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(method, normalized path)`` of every HTTP route, mounts and included routers
    too (FastAPI's ``iter_route_contexts`` resolves their full paths)."""
    for context in iter_route_contexts(list(routes)):
        route = context.original_route
        if isinstance(route, Mount):
            path = prefix + route.path
            sub_routes = getattr(route.app, "routes", None)
            if sub_routes is not None:
                yield from app_route_templates(sub_routes, path)
            else:
                yield "GET", normalize(path + "/{p:path}")
        elif isinstance(route, WebSocketRoute) or context.path is None:
            continue
        else:
            for method in sorted(context.methods or ()):
                if method != "HEAD":  # answered as GET
                    yield method, normalize(prefix + context.path)


def unlisted_routes(table: Mapping[tuple[str, str], Rule], app_routes: Iterable[Any]
                    ) -> list[tuple[str, str]]:
    """Routes of the app the table has no rule for (the access test lists them).

    At run time such a route matches nothing: it is left to its own dependencies, as
    FastAPI would without this module, and ``authenticate_request`` refuses API keys
    there, so a key never reaches a route nobody gave a scope."""
    return sorted({key for key in app_route_templates(app_routes) if key not in table})


class AccessControl:
    """The table compiled for matching requests: static paths in a dict, templates in a
    trie of path segments."""

    def __init__(self, table: Mapping[tuple[str, str], Rule]):
        self.table = dict(table)
        self._static: dict[tuple[str, str], Rule] = {}
        self._root = _Node()
        for (method, path), rule in self.table.items():
            self._add(method, path, rule)

    def _add(self, method: str, path: str, rule: Rule) -> None:
        if "{" not in path:
            self._static[(method, path)] = rule
            return
        node = self._root
        for segment in path.strip("/").split("/"):
            if segment == "{path}":
                node.rest = node.rest or {}
                node.rest[method] = rule
                return
            if segment == "{}":
                node.param = node.param or _Node()
                node = node.param
            else:
                node = node.static.setdefault(segment, _Node())
        node.rules[method] = rule

    def match(self, method: str, path: str) -> tuple[Rule, list[str]] | None:
        """The rule and path parameters of a request; ``None`` when no route has that
        path and method (the router answers 404 or 405)."""
        if method == "HEAD":
            method = "GET"
        rule = self._static.get((method, path))
        if rule is not None:
            return rule, []
        params: list[str] = []
        found = _walk(self._root, path.strip("/").split("/"), 0, method, params)
        return (found, params) if found is not None else None


def _walk(node: _Node, segments: list[str], i: int, method: str, params: list[str]
          ) -> Rule | None:
    # Static segments before parameters, as a reader of the table expects
    # (/organizations/me before /organizations/{id}); backtracks on a dead end.
    if i == len(segments):
        return node.rules.get(method)
    segment = segments[i]
    child = node.static.get(segment)
    if child is not None:
        found = _walk(child, segments, i + 1, method, params)
        if found is not None:
            return found
    if node.param is not None and segment:
        params.append(segment)
        found = _walk(node.param, segments, i + 1, method, params)
        if found is not None:
            return found
        params.pop()
    if node.rest is not None and method in node.rest:
        params.append("/".join(segments[i:]))
        return node.rest[method]
    return None


# -- enforcing -------------------------------------------------------------------------
def insufficient_scope(message: str) -> ApiError:
    return ApiError(403, "INSUFFICIENT_SCOPE", message)


def authorize(rule: Rule, principal: Principal, params: list[str], method: str, path: str
              ) -> None:
    """403 unless the principal may call a route with this rule."""
    if principal.kind == "smart" and not (path == "/fhir" or path.startswith("/fhir/")):
        # A SMART app's token is for the FHIR API its scopes name, nothing else.
        raise insufficient_scope(f"SMART access tokens reach only /fhir, not {method} {path}")
    if rule.roles and not (principal.is_super_admin or principal.roles & rule.roles):
        raise forbidden(f"This needs one of the roles: {', '.join(sorted(rule.roles))}")
    if principal.kind != "api_key":
        return
    required = rule.required_scope(params)
    if required is None:
        raise insufficient_scope(f"API keys cannot call {method} {path}; use a user's "
                                 "access token")
    if not scope_granted(principal.scopes, required):
        raise insufficient_scope(f"This API key lacks the scope {required}")


@dataclass(slots=True)
class _Credentials:
    authorization: str | None = None
    api_key: str | None = None
    user_agent: str | None = None


def _credentials(scope: Scope) -> _Credentials:
    found = _Credentials()
    for name, value in scope["headers"]:
        if name == b"authorization":
            found.authorization = value.decode("latin-1")
        elif name == b"x-api-key":
            found.api_key = value.decode("latin-1")
        elif name == b"user-agent":
            found.user_agent = value.decode("latin-1")
    return found


class AccessMiddleware:
    """Enforce the access table (module doc) in front of every route."""

    def __init__(self, app: ASGIApp, *, table: Mapping[tuple[str, str], Rule] | None = None):
        self.app = app
        self.table = ACCESS_TABLE if table is None else table
        self._control: AccessControl | None = None
        self._auth: Any = None

    def control(self, app: Any = None) -> AccessControl:
        # From the table alone: a route it does not list matches nothing and passes
        # through (see unlisted_routes). The app's facade routes name their API-key scope
        # by FHIR type (bind_resource_routes).
        if self._control is None:
            table = self.table
            if app is not None and table is ACCESS_TABLE:
                table = bind_resource_routes(getattr(app, "routes", ()))
            self._control = AccessControl(table)
        return self._control

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path")
        if root and path.startswith(root):
            path = path[len(root):]
        found = self.control(scope.get("app")).match(scope["method"], path)
        if found is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await self._admit(scope, path, *found)
        except ApiError as refusal:
            await refusal_response(path, refusal)(scope, receive, send)
            return
        if decision is None:
            await self.app(scope, receive, send)
            return
        extra = decision.raw_headers()

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", ())
                # A handler's own 429 (a locked account, MFA attempts) reports its limit.
                if message["status"] != 429 or not any(
                    name == b"ratelimit-limit" for name, _ in headers
                ):
                    message = {**message, "headers": [*headers, *extra]}
            await send(message)

        await self.app(scope, receive, send_with_limits)

    async def _admit(self, scope: Scope, path: str, rule: Rule, params: list[str]
                     ) -> Decision | None:
        """Authenticate and authorize; the rate-limit decision to report, if any."""
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state["access_rule"] = rule  # authenticate_request reads it (API keys, see there)
        auth = self._auth or self._bind(scope["app"])
        ip = client_origin(scope).address or "unknown"
        if rule.access in (PUBLIC, WEBHOOK, CDS_JWT):
            return await self._spend(auth, rule.limit, self._anonymous(auth, scope, ip))
        credentials = _credentials(scope)
        if rule.access == MFA_TOKEN:
            scheme, _, token = (credentials.authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip().startswith("mfa_"):
                raise missing_token("This completes a login: send Authorization: Bearer "
                                    "<mfa_token from /api/auth/login>")
            return await self._spend(auth, rule.limit, self._anonymous(auth, scope, ip))
        # Who and from where matters to API keys only (usage records, audit).
        client_info = (NO_CLIENT if credentials.api_key is None
                       else ClientInfo(ip, credentials.user_agent))
        try:
            principal: Principal = await auth.authenticate_credentials(
                credentials.authorization, credentials.api_key, client_info)
        except ApiError as refusal:
            # A request without credentials is not a guess (a SMART app's first call, every
            # client behind a clinic's NAT before it logs in): a plain 401. Only wrong
            # credentials count towards the address's failure budget.
            presented = credentials.authorization is not None or credentials.api_key is not None
            if refusal.status == 401 and presented:
                await self._failed(auth, refusal, credentials,
                                   ClientInfo(ip, credentials.user_agent))
            raise
        authorize(rule, principal, params, scope["method"], path)
        state["principal"] = principal
        who = ("key:" + (principal.token_id or "")) if principal.kind == "api_key" else (
            "user:" + principal.user_id)
        return await self._spend(auth, rule.limit, who)

    @staticmethod
    def _anonymous(auth: Any, scope: Scope, ip: str) -> str:
        """Who spends a route's budget without credentials: the device of an earlier
        sign-in when its cookie comes along (a clinic's staff behind one address do not
        share one budget with whoever else is there), else the address."""
        if scope["path"].startswith(DEVICE_COOKIE_PATH):
            device = auth.devices.read(cookie_value(scope["headers"]))
            if device is not None:
                return "device:" + device.id
        return "ip:" + ip

    def _bind(self, app: Any) -> Any:
        """The app's auth service, looked up once (it lives as long as the app)."""
        self._auth = app.state.services.auth
        return self._auth

    async def _spend(self, auth: Any, limit_class: str | None, client: str
                     ) -> Decision | None:
        if limit_class is None or not auth.settings.rate_limit_enabled:
            return None
        limiter = auth.limiter
        if isinstance(limiter, MemoryLimiter):  # no coroutine for a dict update
            decision = limiter.hit_now(limit_class, client)
        else:
            decision = await limiter.hit(limit_class, client)
        if not decision.allowed:
            raise rate_limited(decision)
        return decision

    async def _failed(self, auth: Any, refusal: ApiError, credentials: _Credentials,
                      client: ClientInfo) -> None:
        """Count a 401 against the caller's address. Within the budget a refused API key
        is audited; past it the answer becomes 429 (and nothing more is written), so
        guessing credentials is slow and cannot flood the audit trail. Valid credentials
        from the same address keep working. A per-address budget like the others: off
        with ``HEALTHPLATFORM_RATE_LIMIT_ENABLED=false``."""
        if auth.settings.rate_limit_enabled:
            decision: Decision = await auth.limiter.hit("auth_failure", f"ip:{client.ip}")
            if not decision.allowed:
                raise rate_limited(decision, "failed authentications") from None
        if credentials.api_key is not None and refusal.code == "INVALID_API_KEY":
            auth.audit_refused_api_key(credentials.api_key, refusal, client)
