"""Auth: PASETO v4.public access tokens, rotating refresh tokens, argon2id passwords,
TOTP MFA, e-mail links, social login, developer API keys.

Modules: ``keys`` (Ed25519 signing keys on disk, rotation and retirement),
``passwords`` (argon2id), ``tokens`` (issue and verify access tokens), ``refresh``
(refresh-token families), ``mfa`` (TOTP, recovery codes, MFA logins), ``secretbox``
(encryption at rest of TOTP seeds), ``one_time`` (single-use e-mailed tokens),
``recovery`` (e-mail verification and password reset), ``social`` (OpenID Connect ID
tokens), ``api_keys`` (developer keys), ``users`` (account documents), ``service``
(:class:`~platform_api.auth.service.AuthService`, the facade the app builds once),
``dependencies`` (FastAPI dependencies), ``routes`` and ``mfa_routes`` (``/api/auth``),
``schemas`` (their bodies), ``principal`` (who is calling), ``errors`` (refusals).

Who may call which route is decided in :mod:`platform_api.access`; rate limits in
:mod:`platform_api.rate_limit`; the audit trail in :mod:`platform_api.audit`.
"""
