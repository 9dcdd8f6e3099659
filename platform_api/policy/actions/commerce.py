"""Workflow actions of the commerce areas: who may do each (see
:mod:`platform_api.policy.actions`)."""

from __future__ import annotations

from platform_api.policy.actions import Rule

RULES: dict[str, Rule] = {
}
