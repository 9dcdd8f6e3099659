"""The area modules whose workflow rules make up the policy's table (one per group of
/api areas, so each area's rules are read in one place)."""

from __future__ import annotations

from platform_api.policy.actions import care, commerce, organizations

MODULES = (organizations, care, commerce)
