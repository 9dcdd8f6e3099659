"""Discovery has the shape of the spec's discovery example, one entry per (service,
hook); a call finds its service or says why not."""

from __future__ import annotations

import pytest

from cds_hooks import catalogue
from cds_hooks.models import CdsError, Discovery
from tests.cds_hooks.examples_data import example


def test_discovery_has_the_shape_of_the_specs_example() -> None:
    Discovery.model_validate(example("discovery-response.spec-example.json"))
    ours = catalogue.discovery().model_dump(exclude_none=True)
    spec_keys = {k for s in example("discovery-response.spec-example.json")["services"]
                 for k in s}
    assert all(set(s) <= spec_keys for s in ours["services"])
    assert len({(s["id"], s["hook"]) for s in ours["services"]}) == len(ours["services"])


def test_a_call_finds_its_service_or_says_why_not() -> None:
    assert catalogue.service("news2", "encounter-start").id == "news2"
    with pytest.raises(CdsError) as unknown:
        catalogue.service("pgx-on-order-sign", "order-sign")
    assert unknown.value.status == 404
    with pytest.raises(CdsError) as wrong:
        catalogue.service("news2", "order-sign")
    assert (wrong.value.status, wrong.value.field) == (400, "hook")
    assert {s.id for s in catalogue.for_hook("order-sign")} == {
        "drug-interactions", "allergy-conflicts"}
