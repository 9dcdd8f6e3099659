"""Auth: PASETO v4.public access tokens, rotating refresh tokens, argon2id passwords.

Modules: ``keys`` (Ed25519 signing keys on disk), ``passwords`` (argon2id),
``tokens`` (issue and verify access tokens), ``refresh`` (refresh-token families),
``service`` (:class:`~platform_api.auth.service.AuthService`, the facade the app builds
once), ``dependencies`` (FastAPI dependencies), ``routes`` (``/api/auth``),
``principal`` (who is calling).
"""
