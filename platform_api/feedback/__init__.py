"""The Feedback area: users' feedback on the platform and the care received, and
anonymous feedback (:mod:`.routes`; the spam checks in :mod:`.spam`)."""

from __future__ import annotations

from platform_api.feedback.routes import router

__all__ = ["router"]
