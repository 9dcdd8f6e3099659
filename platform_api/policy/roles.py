"""The access policy's tables: who may do what to which kinds of FHIR resources.

Data only; :mod:`platform_api.policy.grants` interprets it. The README's access section
is rendered from these tables (``render_role_table``) and a test keeps the two equal.

Letters are the SMART v2 interaction letters the platform uses: ``c`` create, ``r`` read
(read, vread, search, history), ``u`` update (and patch), ``d`` delete.

Who holds a role:

- ``ORG:<ROLE>``: a member of an organization, for the resources that organization owns
  (see :mod:`fhir_server.ownership`) and, with the patient's consent, in the consenting
  patient's compartment;
- ``PATIENT``: any user, in the compartment of their own Patient record (the one whose
  identifier is ``urn:healthplatform:user|<user id>``);
- ``EVERYONE``: any signed-in user, whatever they own;
- platform administrators (``SUPER:ADMIN``, ``APP:ADMIN``) are not in these tables: they
  may do everything (an API key never carries that power).

A resource type in no category can be reached by platform administrators only.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

# -- categories of resource types ---------------------------------------------------------
CATEGORIES: Mapping[str, frozenset[str]] = {
    # who the patient is
    "demographics": frozenset({"Patient", "RelatedPerson", "Person"}),
    # the clinical record
    "clinical": frozenset({
        "AdverseEvent", "AllergyIntolerance", "BodyStructure", "CarePlan", "CareTeam",
        "ClinicalImpression", "Communication", "CommunicationRequest", "Composition",
        "Condition", "DetectedIssue", "DeviceRequest", "DeviceUseStatement",
        "DiagnosticReport", "DocumentManifest", "DocumentReference", "Encounter",
        "EpisodeOfCare", "FamilyMemberHistory", "Flag", "Goal", "Group", "ImagingStudy",
        "Immunization", "ImmunizationEvaluation", "ImmunizationRecommendation", "List",
        "Media", "MedicationAdministration", "MedicationDispense", "MedicationRequest",
        "MedicationStatement", "MolecularSequence", "NutritionOrder", "Observation",
        "Procedure", "QuestionnaireResponse", "RequestGroup", "RiskAssessment",
        "ServiceRequest", "Specimen", "Task", "VisionPrescription",
    }),
    # orders, specimens and results: a laboratory's work
    "laboratory": frozenset({"DiagnosticReport", "Observation", "ServiceRequest",
                             "Specimen", "Task"}),
    # a pharmacy's work
    "medication": frozenset({"MedicationAdministration", "MedicationDispense",
                             "MedicationRequest", "MedicationStatement", "Immunization"}),
    # visits, for front desks and billing
    "encounters": frozenset({"Encounter", "EpisodeOfCare"}),
    # what was diagnosed and done, for coding claims
    "diagnoses": frozenset({"Condition", "Procedure"}),
    "scheduling": frozenset({"Appointment", "AppointmentResponse", "Schedule", "Slot"}),
    "financial": frozenset({
        "Account", "ChargeItem", "Claim", "ClaimResponse", "Coverage",
        "CoverageEligibilityRequest", "CoverageEligibilityResponse", "EnrollmentRequest",
        "EnrollmentResponse", "ExplanationOfBenefit", "Invoice", "PaymentNotice",
        "PaymentReconciliation",
    }),
    "consent": frozenset({"Consent"}),
    # messages and forms a patient sends
    "messages": frozenset({"Communication", "CommunicationRequest"}),
    "forms": frozenset({"QuestionnaireResponse"}),
    # supplies and stock
    "supply": frozenset({"SupplyRequest", "SupplyDelivery"}),
    # who and where: facilities, staff, services (not patient data)
    "directory": frozenset({
        "Device", "Endpoint", "HealthcareService", "InsurancePlan", "Location",
        "Organization", "OrganizationAffiliation", "Practitioner", "PractitionerRole",
    }),
    # knowledge, terminology and conformance resources
    "definitions": frozenset({
        "ActivityDefinition", "CapabilityStatement", "ChargeItemDefinition", "CodeSystem",
        "CompartmentDefinition", "ConceptMap", "DeviceDefinition", "EventDefinition",
        "GraphDefinition", "ImplementationGuide", "Library", "Measure", "Medication",
        "MedicationKnowledge", "MessageDefinition", "NamingSystem", "ObservationDefinition",
        "OperationDefinition", "PlanDefinition", "Questionnaire", "SearchParameter",
        "SpecimenDefinition", "StructureDefinition", "StructureMap", "Substance",
        "TerminologyCapabilities", "TestScript", "ValueSet",
        # SQL on FHIR v2 (an added type): analysts' views, stored like other definitions
        "ViewDefinition",
    }),
    # who wrote what, recorded by the systems that write clinical data
    "provenance": frozenset({"Provenance"}),
    # the platform's own record of who did what (written by the platform itself)
    "audit": frozenset({"AuditEvent"}),
    # notifications of changes an organization's systems ask for (FHIR Subscriptions)
    "subscriptions": frozenset({"Subscription"}),
}

# -- roles ---------------------------------------------------------------------------------
ORG_ADMIN = "ORG:ADMIN"
ORG_DOCTOR = "ORG:DOCTOR"
ORG_NURSE = "ORG:NURSE"
ORG_LAB = "ORG:LAB"
ORG_PHARMACIST = "ORG:PHARMACIST"
ORG_RECEPTIONIST = "ORG:RECEPTIONIST"
ORG_BILLING = "ORG:BILLING"
PATIENT = "PATIENT"
EVERYONE = "EVERYONE"

ORG_ROLES = (ORG_ADMIN, ORG_DOCTOR, ORG_NURSE, ORG_LAB, ORG_PHARMACIST, ORG_RECEPTIONIST,
             ORG_BILLING)

ROLE_PERMISSIONS: Mapping[str, Mapping[str, str]] = {
    ORG_ADMIN: {"demographics": "crud", "clinical": "crud", "scheduling": "crud",
                "financial": "crud", "consent": "crud", "supply": "crud",
                "directory": "crud", "definitions": "crud", "provenance": "cr", "audit": "r",
                "subscriptions": "crud"},
    ORG_DOCTOR: {"demographics": "cru", "clinical": "crud", "scheduling": "cru",
                 "financial": "r", "consent": "cru", "supply": "cr", "definitions": "cru",
                 "provenance": "cr", "subscriptions": "crud"},
    ORG_NURSE: {"demographics": "cru", "clinical": "cru", "scheduling": "cru",
                "consent": "r", "supply": "cr", "provenance": "cr"},
    ORG_LAB: {"demographics": "r", "laboratory": "cru", "provenance": "cr",
              "subscriptions": "crud"},
    ORG_PHARMACIST: {"demographics": "r", "clinical": "r", "medication": "cru",
                     "supply": "cru", "provenance": "cr"},
    ORG_RECEPTIONIST: {"demographics": "cru", "encounters": "cru", "scheduling": "crud",
                       "financial": "r", "consent": "cr"},
    ORG_BILLING: {"demographics": "r", "encounters": "r", "diagnoses": "r",
                  "financial": "crud"},
    # a user's own record (their Patient and its compartment, whoever owns it)
    PATIENT: {"demographics": "ru", "clinical": "r", "scheduling": "r", "financial": "r",
              "consent": "cru", "messages": "cr", "forms": "cru", "provenance": "r"},
    # any signed-in user
    EVERYONE: {"directory": "r", "definitions": "r"},
}

LETTERS = {"create": "c", "read": "r", "update": "u", "delete": "d"}  # in table order


@cache
def types_for(role: str, action: str) -> frozenset[str]:
    """The resource types ``role`` may ``action``."""
    letter = LETTERS[action]
    found: set[str] = set()
    for category, letters in ROLE_PERMISSIONS.get(role, {}).items():
        if letter in letters:
            found |= CATEGORIES[category]
    return frozenset(found)


def effective_letters(role: str, category: str) -> str:
    """The letters ``role`` has on every type of ``category``, whichever of its categories
    grants them (``laboratory`` is part of ``clinical``: a doctor's ``clinical`` letters
    hold there too)."""
    types = CATEGORIES[category]
    return "".join(letter for action, letter in LETTERS.items()
                   if types <= types_for(role, action))


def render_role_table() -> str:
    """The permission table as Markdown (the README's access section shows this)."""
    roles = [*ORG_ROLES, PATIENT, EVERYONE]
    header = "| category | " + " | ".join(f"`{r}`" for r in roles) + " |"
    rows = [header, "|---|" + "---|" * len(roles)]
    for category in CATEGORIES:
        cells = [effective_letters(r, category) or "-" for r in roles]
        rows.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_categories() -> str:
    return "\n".join(f"- **{name}**: {', '.join(sorted(types))}"
                     for name, types in CATEGORIES.items())
