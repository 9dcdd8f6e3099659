"""Which organizations own a resource, held in the FHIR data itself.

An owner is a ``meta.security`` coding with the system :data:`OWNER_SYSTEM` whose code
is the owning Organization's id (``_security=urn:healthplatform:organization|<id>``
finds its resources). Being in the resource, ownership travels with it through every
door — /fhir, transaction bundles, the HL7v2 gateway, the /api facades — and searches
can use it like any other token.

Every write settles the owners of the version it stores (:func:`settle_owners`), in this
order:

1. owner labels the writer put on the resource are kept as written (the access policy
   then decides whether the writer may give those owners);
2. an update without owner labels keeps the current version's owners (a client that PUTs
   a body without ``meta`` does not disown the resource);
3. the owners the resource names itself — an Organization owns itself, a Patient is
   owned by its ``managingOrganization`` — and those it inherits from the Patients whose
   compartments it is in, narrowed to the organizations the writer may write for (a
   doctor of one organization writing for a patient of two does not hand the record to
   the other; a clinic recording an external laboratory's Organization keeps it as its
   own directory entry);
4. else the one organization the writer may write this type for, when there is exactly
   one;
5. else none: only the patient (through their compartment), consent holders and platform
   administrators can reach it.

Owners are settled at write time, from what the patient's record says then: a patient
registered by a second organization later does not hand it the records written before
(consent does, see ``platform_api.policy``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

JSON = dict[str, Any]
OWNER_SYSTEM = "urn:healthplatform:organization"

# The Patient record a patient id refers to (staged in the same unit of work, else
# stored; None when unknown), as the writer's unit of work sees it.
PatientLookup = Callable[[str], Awaitable[JSON | None]]


def owner_labels(resource: JSON) -> frozenset[str]:
    meta = resource.get("meta")
    if not isinstance(meta, dict):
        return frozenset()
    security = meta.get("security")
    if not isinstance(security, list):
        return frozenset()
    return frozenset(c["code"] for c in security
                     if isinstance(c, dict) and c.get("system") == OWNER_SYSTEM
                     and isinstance(c.get("code"), str))


def with_owners(resource: JSON, owners: Iterable[str]) -> JSON:
    """``resource`` with exactly ``owners`` as its owner labels (other security labels
    kept; a new dict, the argument is not changed)."""
    meta = dict(resource.get("meta") or {})
    others = [c for c in meta.get("security") or []
              if not (isinstance(c, dict) and c.get("system") == OWNER_SYSTEM)]
    # system and code only: a display on every resource of the store cost bytes in each
    # body, token row and full-text entry (the store grew 17% a resource with one)
    labels = [{"system": OWNER_SYSTEM, "code": code} for code in sorted(set(owners))]
    if others or labels:
        meta["security"] = [*others, *labels]
    else:
        meta.pop("security", None)
    changed = dict(resource)
    if meta:
        changed["meta"] = meta
    else:
        changed.pop("meta", None)
    return changed


def _local_id(reference: Any, resource_type: str) -> str | None:
    ref = reference.get("reference") if isinstance(reference, dict) else None
    prefix = resource_type + "/"
    if isinstance(ref, str) and ref.startswith(prefix):
        return ref[len(prefix):].split("/_history/")[0] or None
    return None


def intrinsic_owners(resource: JSON) -> frozenset[str]:
    """Owners a resource names by itself (rule 3)."""
    resource_type = resource.get("resourceType")
    if resource_type == "Organization" and isinstance(resource.get("id"), str):
        return frozenset({resource["id"]})
    if resource_type == "Patient":
        org = _local_id(resource.get("managingOrganization"), "Organization")
        return frozenset({org}) if org else frozenset()
    return frozenset()


async def settle_owners(resource: JSON, *, current: JSON | None, patients: frozenset[str],
                        lookup: PatientLookup, writable: frozenset[str] | None) -> JSON:
    """``resource`` with its owner labels settled by the rules of the module docstring.

    ``patients``: the ids of the Patients whose compartments the resource is in;
    ``writable``: the owners the writer may write this type for (None: any)."""
    if owner_labels(resource):
        return resource
    if current is not None and (kept := owner_labels(current)):
        return with_owners(resource, kept)
    owners = set(intrinsic_owners(resource))
    for patient_id in sorted(patients):
        patient = await lookup(patient_id)
        if patient is not None:
            owners |= owner_labels(patient) or intrinsic_owners(patient)
    if writable is not None:
        owners &= writable
    if not owners and writable is not None and len(writable) == 1:
        owners = set(writable)
    return with_owners(resource, owners) if owners else resource
