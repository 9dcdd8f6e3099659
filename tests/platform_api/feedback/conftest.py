"""The clinic the Feedback tests work in (tests/platform_api/clinic.py)."""

from tests.platform_api.clinic import clinic  # noqa: F401  (the fixture)
