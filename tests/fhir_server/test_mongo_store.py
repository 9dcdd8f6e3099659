"""What the MongoDB adapter does beyond the contract every adapter passes
(``tests/contract/``): its URL, what it finds out about the server, how it refuses what a
standalone server cannot do all or nothing, what it stores (exact decimals, history
order), ``healthplatform mongo-init``, and, on a real replica set
(``HEALTHPLATFORM_TEST_MONGODB_URI``), transactions under concurrent writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from bson.decimal128 import Decimal128
from typer.testing import CliRunner

from fhir_server.search.extract import IndexExtractor
from fhir_server.search.plan import parse_search
from fhir_server.search.registry import builtin_registry
from fhir_server.store import TransactionsUnavailable, store_from_url
from fhir_server.store.mongo import MongoStore, seq_id, seq_number
from fhir_server.store.mongo_layout import COLLECTIONS, INDEXES
from platform_api.cli import app as cli
from tests.conftest import make_clinic_admin
from tests.contract.conftest import (  # noqa: F401 (mongodb_client: the fake, unless a server)
    FHIR,
    MONGODB_URI,
    drop_database,
    mongodb_client,
    serving,
    store_url,
)

REGISTRY = builtin_registry()
EXTRACT = IndexExtractor(REGISTRY)


@pytest.fixture
async def mongo(tmp_path: Path):
    url = store_url("mongodb", tmp_path)
    store = store_from_url(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
        await drop_database(url)


def glucose(oid: str, value: float, patient: str = "pat-1") -> dict:
    return {"resourceType": "Observation", "id": oid, "status": "final",
            "code": {"coding": [{"system": "http://loinc.org", "code": "2345-7"}]},
            "subject": {"reference": f"Patient/{patient}"},
            "valueQuantity": {"value": value, "unit": "mmol/L",
                              "system": "http://unitsofmeasure.org", "code": "mmol/L"}}


def test_urls_of_either_scheme_load_the_adapter_and_others_are_refused():
    assert isinstance(store_from_url("mongodb://db1,db2/hp?replicaSet=rs0"), MongoStore)
    assert isinstance(store_from_url("mongodb+srv://cluster.example.org/hp"), MongoStore)
    with pytest.raises(ValueError, match="not a MongoDB URL"):
        MongoStore.from_url("postgres://db/hp")


async def test_open_learns_the_topology_and_makes_collections_and_indexes(mongo):
    if not MONGODB_URI:
        assert mongo.transactions is False and "fake" in mongo.topology
    assert mongo.database_name.startswith("hp_")
    for name in COLLECTIONS:
        present = await mongo.db[name].index_information()
        assert {m.document["name"] for m in INDEXES[name]} <= set(present), name
    await mongo.ensure_collections()  # again: idempotent


async def test_standalone_refuses_a_unit_of_several_resources_and_writes_nothing(mongo):
    if mongo.transactions:
        pytest.skip("the server has transactions: nothing is refused")
    with pytest.raises(TransactionsUnavailable, match="replica set"):
        async with mongo.unit_of_work() as uow:
            uow.create("Observation", "o1", glucose("o1", 5.4))
            uow.create("Observation", "o2", glucose("o2", 6.1))
            uow.emit("platform.test.loaded", {"n": 2})
            await uow.commit()
    assert await mongo.read_current("Observation", "o1") is None
    assert await mongo.pending_events() == []


async def test_a_standalone_unit_failing_after_its_write_is_put_back(mongo):
    """The resource document was replaced and its version inserted when the outbox
    insert failed (an event id already there): both are undone."""
    async with mongo.unit_of_work() as uow:
        uow.create("Observation", "o1", glucose("o1", 5.4), index=EXTRACT(glucose("o1", 5.4)))
        uow.emit("platform.test.first", {}, event_id="evt-1")
        await uow.commit()
    if mongo.transactions:
        pytest.skip("inside a transaction the server rolls back")
    with pytest.raises(Exception, match=r"(?i)duplicate"):
        async with mongo.unit_of_work() as uow:
            changed = glucose("o1", 9.9)
            uow.update("Observation", "o1", changed, index=EXTRACT(changed))
            uow.emit("platform.test.again", {}, event_id="evt-1")
            await uow.commit()
    current = await mongo.read("Observation", "o1")
    assert current.version == 1
    assert orjson.loads(current.body)["valueQuantity"]["value"] == 5.4
    assert (await mongo.history("Observation", "o1")).total == 1
    search = parse_search(REGISTRY, ["Observation"], [("value-quantity", "5.4")])
    assert [r.id for r in (await mongo.search(search)).resources] == ["o1"]


async def test_numbers_are_stored_as_exact_decimals_and_compare_exactly(mongo):
    for oid, value in (("o1", 0.1), ("o2", 0.3), ("o3", 7.25)):
        async with mongo.unit_of_work() as uow:
            body = glucose(oid, value)
            uow.create("Observation", oid, body, index=EXTRACT(body))
            await uow.commit()
    document = await mongo.db["resources"].find_one({"_id": "Observation/o2"})
    (row,) = [r for r in document["ix"]["quantity"] if r["param"] == "value-quantity"]
    assert row["lo"] == row["hi"] == Decimal128("0.3")
    assert row["nlo"] == Decimal128("0.0003") and row["ncode"] == "mol/L"  # in its base unit

    async def found(value: str) -> list[str]:
        search = parse_search(REGISTRY, ["Observation"], [("value-quantity", value),
                                                          ("_sort", "value-quantity")])
        return [r.id for r in (await mongo.search(search)).resources]
    assert await found("0.3") == ["o2"]  # 0.1 + 0.2 would not be, as doubles
    assert await found("gt0.1") == ["o2", "o3"]
    assert await found("le0.3") == ["o1", "o2"]


async def test_history_sequence_numbers_round_trip_and_page(mongo):
    for n in range(3):
        async with mongo.unit_of_work() as uow:
            uow.update("Observation", "o1", glucose("o1", 5.0 + n))
            await uow.commit()
    first = await mongo.history("Observation", "o1", count=2)
    assert [e.version for e in first.entries] == [3, 2] and first.total == 3
    assert seq_number(seq_id(first.entries[-1].seq)) == first.entries[-1].seq
    rest = await mongo.history("Observation", "o1", before_seq=first.entries[-1].seq)
    assert [e.version for e in rest.entries] == [1]
    at = await mongo.history("Observation", "o1", at_or_before=first.entries[-1].last_updated)
    assert [e.version for e in at.entries] == [2, 1]


async def test_a_transaction_bundle_on_a_standalone_server_is_refused_whole(tmp_path):
    async with serving("mongodb", tmp_path) as (app, client):
        if app.state.services.store.transactions:
            pytest.skip("the server has transactions")
        user = await make_clinic_admin(client)
        headers = {**user["headers"], **FHIR}
        bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"fullUrl": "urn:uuid:6f1c1d2e-0000-4000-8000-000000000001",
             "resource": {"resourceType": "Patient", "name": [{"family": "Wafula"}]},
             "request": {"method": "POST", "url": "Patient"}},
            {"resource": glucose("x", 5.4, "x") | {"subject": {
                "reference": "urn:uuid:6f1c1d2e-0000-4000-8000-000000000001"}},
             "request": {"method": "POST", "url": "Observation"}}]}
        response = await client.post("/fhir", json=bundle, headers=headers)
        assert response.status_code == 501
        issue = response.json()["issue"][0]
        assert issue["code"] == "not-supported" and "replica set" in issue["diagnostics"]
        found = await client.get("/fhir/Patient", params={"family": "wafula"},
                                 headers=headers)
        assert found.json().get("total") == 0


def test_mongo_init_makes_collections_and_indexes(tmp_path):
    url = store_url("mongodb", tmp_path)
    try:
        result = CliRunner().invoke(cli, ["mongo-init", "--url", url])
        assert result.exit_code == 0, result.output
        assert "MongoDB ready" in result.output
        assert "resources:" in result.output and "history:" in result.output
    finally:
        asyncio.run(drop_database(url))
    refused = CliRunner().invoke(cli, ["mongo-init", "--url", "sqlite:///x.db"])
    assert refused.exit_code == 2 and "not a MongoDB URL" in refused.output


# --- a real replica set only ----------------------------------------------------------------

async def test_concurrent_updates_of_one_resource_are_retried_into_versions(mongo):
    """Two transactions writing the same resource conflict; the driver's
    with_transaction retries the loser, which then writes the next version."""
    if not mongo.transactions:
        pytest.skip("needs a MongoDB replica set (multi-document transactions): set "
                    "HEALTHPLATFORM_TEST_MONGODB_URI")
    async with mongo.unit_of_work() as uow:
        uow.create("Observation", "o1", glucose("o1", 5.0))
        await uow.commit()

    async def update(value: float) -> int:
        async with mongo.unit_of_work() as uow:
            staged = uow.update("Observation", "o1", glucose("o1", value))
            await uow.commit()
        return staged.result.version

    versions = await asyncio.gather(*(update(6.0 + n) for n in range(8)))
    assert sorted(versions) == list(range(2, 10))
    assert (await mongo.history("Observation", "o1")).total == 9
