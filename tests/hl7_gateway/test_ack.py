"""hl7_gateway.ack: acknowledgement modes, ACK/NAK content per version, header checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from hl7_gateway.ack import (
    AckCode,
    AckMode,
    ErrorDetail,
    HeaderPolicy,
    Outcome,
    Severity,
    ack_code_for,
    ack_mode,
    application_ack_required,
    build_ack,
    build_failure_ack,
    build_header_reject,
    build_response_ack,
    build_unparseable_ack,
    check_header,
    commit_ack_required,
    new_control_id,
)
from hl7_gateway.parser import HL7ParseError, Message, encode_message, parse
from tests.hl7_gateway.hl7_samples import sample_bytes

AT = datetime(2024, 3, 1, 10, 15, 0, tzinfo=UTC)


def oru(version: str = "2.5.1", msh15: str = "", msh16: str = "", processing: str = "P") -> Message:
    return parse(
        f"MSH|^~\\&|LABSYS|CITY LAB^2.16.840.1.1^ISO|EHR|CITY HOSP|20240301101500||"
        f"ORU^R01^ORU_R01|LAB-20240301-0042|{processing}|{version}|||{msh15}|{msh16}\r"
        "PID|1||556677^^^CITY^MR||Haddad^Samir\r"
        "OBR|1||F-9|2345-7^Glucose^LN\r"
        "OBX|1|NM|2345-7^Glucose^LN||5.4|mmol/L|3.9-7.8|N|||F\r"
    )


def segments(ack: str) -> dict[str, list[str]]:
    """Segment id -> its fields (MSH numbered as the standard numbers it)."""
    result = {}
    for line in ack.rstrip("\r").split("\r"):
        fields = line.split("|")
        if fields[0] == "MSH":
            fields.insert(1, "|")
        result.setdefault(fields[0], fields)
    return result


# --- original mode ------------------------------------------------------------------


def test_original_mode_aa_swaps_sender_and_receiver_and_echoes_control_id() -> None:
    ack = build_ack(oru(), AckCode.AA, control_id="ACK-1", timestamp=AT)
    assert ack == (
        "MSH|^~\\&|EHR|CITY HOSP|LABSYS|CITY LAB^2.16.840.1.1^ISO|20240301101500+0000||"
        "ACK^R01^ACK|ACK-1|P|2.5.1\r"
        "MSA|AA|LAB-20240301-0042\r"
    )


def test_ack_gets_a_fresh_control_id_and_parses_back() -> None:
    message = oru()
    ack = parse(build_ack(message, AckCode.AA))
    assert ack.control_id != message.control_id
    assert len(ack.control_id) == 20
    assert (ack.message_type, ack.trigger_event, ack.message_structure) == ("ACK", "R01", "ACK")
    assert ack.segment("MSA").field(2) == "LAB-20240301-0042"
    assert new_control_id() != new_control_id()


def test_original_mode_application_error_carries_a_v25_err_segment() -> None:
    error = ErrorDetail(101, "PID-3 patient identifier is required", "PID", 1, 3)
    ack = segments(build_ack(oru(), AckCode.AE, errors=[error]))
    assert ack["MSA"][1:] == ["AE", "LAB-20240301-0042", "PID-3 patient identifier is required"]
    err = ack["ERR"]
    assert err[1] == ""
    assert err[2] == "PID^1^3"
    assert err[3] == "101^Required field missing^HL70357"
    assert err[4] == "E"
    assert err[8] == "PID-3 patient identifier is required"


def test_every_error_gets_its_own_err_segment_from_v25_on() -> None:
    errors = [
        ErrorDetail(102, "OBX-5 is not a number", "OBX", 2, 5),
        ErrorDetail(103, "OBX-8 'Q' not in table 0078", "OBX", 2, 8, severity=Severity.WARNING),
    ]
    ack = parse(build_ack(oru("2.6"), AckCode.AE, errors=errors))
    err = ack.segments("ERR")
    assert [e.field(2) for e in err] == ["OBX^2^5", "OBX^2^8"]
    assert [e.component(3, 1) for e in err] == ["102", "103"]
    assert [e.field(4) for e in err] == ["E", "W"]


def test_before_v25_errors_go_into_err_1_as_segment_sequence_field_code() -> None:
    errors = [
        ErrorDetail(101, "PID-3 is required", "PID", 1, 3),
        ErrorDetail(207, "database unavailable"),
    ]
    ack = build_ack(oru("2.3"), AckCode.AR, errors=errors)
    fields = segments(ack)
    assert fields["ERR"] == [
        "ERR",
        "PID^1^3^101&PID-3 is required&HL70357~^^^207&database unavailable&HL70357",
    ]
    assert fields["MSH"][9] == "ACK^R01"  # MSH-9.3 only exists from v2.3.1
    assert fields["MSH"][12] == "2.3"


@pytest.mark.parametrize(
    ("version", "has_structure", "err_layout"),
    [
        ("2.2", False, "ERR-1"),
        ("2.3", False, "ERR-1"),
        ("2.3.1", True, "ERR-1"),
        ("2.4", True, "ERR-1"),
        ("2.5", True, "ERR-3"),
        ("2.5.1", True, "ERR-3"),
        ("2.6", True, "ERR-3"),
        ("2.7", True, "ERR-3"),
        ("2.8", True, "ERR-3"),
    ],
)
def test_ack_layout_follows_the_message_version(
    version: str, has_structure: bool, err_layout: str
) -> None:
    ack = parse(build_ack(oru(version), AckCode.AE, errors=[ErrorDetail(199, "bad", "OBX", 1, 5)]))
    assert ack.version == version
    assert (ack.message_structure == "ACK") is has_structure
    err = ack.segment("ERR")
    if err_layout == "ERR-3":
        assert err.component(3, 1) == "199" and err.field(8) == "bad"
    else:
        assert err.component(1, 1) == "OBX" and err.subcomponent(1, 4, 1) == "199"


def test_msa_3_is_dropped_from_v27_on() -> None:
    ack = segments(build_ack(oru("2.7"), AckCode.AE, errors=[ErrorDetail(199, "bad")]))
    assert ack["MSA"] == ["MSA", "AE", "LAB-20240301-0042"]


def test_error_text_with_delimiters_is_escaped() -> None:
    error = ErrorDetail(102, "OBX-5 'A|B^C' is not NM", "OBX", 1, 5)
    ack = parse(build_ack(oru(), AckCode.AE, errors=[error]))
    assert ack.segment("ERR").field(8) == "OBX-5 'A|B^C' is not NM"
    assert ack.segment("ERR").field_count == 8


def test_ack_reuses_the_message_delimiters_and_charset() -> None:
    message = parse(
        "MSH*%$!@*LAB*NORTH*EHR*SOUTH*20240301**ORU%R01*ID-9*P*2.4*****BE*8859/1\rPID*1\r"
    )
    ack_text = build_ack(message, AckCode.AE, errors=[ErrorDetail(199, "Température*élevée")])
    ack = parse(encode_message(ack_text))
    assert ack.msh.field(2) == "%$!@"
    assert ack.msh.field(3) == "EHR"
    assert ack.charset == "latin-1"
    assert ack.segment("MSA").field(3) == "Température*élevée"


# --- enhanced mode --------------------------------------------------------------------


def test_mode_is_original_only_when_msh_15_and_16_are_both_empty() -> None:
    assert ack_mode(oru()) is AckMode.ORIGINAL
    assert ack_mode(oru(msh15="AL")) is AckMode.ENHANCED
    assert ack_mode(oru(msh16="NE")) is AckMode.ENHANCED
    assert ack_mode(parse(sample_bytes("12"))) is AckMode.ENHANCED


@pytest.mark.parametrize(
    ("condition", "accept", "error", "reject"),
    [
        ("AL", True, True, True),
        ("NE", False, False, False),
        ("ER", False, True, True),
        ("SU", True, False, False),
        ("", True, True, True),  # enhanced mode with this one empty: treated as AL
    ],
)
def test_table_0155_conditions_decide_commit_and_application_acks(
    condition: str, accept: bool, error: bool, reject: bool
) -> None:
    expected = {Outcome.ACCEPT: accept, Outcome.ERROR: error, Outcome.REJECT: reject}
    commit_msg = oru(msh15=condition, msh16="NE" if condition else "AL")
    app_msg = oru(msh15="NE" if condition else "AL", msh16=condition)
    for outcome, wanted in expected.items():
        assert commit_ack_required(commit_msg, outcome) is wanted
        assert application_ack_required(app_msg, outcome) is wanted


def test_original_mode_always_wants_an_application_ack_and_never_a_commit_ack() -> None:
    for outcome in Outcome:
        assert application_ack_required(oru(), outcome)
        assert not commit_ack_required(oru(), outcome)


@pytest.mark.parametrize(
    ("sample", "accept", "error"),
    [
        ("11", "CA", "CE"),  # MSH-15/16 = AL/AL
        ("12", None, "CE"),  # ER/AL
        ("13", "CA", "CE"),  # AL/ER
        ("27", None, None),  # NE/NE (the message inside the batch)
    ],
)
def test_response_ack_on_the_connection_for_enhanced_samples(
    sample: str, accept: str | None, error: str | None
) -> None:
    raw = sample_bytes(sample)
    if sample == "27":
        raw = raw[raw.index(b"MSH") :]
    message = parse(raw)
    for outcome, expected in ((Outcome.ACCEPT, accept), (Outcome.ERROR, error)):
        ack = build_response_ack(message, outcome)
        assert (parse(ack).segment("MSA").field(1) if ack else None) == expected


def test_enhanced_application_ack_uses_original_codes() -> None:
    message = parse(sample_bytes("13"))  # AL/ER
    assert ack_code_for(message, Outcome.ACCEPT) is AckCode.CA
    assert not application_ack_required(message, Outcome.ACCEPT)
    assert application_ack_required(message, Outcome.ERROR)
    ack = parse(build_ack(message, AckCode.AE, errors=[ErrorDetail(103, "unknown CVX 999")]))
    assert ack.segment("MSA").field(1) == "AE"
    assert ack.segment("MSA").field(2) == "NIST-IZ-001.00"


# --- header validation ----------------------------------------------------------------

POLICY = HeaderPolicy(
    message_types={"ORU": frozenset({"R01"}), "ADT": None}, processing_ids=frozenset({"P"})
)


def test_accepted_header_has_no_problems() -> None:
    assert check_header(oru(), POLICY) == []
    assert check_header(parse(sample_bytes("04")), POLICY) == []


@pytest.mark.parametrize(
    ("raw_msh", "code", "location"),
    [
        ("MSH|^~\\&|A|B|C|D|20240301||SIU^S12|C1|P|2.5", 200, "MSH^1^9^1^1"),
        ("MSH|^~\\&|A|B|C|D|20240301||ORU^R30|C1|P|2.5", 201, "MSH^1^9^1^2"),
        ("MSH|^~\\&|A|B|C|D|20240301||ORU^R01|C1|T|2.5", 202, "MSH^1^11"),
        ("MSH|^~\\&|A|B|C|D|20240301||ORU^R01|C1|P|3.0", 203, "MSH^1^12"),
        ("MSH|^~\\&|A|B|C|D|20240301||ORU^R01|C1|P|", 101, "MSH^1^12"),
        ("MSH|^~\\&|A|B|C|D|20240301|||C1|P|2.5", 101, "MSH^1^9"),
        ("MSH|^~\\&|A|B|C|D|20240301||ORU^R01||P|2.5", 101, "MSH^1^10"),
    ],
)
def test_unsupported_header_is_rejected_with_the_table_0357_code(
    raw_msh: str, code: int, location: str
) -> None:
    message = parse(raw_msh + "\rPID|1\r")
    problems = check_header(message, POLICY)
    assert [p.code for p in problems] == [code]
    ack = parse(build_header_reject(message, problems) or "")
    assert ack.segment("MSA").field(1) == "AR"
    assert ack.segment("ERR").field(2) == location
    assert ack.segment("ERR").component(3, 1) == str(code)


def test_malformed_processing_id_of_public_sample_is_rejected_in_v23_layout() -> None:
    message = parse(sample_bytes("24"))
    problems = check_header(message)
    assert [p.code for p in problems] == [202]
    ack = parse(build_header_reject(message, problems) or "")
    assert ack.msh.field(11) == "P"
    assert ack.segment("MSA").field(2) == "0000000001"
    assert ack.segment("ERR").raw_field(1).startswith("MSH^1^11^202&")


def test_header_reject_in_enhanced_mode_is_a_commit_reject() -> None:
    message = oru(version="9.9", msh15="AL", msh16="AL")
    ack = parse(build_header_reject(message, check_header(message)) or "")
    assert ack.segment("MSA").field(1) == "CR"
    assert ack.segment("ERR").component(3, 1) == "203"


# --- input that never reached the application ------------------------------------------


def test_unparseable_message_gets_ae_from_whatever_msh_was_readable() -> None:
    raw = b"MSH|AB12|LABSYS|CITY LAB|EHR|CITY HOSP|20240301||ORU^R01|LAB-77|P|2.4\rPID|1\r"
    with pytest.raises(HL7ParseError) as caught:
        parse(raw)
    ack = parse(build_unparseable_ack(raw, caught.value) or "")
    assert (ack.msh.field(3), ack.msh.field(5)) == ("EHR", "LABSYS")
    assert ack.trigger_event == "R01"
    assert ack.version == "2.4"
    assert ack.segment("MSA").field(1) == "AE"
    assert ack.segment("MSA").field(2) == "LAB-77"
    assert ack.segment("ERR").component(1, 3) == "2"  # ELD: MSH^1^2^102&...
    assert ack.segment("ERR").subcomponent(1, 4, 1) == "102"


def test_input_without_any_msh_still_gets_an_ack() -> None:
    ack = parse(build_unparseable_ack(b"\x00\x01 not hl7 at all", "no MSH segment") or "")
    assert ack.segment("MSA").field(1) == "AE"
    assert ack.segment("MSA").field(2) == ""
    assert ack.version == "2.5.1"
    assert ack.segment("ERR").field(8) == "no MSH segment"


def test_failure_ack_respects_an_enhanced_mode_never() -> None:
    raw = oru(msh15="NE", msh16="AL").to_er7().encode()
    detail = ErrorDetail(207, "internal error")
    assert build_failure_ack(raw, detail, Outcome.REJECT) is None
    raw = oru(msh15="ER", msh16="AL").to_er7().encode()
    ack = parse(build_failure_ack(raw, detail, Outcome.REJECT) or "")
    assert ack.segment("MSA").field(1) == "CR"


def test_version_with_an_internationalization_code_keeps_the_pre_25_layout() -> None:
    message = parse(oru("2.3^CAN").to_er7())
    ack = parse(build_ack(message, AckCode.AE, errors=[ErrorDetail(199, "bad", "PID", 1, 3)]))
    assert ack.msh.field(12) == "2.3^CAN"
    assert ack.segment("ERR").raw_field(1) == "PID^1^3^199&bad&HL70357"


def test_a_malformed_msh_2_is_named_in_the_err_text_exactly_as_sent() -> None:
    # HL7 v2.5.1 2.5.4: MSH-2 holds four (five from v2.7) distinct encoding characters; a
    # repeated "&" makes the delimiters unusable. The ERR-8 text, once its HL7 escapes are
    # decoded (2.7), must show the characters the sender wrote, not a doubly escaped copy.
    raw = (b"MSH|^~\\&&|ADT1|GOOD HEALTH HOSPITAL|GHH LAB|GOOD HEALTH HOSPITAL|"
           b"198808181126|SECURITY|ADT^A01^ADT_A01|MSG00001|P|2.5.1\r"
           b"EVN|A01|200708181123\r")
    with pytest.raises(HL7ParseError) as caught:
        parse(raw)
    ack = parse(build_unparseable_ack(raw, caught.value) or "")
    text = "MSH-2: invalid encoding characters '^~\\&&'"
    assert ack.segment("ERR").field(8) == text
    assert ack.segment("MSA").field(3) == text
    assert ack.segment("ERR").component(2, 1) == "MSH"
    assert ack.segment("ERR").component(2, 3) == "2"
