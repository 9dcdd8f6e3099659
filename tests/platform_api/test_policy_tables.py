"""The access policy's tables and the grants its relations compile to, without HTTP."""

from __future__ import annotations

from pathlib import Path

from fhir_server.access import (
    CREATE,
    DELETE,
    READ,
    UPDATE,
    Grant,
    admits,
    may_touch_type,
    writable_owners,
)
from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from fhir_server.search.registry import builtin_registry
from fhir_server.validation import resource_types
from platform_api.auth.principal import Principal
from platform_api.policy import _key_scopes
from platform_api.policy.grants import PolicyAccess, compile_grants
from platform_api.policy.roles import (
    CATEGORIES,
    ORG_ROLES,
    ROLE_PERMISSIONS,
    render_categories,
    render_role_table,
    types_for,
)
from platform_api.policy.subject import Subject

# Patient-compartment types the policy deliberately leaves to platform administrators:
# group membership lists, research and population data, not one patient's care.
ADMIN_ONLY_COMPARTMENT_TYPES = {"Basic", "Group", "MeasureReport", "ResearchSubject",
                                "Person", "Provenance", "AuditEvent"} - set().union(
    *CATEGORIES.values())


def doctor_of(*orgs: str, patient: str | None = None) -> Subject:
    return Subject(Principal("u-doctor"), {o: "ORG:DOCTOR" for o in orgs}, patient)


def observation(owner: str | None, patient: str = "p1") -> dict:
    body = {"resourceType": "Observation", "id": "o1", "status": "final",
            "code": {"text": "Heart rate"}, "subject": {"reference": f"Patient/{patient}"}}
    return with_owners(body, [owner]) if owner else body


def patients_of(resource: dict) -> frozenset[str]:
    ref = (resource.get("subject") or {}).get("reference", "")
    return frozenset({ref.removeprefix("Patient/")}) if ref else frozenset()


def test_every_category_names_real_r4_types():
    known = resource_types()
    for name, types in CATEGORIES.items():
        assert types <= known, f"{name}: {sorted(types - known)}"


def test_every_patient_compartment_type_has_a_category_or_is_deliberately_admin_only():
    compartment = set(builtin_registry().compartment_types("Patient"))
    categorized = set().union(*CATEGORIES.values())
    assert compartment - categorized == ADMIN_ONLY_COMPARTMENT_TYPES


def test_every_role_names_known_categories_and_letters():
    for role, permissions in ROLE_PERMISSIONS.items():
        for category, letters in permissions.items():
            assert category in CATEGORIES, (role, category)
            assert set(letters) <= set("crud"), (role, letters)


def test_a_member_reads_only_what_their_organizations_own():
    grants = compile_grants(doctor_of("org-a"), READ)
    assert grants is not None
    member = [g for g in grants if g.relation == "member"]
    assert member and all(g.owners == {"org-a"} for g in member)
    assert any(admits(g, observation("org-a"), patients_of) for g in grants)
    assert not any(admits(g, observation("org-b"), patients_of) for g in grants)
    assert not any(admits(g, observation(None), patients_of) for g in grants)


def test_memberships_with_one_role_merge_into_one_grant():
    grants = compile_grants(doctor_of("org-a", "org-b", "org-c"), READ)
    assert grants is not None
    member = [g for g in grants if g.relation == "member"]
    assert len(member) == 1 and member[0].owners == {"org-a", "org-b", "org-c"}


def test_billing_cannot_read_observations_but_reads_claims():
    subject = Subject(Principal("u-billing"), {"org-a": "ORG:BILLING"})
    grants = compile_grants(subject, READ) or ()
    assert not any(admits(g, observation("org-a"), patients_of) for g in grants)
    claim = with_owners({"resourceType": "Claim", "id": "c1"}, ["org-a"])
    assert any(admits(g, claim, patients_of) for g in grants)


def test_self_reaches_own_compartment_whoever_owns_it_and_nothing_else():
    subject = Subject(Principal("u-amina"), {}, "p1")
    grants = compile_grants(subject, READ) or ()
    assert any(admits(g, observation("org-z", "p1"), patients_of) for g in grants)
    assert not any(admits(g, observation("org-z", "p2"), patients_of) for g in grants)
    assert not any(admits(g, observation(None, "p1"), patients_of)
                   for g in compile_grants(subject, DELETE) or ())


def test_a_patient_may_update_but_not_delete_their_own_record():
    subject = Subject(Principal("u-amina"), {}, "p1")
    # The own record is the one carrying the user's identifier (what the subject found);
    # an update that drops it would hand the record away, and is not the user's to make.
    own = {"resourceType": "Patient", "id": "p1",
           "identifier": [{"system": "urn:healthplatform:user", "value": "u-amina"}]}
    assert any(admits(g, own, patients_of) for g in compile_grants(subject, UPDATE) or ())
    assert not any(admits(g, own, patients_of) for g in compile_grants(subject, DELETE) or ())
    linked = {"resourceType": "Patient", "id": "p2",
              "link": [{"other": {"reference": "Patient/p1"}, "type": "seealso"}]}
    assert not any(admits(g, linked, lambda r: frozenset({"p1"}))
                   for g in compile_grants(subject, READ) or ())


def test_consent_reaches_the_consenting_patients_compartment_with_the_members_role():
    subject = Subject(Principal("u-doc"), {"org-c": "ORG:DOCTOR"}, None, frozenset(),
                      {"p7": frozenset({"org-c"})})
    grants = compile_grants(subject, READ) or ()
    assert any(g.relation == "consent" and admits(g, observation("org-a", "p7"), patients_of)
               for g in grants)
    assert not any(admits(g, observation("org-a", "p8"), patients_of) for g in grants)


def test_everyone_reads_the_directory_and_creates_only_their_own_patient_record():
    nobody = Subject(Principal("u-new"))
    location = {"resourceType": "Location", "id": "l1"}
    assert any(admits(g, location, patients_of) for g in compile_grants(nobody, READ) or ())
    create = compile_grants(nobody, CREATE) or ()
    assert not any(admits(g, location, patients_of) for g in create)
    own = {"resourceType": "Patient", "identifier": [
        {"system": "urn:healthplatform:user", "value": "u-new"}]}
    someone_else = {"resourceType": "Patient", "identifier": [
        {"system": "urn:healthplatform:user", "value": "u-other"}]}
    assert any(admits(g, own, patients_of) for g in create)
    assert not any(admits(g, someone_else, patients_of) for g in create)


def test_platform_admins_are_unrestricted_but_not_through_api_keys():
    admin = Principal("u-admin", roles=frozenset({"APP:ADMIN"}))
    assert compile_grants(Subject(admin), READ) is None
    key = Principal("u-admin", kind="api_key", roles=frozenset(),
                    scopes=frozenset({"*:*"}))
    assert compile_grants(Subject(key), READ) is not None


def test_an_api_key_on_fhir_is_held_to_its_type_scopes():
    key = Principal("u-doctor", kind="api_key", scopes=frozenset({"Observation:read"}))
    access = PolicyAccess(Subject(key, {"org-a": "ORG:DOCTOR"}), _key_scopes(key))
    read = access.grants(READ) or ()
    assert {t for g in read for t in g.types or ()} == {"Observation"}
    assert not access.grants(CREATE)


def test_writable_owners_are_the_organizations_whose_role_allows_the_write():
    subject = Subject(Principal("u"), {"org-a": "ORG:DOCTOR", "org-b": "ORG:BILLING"})
    access = PolicyAccess(subject)
    assert writable_owners(access, CREATE, "Observation") == {"org-a"}
    assert writable_owners(access, CREATE, "Claim") == {"org-b"}
    assert not may_touch_type(access, CREATE, "AuditEvent")


def test_a_patient_writes_for_no_organization():
    access = PolicyAccess(Subject(Principal("u-amina"), {}, "p1"))
    assert writable_owners(access, CREATE, "Communication") is None
    assert may_touch_type(access, CREATE, "Communication")
    assert not may_touch_type(access, CREATE, "Observation")


def test_org_roles_are_all_in_the_table():
    assert set(ORG_ROLES) <= set(ROLE_PERMISSIONS)
    for role in ORG_ROLES:
        assert types_for(role, READ), role


def test_owner_labels_round_trip_and_keep_other_security_labels():
    body = {"resourceType": "Observation", "meta": {"security": [
        {"system": "http://terminology.hl7.org/CodeSystem/v3-Confidentiality", "code": "R"}]}}
    owned = with_owners(body, ["org-b", "org-a"])
    assert owner_labels(owned) == {"org-a", "org-b"}
    assert owned["meta"]["security"][0]["code"] == "R"
    assert [c["code"] for c in owned["meta"]["security"] if c["system"] == OWNER_SYSTEM] == [
        "org-a", "org-b"]
    assert owner_labels(with_owners(owned, [])) == frozenset()
    assert body["meta"]["security"] == [
        {"system": "http://terminology.hl7.org/CodeSystem/v3-Confidentiality", "code": "R"}]


def test_the_readme_shows_the_tables_as_they_are():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert render_role_table() in readme
    assert render_categories() in readme


def test_a_grant_without_conditions_admits_its_types_only():
    grant = Grant(frozenset({"Location"}))
    assert admits(grant, {"resourceType": "Location"}, patients_of)
    assert not admits(grant, {"resourceType": "Patient"}, patients_of)
