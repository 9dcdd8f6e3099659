"""The index's clusters as the running app keeps them: the same clusters whatever order
the records arrive in, households kept apart, a transposed birth date shown as such and
left for review, links across organizations held for review unless allowed, members
re-evaluated when they change, and every automatic link undone with both records
restored."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.platform_api.clinic import Clinic
from tests.platform_api.mpi.conftest import data

ADMIN = "platform_admin"
LABEL = "urn:test:record"
HOME = {"line": ["14 Ngong Road"], "city": "Nairobi"}
PHONE = {"system": "phone", "value": "0712345678"}

# label → (given names, family, sex, birth date, phone, address, national id)
RECORDS: dict[str, tuple[list[str], str, str, str, str | None, dict[str, Any] | None,
                         str | None]] = {
    # a father and his son of the same name at one address, and the father again
    "john-sr": (["John"], "Kamau", "male", "1961-03-04", "0712345678", HOME, None),
    "john-jr": (["John"], "Kamau", "male", "1989-07-21", "0712345678", HOME, None),
    "john-sr-again": (["John", "W."], "Kamau", "male", "1961-03-04", "0712345678",
                      {"line": ["14 Ngong Rd"], "city": "Nairobi"}, None),
    # twins, and one of them again
    "wanjiku": (["Wanjiku"], "Kamau", "female", "2012-05-06", "0712345678", HOME, None),
    "achieng": (["Achieng"], "Kamau", "female", "2012-05-06", "0712345678", HOME, None),
    "wanjiku-again": (["Wanjiku"], "Kamau", "female", "2012-05-06", None, HOME, None),
    # a nickname, after a move
    "bill": (["Bill"], "Otieno", "male", "1975-09-30", "0700111222", None, None),
    "william": (["William"], "Otieno", "male", "1975-09-30", None,
                {"line": ["3 Jogoo Road"], "city": "Nairobi"}, None),
    # day and month transposed, the same phone: review, never a link
    "mohammed": (["Mohammed"], "Hassan", "male", "1984-03-07", "0722000111", None, None),
    "muhammad": (["Muhammad"], "Hassan", "male", "1984-07-03", "0722000111", None, None),
    # three records of one woman: the third matches each of the first two, which
    # (no birth date on the second) do not match each other well enough by themselves
    "grace-1": (["Grace"], "Achieng", "female", "1980-04-12", "0733000001", None, None),
    "grace-2": (["Grace"], "Achieng", "female", "", "0733000002", None, "27654321"),
    "grace-3": (["Grace"], "Achieng", "female", "1980-04-12", None, None, "27654321"),
}
CLUSTERS = {frozenset({"john-sr", "john-sr-again"}), frozenset({"john-jr"}),
            frozenset({"wanjiku", "wanjiku-again"}), frozenset({"achieng"}),
            frozenset({"bill", "william"}), frozenset({"mohammed"}), frozenset({"muhammad"}),
            frozenset({"grace-1", "grace-2", "grace-3"})}
ORDERS = [list(RECORDS), list(reversed(RECORDS)),
          ["grace-3", "wanjiku-again", "john-jr", "muhammad", "william", "grace-1",
           "john-sr-again", "achieng", "mohammed", "bill", "grace-2", "wanjiku", "john-sr"]]


def patient(clinic: Clinic, label: str, org: str | None = None) -> dict[str, Any]:
    given, family, sex, born, phone, address, nid = RECORDS[label]
    body: dict[str, Any] = {
        "resourceType": "Patient", "name": [{"family": family, "given": given}],
        "gender": sex, "identifier": [{"system": LABEL, "value": label}],
        "managingOrganization": {"reference": f"Organization/{org or clinic.org_id}"}}
    if born:
        body["birthDate"] = born
    if phone:
        body["telecom"] = [{"system": "phone", "value": phone}]
    if address:
        body["address"] = [address]
    if nid:
        body["identifier"].append({"type": {"coding": [{"code": "NI"}]},
                                   "system": "urn:ke:national-id", "value": nid})
    return body


async def create(clinic: Clinic, label: str, org: str | None = None) -> str:
    return str((await created(clinic, label, org))["id"])


async def created(clinic: Clinic, label: str, org: str | None = None) -> dict[str, Any]:
    response = await clinic.client.post("/fhir/Patient", headers=clinic.h(ADMIN),
                                        json=patient(clinic, label, org))
    assert response.status_code == 201, response.text
    return dict(response.json())


async def read(clinic: Clinic, pid: str, who: str = ADMIN) -> dict[str, Any]:
    response = await clinic.client.get(f"/fhir/Patient/{pid}", headers=clinic.h(who))
    assert response.status_code == 200, response.text
    return dict(response.json())


async def clusters(clinic: Clinic, ids: dict[str, str]) -> set[frozenset[str]]:
    """The clusters the stored Patients say (golden record and the records it replaces)."""
    label = {pid: name for name, pid in ids.items()}
    found: dict[str, set[str]] = {}
    for name, pid in ids.items():
        record = await read(clinic, pid)
        links = {str(link["other"]["reference"]).removeprefix("Patient/"): link["type"]
                 for link in record.get("link", [])}
        golden = next((o for o, t in links.items() if t == "replaced-by"), pid)
        found.setdefault(golden, set()).add(name)
        assert (record.get("active") is False) == (golden != pid), name
    return {frozenset(label.get(m, m) for m in members) for members in found.values()}


@pytest.mark.parametrize("order", ORDERS, ids=["as-listed", "reversed", "shuffled"])
async def test_the_same_records_in_any_order_give_the_same_clusters(clinic: Clinic,
                                                                    order: list[str]):
    ids: dict[str, str] = {}
    for label in order:
        ids[label] = await create(clinic, label)
        await clinic.drain()  # one at a time, as they would arrive
    assert await clusters(clinic, ids) == CLUSTERS


async def test_a_transposed_birth_date_is_a_candidate_shown_as_transposed(clinic: Clinic):
    mohammed = await create(clinic, "mohammed")
    muhammad = await create(clinic, "muhammad")
    await clinic.drain()
    [candidate] = data(await clinic.get(ADMIN, "/api/mpi/candidates"))
    assert set(candidate["patient_ids"]) == {mohammed, muhammad}
    assert candidate["levels"]["birth_date"] == "transposed"
    assert "birth_date" in candidate["partial"] and "birth_date" not in candidate["agreed"]
    assert "transposed" in candidate["hold"] and candidate["grade"] == "probable"
    assert "link" not in await read(clinic, muhammad)


async def test_across_organizations_a_match_waits_for_review_unless_allowed(clinic: Clinic,
                                                                            app):
    linked = clinic.recorded("platform.mpi.patients_linked")
    here = await create(clinic, "bill")
    there = await create(clinic, "william", org=clinic.other_org_id)
    await clinic.drain()
    assert linked == []
    [candidate] = data(await clinic.get(ADMIN, "/api/mpi/candidates"))
    assert candidate["hold"] == "different organizations"
    assert candidate["grade"] == "certain" and candidate["levels"]["given"] == "nickname"
    # allowed (HEALTHPLATFORM_MPI_AUTO_LINK_ACROSS_ORGANIZATIONS): linked when compared
    mpi = app.state.services.extras["mpi"]
    mpi.rules = replace(mpi.rules, across_organizations=True)
    await mpi.compare(there)
    await clinic.drain()
    assert [(e["payload"]["golden_id"], e["payload"]["other_id"]) for e in linked] == [
        (here, there)]
    assert data(await clinic.get(ADMIN, f"/api/mpi/matches/{candidate['id']}"))[
        "status"] == "linked"


async def test_undoing_an_automatic_link_restores_both_records(clinic: Clinic):
    stored = [await created(clinic, "john-sr"), await created(clinic, "john-sr-again")]
    before = {record["id"]: record for record in stored}
    first, again = (record["id"] for record in stored)
    weight = await clinic.client.post("/fhir/Observation", headers=clinic.h("doctor"), json={
        "resourceType": "Observation", "status": "final", "code": {"text": "Weight"},
        "subject": {"reference": f"Patient/{again}"},
        "valueQuantity": {"value": 72, "unit": "kg"}})
    assert weight.status_code == 201, weight.text
    await clinic.drain()
    merged = await read(clinic, again, "doctor")  # the clinic still reads it
    assert merged["active"] is False and merged["link"][0]["type"] == "replaced-by"
    [decision] = data(await clinic.get(ADMIN, "/api/mpi/matches", patient_id=again))
    assert (decision["status"], decision["source"]) == ("linked", "automatic")

    undone = data(await clinic.post(ADMIN, f"/api/mpi/matches/{decision['id']}/unlink",
                                    {"reason": "two people"}))
    assert undone["status"] == "unlinked"
    for pid in (first, again):
        restored = await read(clinic, pid, "doctor")
        assert {k: v for k, v in restored.items() if k != "meta"} == \
            {k: v for k, v in before[pid].items() if k != "meta"}
    # the record's own data still says what it said, and goes where it went
    kept = (await clinic.client.get(f"/fhir/Observation/{weight.json()['id']}",
                                    headers=clinic.h("doctor"))).json()
    assert kept["subject"] == {"reference": f"Patient/{again}"}
    # a person's undo sticks: compared again, the pair is not linked again
    await app_compare(clinic, again)
    assert "link" not in await read(clinic, again)


async def app_compare(clinic: Clinic, pid: str) -> None:
    await clinic.app.state.services.extras["mpi"].compare(pid)
    await clinic.drain()


async def test_a_member_that_changes_is_re_evaluated(clinic: Clinic):
    first = await create(clinic, "bill")
    second = await create(clinic, "william")
    await clinic.drain()
    assert (await read(clinic, second))["link"][0]["type"] == "replaced-by"
    record = await read(clinic, second)
    changed = {**record, "name": [{"family": "Otieno", "given": ["Wilfred"]}],
               "birthDate": "2003-01-15"}
    response = await clinic.client.put(f"/fhir/Patient/{second}", headers=clinic.h(ADMIN),
                                       json=changed)
    assert response.status_code == 200, response.text
    await clinic.drain()
    left = await read(clinic, second)
    assert "link" not in left and "active" not in left  # as it was before the link
    assert "link" not in await read(clinic, first)
    [decision] = data(await clinic.get(ADMIN, "/api/mpi/matches", patient_id=second))
    assert decision["status"] == "unlinked" and decision["decided_by"] == "mpi-matcher"
