"""The HTML pages of the authorization server: sign-in, second factor, patient picker,
consent, the user's authorized apps, and errors.

Served by the app itself, styled inline and without scripts, so they work offline and
load nothing from elsewhere. Every value is HTML-escaped. Answers carry ``Cache-Control:
no-store`` and refuse to be framed (``X-Frame-Options: DENY``, CSP ``frame-ancestors
'none'``: a consent button must not be clickjacked).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from starlette.responses import HTMLResponse

PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Pragma": "no-cache",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}
_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;background:#f6f8f7;
color:#1c1b1f;margin:0;display:flex;justify-content:center}
main{background:#fff;max-width:30rem;width:100%;margin:2rem 1rem;padding:1.5rem 2rem;
border-radius:8px;box-shadow:0 1px 4px rgba(0,0,0,.15)}
h1{font-size:1.35rem;margin-top:0}label{display:block;margin:.8rem 0 .25rem}
input[type=email],input[type=password],input[type=text]{width:100%;box-sizing:border-box;
padding:.5rem;font-size:1rem;border:1px solid #888;border-radius:4px}
button{margin-top:1rem;padding:.55rem 1.2rem;font-size:1rem;border-radius:4px;
border:1px solid #0b6e4f;background:#0b6e4f;color:#fff;cursor:pointer}
button.secondary{background:#fff;color:#0b6e4f}
.error{background:#fdecea;color:#b3261e;padding:.6rem;border-radius:4px}
.scope{display:flex;gap:.5rem;align-items:flex-start;margin:.4rem 0}
.scope input{margin-top:.3rem}.muted{color:#555;font-size:.9rem}
ul.patients{list-style:none;padding:0}ul.patients li{margin:.4rem 0}
"""


def refusal_status(status: int) -> int:
    """The status of a page re-shown with a refusal: 429 stays (a locked account), any
    other refused sign-in is a 400 (the page itself asks for no credentials)."""
    return 429 if status == 429 else 400


def page(title: str, body: str, status: int = 200) -> HTMLResponse:
    html = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body><main><h1>{escape(title)}</h1>{body}</main></body></html>")
    return HTMLResponse(html, status_code=status, headers=dict(PAGE_HEADERS))


def _error(message: str | None) -> str:
    return f"<p class=\"error\" role=\"alert\">{escape(message)}</p>" if message else ""


def _hidden(**fields: str) -> str:
    return "".join(f"<input type=\"hidden\" name=\"{escape(k)}\" value=\"{escape(v)}\">"
                   for k, v in fields.items())


def error_page(message: str, status: int = 400) -> HTMLResponse:
    """A refusal that cannot go back to the app (its redirect URI is not known good)."""
    return page("This app cannot be authorized",
                f"{_error(message)}<p class=\"muted\">Return to the app and try again, or "
                "tell its developer.</p>", status)


def unreviewed_app_error_page(client_name: str, message: str, back: str) -> HTMLResponse:
    """An error in an authorize request of an app no administrator reviewed: shown here,
    with a link the user may follow back to the app, rather than redirecting the browser
    at once to a URI anyone could have registered (RFC 9700 4.11.2, open redirector)."""
    return page("This app cannot be authorized", (
        f"<p><strong>{escape(client_name)}</strong> sent a request this server cannot "
        f"accept.</p>{_error(message)}<p class=\"muted\">This app has not been reviewed by "
        f"the administrators. <a href=\"{escape(back)}\" rel=\"noreferrer\">Return to "
        "the app</a> only if you trust it.</p>"), 400)


def sign_in_page(action: str, client_name: str, hidden: dict[str, str],
                 error: str | None = None, email: str = "", status: int = 200
                 ) -> HTMLResponse:
    return page("Sign in", (
        f"<p><strong>{escape(client_name)}</strong> asks to reach your health records."
        " Sign in to continue.</p>" if client_name else "") + _error(error) + (
        f"<form method=\"post\" action=\"{escape(action)}\">{_hidden(**hidden)}"
        "<label for=\"email\">E-mail</label>"
        f"<input id=\"email\" name=\"email\" type=\"email\" autocomplete=\"username\" "
        f"required value=\"{escape(email)}\">"
        "<label for=\"password\">Password</label>"
        "<input id=\"password\" name=\"password\" type=\"password\" "
        "autocomplete=\"current-password\" required>"
        "<button type=\"submit\">Sign in</button></form>"), status)


def mfa_page(action: str, hidden: dict[str, str], error: str | None = None,
             status: int = 200) -> HTMLResponse:
    return page("Two-step verification", _error(error) + (
        "<p>Enter the 6-digit code from your authenticator app, or a recovery code.</p>"
        f"<form method=\"post\" action=\"{escape(action)}\">{_hidden(**hidden)}"
        "<label for=\"code\">Code</label>"
        "<input id=\"code\" name=\"code\" type=\"text\" inputmode=\"numeric\" "
        "autocomplete=\"one-time-code\" required>"
        "<button type=\"submit\">Verify</button></form>"), status)


@dataclass(frozen=True, slots=True)
class PatientChoice:
    id: str
    name: str
    birth_date: str


def patient_page(action: str, search_action: str, hidden: dict[str, str],
                 patients: Sequence[PatientChoice], query: str, error: str | None = None
                 ) -> HTMLResponse:
    rows = "".join(
        f"<li><label class=\"scope\"><input type=\"radio\" name=\"patient\" "
        f"value=\"{escape(p.id)}\" required{' checked' if len(patients) == 1 else ''}>"
        f"<span>{escape(p.name)} <span class=\"muted\">born {escape(p.birth_date)}"
        f"</span></span></label></li>" for p in patients)
    listing = (f"<form method=\"post\" action=\"{escape(action)}\">{_hidden(**hidden)}"
               f"<ul class=\"patients\">{rows}</ul><button type=\"submit\">Continue"
               "</button></form>") if patients else "<p>No patient matches.</p>"
    search = (f"<form method=\"post\" action=\"{escape(search_action)}\">"
              f"{_hidden(**hidden)}<label for=\"name\">Find a patient by name</label>"
              f"<input id=\"name\" name=\"name\" type=\"text\" value=\"{escape(query)}\">"
              "<button type=\"submit\" class=\"secondary\">Search</button></form>")
    return page("Choose the patient", _error(error) + search + listing)


@dataclass(frozen=True, slots=True)
class ScopeChoice:
    name: str
    description: str
    optional: bool = True


def consent_page(action: str, client_name: str, hidden: dict[str, str],
                 scopes: Iterable[ScopeChoice], patient: str | None, user: str
                 ) -> HTMLResponse:
    rows = "".join(
        f"<label class=\"scope\"><input type=\"checkbox\" name=\"scope\" "
        f"value=\"{escape(s.name)}\" checked{'' if s.optional else ' disabled'}>"
        f"<span>{escape(s.description)} <span class=\"muted\">({escape(s.name)})</span>"
        f"</span></label>" + ("" if s.optional else _hidden(scope=s.name))
        for s in scopes)
    about = f"<p>For <strong>{escape(patient)}</strong>.</p>" if patient else ""
    return page(f"Allow {client_name}?", (
        f"<p>Signed in as {escape(user)}. <strong>{escape(client_name)}</strong> asks "
        "to:</p>" + about +
        f"<form method=\"post\" action=\"{escape(action)}\">{_hidden(**hidden)}{rows}"
        "<p class=\"muted\">Untick what you do not want to share.</p>"
        "<button type=\"submit\" name=\"decision\" value=\"allow\">Allow</button> "
        "<button type=\"submit\" name=\"decision\" value=\"deny\" class=\"secondary\">"
        "Deny</button></form>"))


@dataclass(frozen=True, slots=True)
class AuthorizedApp:
    family_id: str
    client_name: str
    scope: str
    since: str
    patient: str | None


def apps_page(action: str, hidden: dict[str, str], apps: Sequence[AuthorizedApp],
              notice: str | None = None) -> HTMLResponse:
    rows = "".join(
        f"<li><strong>{escape(a.client_name)}</strong> <span class=\"muted\">since "
        f"{escape(a.since)}{' for Patient/' + escape(a.patient) if a.patient else ''}"
        f"</span><br><span class=\"muted\">{escape(a.scope)}</span>"
        f"<form method=\"post\" action=\"{escape(action)}\">{_hidden(**hidden)}"
        f"{_hidden(revoke=a.family_id)}<button type=\"submit\" class=\"secondary\">"
        "Revoke access</button></form></li>" for a in apps)
    notice_html = f"<p role=\"status\">{escape(notice)}</p>" if notice else ""
    listing = f"<ul class=\"patients\">{rows}</ul>" if apps else \
        "<p>No app can reach your records.</p>"
    return page("Apps with access to your records", notice_html + listing)
