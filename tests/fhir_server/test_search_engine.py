"""The search engine's parts without HTTP: the generated registry, the FHIRPath compiler,
value normalization, index extraction and search parsing."""

from __future__ import annotations

import importlib.util
import json
import lzma
from pathlib import Path

import pytest

from fhir_server.search.dates import _parse_range, date_range
from fhir_server.search.extract import IndexExtractor, full_text
from fhir_server.search.fhirpath import (
    Compiler,
    UnsupportedExpression,
    compile_expression,
    expression_for,
)
from fhir_server.search.plan import (
    ChainCriterion,
    HasCriterion,
    SearchError,
    TokenCriterion,
    parse_search,
    split_escaped,
    unescape,
)
from fhir_server.search.registry import builtin_registry
from fhir_server.search.summary import select_elements, summarize
from fhir_server.search.units import canonical
from fhir_server.search.values import normalize, number_range, parse_reference

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "data" / "fhir-r4"  # the official definitions, xz-compressed
REGISTRY = builtin_registry()


# --- the generated registry ---------------------------------------------------------------

def test_registry_holds_every_official_parameter():
    definitions = json.loads(lzma.decompress((SOURCE / "search-parameters.json.xz")
                                             .read_bytes()))["entry"]
    assert len(definitions) == 1378
    urls = {p.url for params in REGISTRY.by_type.values() for p in params.values()}
    assert {d["resource"]["url"] for d in definitions} <= urls
    observation = REGISTRY.params("Observation")
    assert observation["code"].expression == "Observation.code"  # only its own part
    assert observation["patient"].expression == \
        "Observation.subject.where(resolve() is Patient)"
    assert observation["_lastUpdated"].type == "date"  # Resource parameters apply to all
    assert REGISTRY.compartment_params("Patient", "Observation") == ("subject", "performer")


def test_committed_registry_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location(
        "generate_search_parameters", ROOT / "scripts" / "generate_search_parameters.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    committed = (ROOT / "fhir_server" / "data" / "search_parameters.json").read_text()
    assert generator.dump(generator.build(SOURCE)) == committed


def test_every_definition_compiles_to_the_fast_evaluator():
    compiler = Compiler(REGISTRY.by_type, REGISTRY.choice_elements)
    failures = []
    for resource_type, params in REGISTRY.by_type.items():
        for param in params.values():
            expressions = [param.expression] if param.expression else []
            for expression in expressions:
                try:
                    compiler.compile(expression)
                except UnsupportedExpression as exc:
                    failures.append((resource_type, param.code, str(exc)))
            for component in param.components:
                compiler.compile(component.expression)
    assert failures == []


# --- FHIRPath ------------------------------------------------------------------------------

OBSERVATION = {
    "resourceType": "Observation", "status": "final",
    "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
    "subject": {"reference": "Patient/p1"},
    "performer": [{"reference": "Practitioner/d1"}, {"reference": "#org"}],
    "contained": [{"resourceType": "Organization", "id": "org"}],
    "valueQuantity": {"value": 72, "code": "/min"},
    "extension": [{"url": "http://example.org/ext", "valueString": "from the ward"}],
    "component": [{"code": {"text": "a"}, "valueString": "x"},
                  {"code": {"text": "b"}, "valueInteger": 3}],
}


@pytest.mark.parametrize(("expression", "expected"), [
    ("Observation.status", ["final"]),
    ("Patient.gender", []),
    ("Observation.value.ofType(Quantity).value", [72]),
    ("(Observation.value as Quantity).code", ["/min"]),
    ("Observation.value.as(Quantity).value", [72]),
    ("Observation.value.ofType(string)", []),
    ("Observation.value.value", [72]),  # a choice without a type: any value[x]
    ("Observation.subject.where(resolve() is Patient).reference", ["Patient/p1"]),
    ("Observation.performer.where(resolve() is Organization).reference", ["#org"]),
    ("Observation.performer.where(resolve() is Patient)", []),
    ("Observation.code.coding.where(system='http://loinc.org').code", ["8867-4"]),
    ("Observation.code.coding.where(system!='http://loinc.org')", []),
    ("Observation.extension('http://example.org/ext').value", ["from the ward"]),
    ("Observation.component.code.text | Observation.status", ["a", "b", "final"]),
    ("Observation.component[1].value", [3]),
    ("Observation.component.first().code.text", ["a"]),
    ("Observation.component.last().value.ofType(integer)", [3]),
    ("Observation.performer.exists() and Observation.status = 'final'", [True]),
    ("Observation.note.exists() or Observation.note.empty()", [True]),
    ("Observation.performer.count() > 1", [True]),
    ("Observation.status.exists().not()", [False]),
    ("%resource.status", ["final"]),
    ("Observation.component.where($this.code.text = 'b').value", [3]),
])
def test_fhirpath_subset(expression, expected):
    evaluate = compile_expression(expression, REGISTRY.compiler)
    assert evaluate(OBSERVATION) == expected


def test_expressions_outside_the_subset_fall_back_or_are_refused():
    with pytest.raises(UnsupportedExpression):
        REGISTRY.compiler.compile("Patient.name.given.substring(0, 1)")
    evaluate = REGISTRY.evaluator("Patient", "Patient.name.given.substring(0, 1)")
    if importlib.util.find_spec("fhirpathpy") is None:
        assert evaluate is None
    else:  # fhirpathpy interprets what the compiler does not
        assert evaluate is not None
        assert evaluate({"resourceType": "Patient", "name": [{"given": ["Amina"]}]}) == ["A"]


def test_gates_name_the_elements_an_expression_reads():
    compiler = REGISTRY.compiler
    assert compiler.gates("Observation.code | Observation.component.code") == {"code",
                                                                               "component"}
    assert compiler.gates("Observation.value.ofType(Quantity)") == {"valueQuantity"}
    assert compiler.gates("Patient.deceased.exists() and Patient.deceased != false") is None


def test_expression_for_keeps_the_part_of_one_type():
    shared = "AllergyIntolerance.patient | CarePlan.subject.where(resolve() is Patient)"
    assert expression_for(shared, "CarePlan") == "CarePlan.subject.where(resolve() is Patient)"
    assert expression_for("name | alias", "InsurancePlan") == \
        "InsurancePlan.name | InsurancePlan.alias"


# --- values ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "separator", "parts"), [
    ("a,b", ",", ["a", "b"]),
    ("a\\,b,c", ",", ["a\\,b", "c"]),
    ("sys|code\\|x", "|", ["sys", "code\\|x"]),
    ("8867-4$gt100", "$", ["8867-4", "gt100"]),
    ("a\\$b$c", "$", ["a\\$b", "c"]),
])
def test_split_escaped(text, separator, parts):
    assert split_escaped(text, separator) == parts


def test_unescape():
    assert unescape("moi\\, referral \\| x \\$ y \\\\") == "moi, referral | x $ y \\"


@pytest.mark.parametrize(("text", "expected"), [
    ("100", (100.0, 99.5, 100.5)),
    ("100.0", (100.0, 99.95, 100.05)),
    ("0.32", (0.32, 0.315, 0.325)),
    ("1e2", (100.0, 50.0, 150.0)),
])
def test_number_precision_ranges(text, expected):
    assert number_range(text) == pytest.approx(expected)


@pytest.mark.parametrize("value", [
    "2024", "2024-03", "2024-02-29", "2024-12-31", "2024-03-01T10:00:00+01:00",
    "2024-03-01T10:00:00Z", "2024-03-01T10:00:00-05:30", "2024-03-01T10:00:00.123Z",
    "2024-03-01T10:00Z",
])
def test_date_fast_paths_agree_with_the_parser(value):
    assert date_range(value) == _parse_range(value)
    lo, hi = date_range(value)
    assert lo < hi


def test_normalize_reference_and_units():
    assert normalize("Zoë MÜLLER") == "zoe muller"
    assert parse_reference("Patient/p1/_history/2") == ("Patient", "p1", None)
    assert parse_reference("https://x.org/fhir/Patient/p1") == (
        "Patient", None, "https://x.org/fhir/Patient/p1")
    assert parse_reference("http://x.org/Questionnaire/q|2.0").url == \
        "http://x.org/Questionnaire/q"
    assert canonical(70.5, "kg") == ("g", 70500.0)
    assert canonical(37.0, "Cel") == ("K", pytest.approx(310.15))
    assert canonical(1.0, "{furlong}") is None


# --- extraction ---------------------------------------------------------------------------

def test_extraction_rows_for_an_observation():
    rows = IndexExtractor(REGISTRY)({**OBSERVATION, "effectiveDateTime": "2024-03-01"}).rows
    assert ("code", "http://loinc.org", "8867-4", None) in rows["token"]
    assert ("subject", "Patient", "p1", None) in rows["reference"]
    assert ("patient", "Patient", "p1", None) in rows["reference"]
    assert ("date", "2024-03-01T00:00:00.000000Z", "2024-03-02T00:00:00.000000Z") in rows["date"]
    assert ("value-quantity", None, "/min", 72.0, 72.0, "/min", 72.0, 72.0) in rows["quantity"]
    assert not any(r[0] == "combo-value-quantity" for r in rows["quantity"])  # a union
    assert any(r[0] == "code-value-quantity" for r in rows["composite"])


def test_extraction_rows_for_a_patient():
    rows = IndexExtractor(REGISTRY)({
        "resourceType": "Patient", "name": [{"family": "Müller", "given": ["Zoë"]}],
        "identifier": [{"system": "urn:x", "value": "7", "type": {"coding": [{"code": "MR"}]}}],
        "birthDate": "2001-02", "deceasedBoolean": False,
        "text": {"div": "<div><b>Zoë</b> Müller</div>"},
    }).rows
    assert ("family", "muller", "Müller") in rows["string"]
    assert ("identifier:of-type", None, "MR|7", None) in rows["token"]
    assert ("deceased", None, "false", None) in rows["token"]
    assert ("birthdate", "2001-02-01T00:00:00.000000Z", "2001-03-01T00:00:00.000000Z") in \
        rows["date"]
    narrative, content = rows["text"][0]
    assert "Zoë" in narrative and "<b>" not in narrative and "Müller" in content


def test_full_text_leaves_out_identifiers_and_urls():
    narrative, content = full_text({"resourceType": "Patient", "id": "x1",
                                    "name": [{"family": "Hassan"}],
                                    "meta": {"profile": ["http://example.org/p"]}})
    assert narrative == "" and content == "Hassan"


# --- parsing searches ------------------------------------------------------------------------

def test_parse_chains_has_and_modifiers():
    plan = parse_search(REGISTRY, ["Observation"], [
        ("subject:Patient.organization.name", "aga"), ("code:not", "8867-4"),
        ("_sort", "-date,code"), ("_count", "5000"), ("_include", "Observation:subject")])
    chain = plan.clauses[0].criteria[0]
    assert isinstance(chain, ChainCriterion) and chain.target_types == ("Patient",)
    assert isinstance(chain.clause.criteria[0], ChainCriterion)
    assert plan.clauses[1].negate and plan.clauses[1].criteria == (TokenCriterion(None,
                                                                                  "8867-4"),)
    assert [(k.param, k.descending) for k in plan.sort] == [("date", True), ("code", False)]
    assert plan.count == 1000  # capped
    has = parse_search(REGISTRY, ["Patient"], [("_has:Observation:patient:code", "1234")])
    assert isinstance(has.clauses[0].criteria[0], HasCriterion)


def test_parse_lenient_and_strict():
    lenient = parse_search(REGISTRY, ["Patient"], [("shoe-size", "42"), ("family:above", "x")])
    assert [name for name, _ in lenient.ignored] == ["shoe-size", "family:above"]
    with pytest.raises(SearchError):
        parse_search(REGISTRY, ["Patient"], [("shoe-size", "42")], strict=True)
    with pytest.raises(SearchError):
        parse_search(REGISTRY, ["Patient"], [("birthdate", "last tuesday")])


# --- _summary / _elements ----------------------------------------------------------------------

def test_summary_and_elements_mark_the_resource_subsetted():
    patient = {"resourceType": "Patient", "id": "p", "text": {"div": "<div/>"},
               "name": [{"family": "Okafor"}], "photo": [{"url": "x"}], "gender": "male"}
    summary = summarize(patient, "true", REGISTRY)
    assert "photo" not in summary and "text" not in summary and summary["gender"] == "male"
    assert summary["meta"]["tag"][0]["code"] == "SUBSETTED"
    assert set(select_elements(patient, ["gender"], REGISTRY)) == {"resourceType", "id", "meta",
                                                                  "gender"}


def test_date_values_of_every_shape_become_ranges():
    extract = IndexExtractor(REGISTRY)
    plan = {  # CarePlan activity-date reads Timing, Period and string schedules
        "resourceType": "CarePlan", "status": "active", "intent": "plan",
        "subject": {"reference": "Patient/p1"},
        "period": {"start": "2024-01-01"},
        "activity": [
            {"detail": {"status": "scheduled", "scheduledTiming": {
                "event": ["2024-02-01T08:00:00Z", "2024-02-03T08:00:00Z"],
                "repeat": {"boundsPeriod": {"start": "2024-01-15", "end": "2024-03-31"}}}}},
            {"detail": {"status": "scheduled",
                        "scheduledPeriod": {"start": "2024-05-01", "end": "2024-05-02"}}},
        ],
    }
    rows = extract(plan).rows["date"]
    assert ("date", "2024-01-01T00:00:00.000000Z", "9999-12-31T23:59:59.999999Z") in rows
    assert ("activity-date", "2024-01-15T00:00:00.000000Z", "2024-04-01T00:00:00.000000Z") \
        in rows
    assert ("activity-date", "2024-05-01T00:00:00.000000Z", "2024-05-03T00:00:00.000000Z") \
        in rows
