"""What writes make of profiles: ``meta.profile`` checked on every write, as a setting
says per resource type and per organization (``HEALTHPLATFORM_FHIR_PROFILE_ENFORCEMENT``).

- ``off``: profiles are not checked on write;
- ``warn``: the profiles a resource claims (and those required of it) that the server
  knows are checked; a resource that fails them is stored, and the failure logged and
  reported to a client that asks for an OperationOutcome
  (``Prefer: return=OperationOutcome``);
- ``enforce``: a resource that fails them is refused (422, the OperationOutcome naming
  each problem), and so is one that claims a profile the server does not know.

``require`` names profiles a resource must conform to whether it claims them or not
(an exchange requires its national Patient profile). Settings, most specific first: an
organization's type, the organization's default, the type, the default. A resource
owned by several organizations gets the strictest mode and every required profile.

A write that neither claims nor is required a profile costs nothing here: the base
structure has been checked by the compiled R4 JSON Schema already
(:mod:`fhir_server.validation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MODES = ("off", "warn", "enforce")


@dataclass(frozen=True, slots=True)
class Rules:
    default: str | None = None
    types: Mapping[str, str] = field(default_factory=dict)
    require: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str) -> Rules:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where} must be a JSON object")
        unknown = set(data) - {"default", "types", "require", "organizations"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {', '.join(sorted(unknown))} (expected "
                             "default, types, require, organizations)")
        default = data.get("default")
        if default is not None and default not in MODES:
            raise ValueError(f"{where}.default must be one of {', '.join(MODES)}")
        types = dict(data.get("types") or {})
        for name, mode in types.items():
            if mode not in MODES:
                raise ValueError(f"{where}.types.{name} must be one of {', '.join(MODES)}")
        require: dict[str, tuple[str, ...]] = {}
        for name, urls in (data.get("require") or {}).items():
            if isinstance(urls, str):
                urls = [urls]
            if not isinstance(urls, list) or not all(isinstance(u, str) and u for u in urls):
                raise ValueError(f"{where}.require.{name} must be a list of profile URLs")
            require[name] = tuple(urls)
        return cls(default, types, require)


@dataclass(frozen=True, slots=True)
class ProfilePolicy:
    """The enforcement settings (module docstring)."""

    rules: Rules = field(default_factory=lambda: Rules("warn"))
    organizations: Mapping[str, Rules] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, data: Mapping[str, Any] | None) -> ProfilePolicy:
        """From the setting's JSON; ValueError naming what is wrong."""
        data = data or {}
        rules = Rules.parse(data, "fhir_profile_enforcement")
        if rules.default is None:
            rules = Rules("warn", rules.types, rules.require)
        organizations = {}
        for org, org_rules in (data.get("organizations") or {}).items():
            organizations[str(org)] = Rules.parse(
                org_rules, f"fhir_profile_enforcement.organizations.{org}")
        return cls(rules, organizations)

    def rule_for(self, resource_type: str, organizations: Iterable[str]
                 ) -> tuple[str, tuple[str, ...]]:
        """(mode, required profiles) for a resource of ``resource_type`` owned by
        ``organizations``."""
        modes: list[str] = []
        required: list[str] = list(self.rules.require.get(resource_type, ()))
        for org in organizations:
            rules = self.organizations.get(org)
            if rules is None:
                continue
            mode = rules.types.get(resource_type) or rules.default
            if mode is not None:
                modes.append(mode)
            required += rules.require.get(resource_type, ())
        if not modes:
            modes.append(self.rules.types.get(resource_type) or self.rules.default or "warn")
        mode = max(modes, key=MODES.index)
        return mode, tuple(dict.fromkeys(required))

    @property
    def required_anywhere(self) -> bool:
        return bool(self.rules.require) or any(r.require for r in self.organizations.values())
