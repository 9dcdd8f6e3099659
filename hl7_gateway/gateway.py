"""The HL7v2 gateway service: one inbound message in, its acknowledgements out.

For every message, whichever transport brought it (MLLP or HTTP):

1. parse (a message that does not parse gets a NAK built from whatever MSH is readable,
   and its bytes go to the dead letters);
2. check the header (message type and event this gateway maps, version, processing id:
   AR / CR with ERR codes 200-203; the message is kept in the dead letters with why, one
   entry per MSH-3|MSH-4|MSH-10 however often it is resent, to be read and replayed);
3. look up the idempotency record (collection ``hl7_messages``, keyed by MSH-3|MSH-4|
   MSH-10): a message seen before is answered with the ACKs it got then, and stored once;
4. map it to one FHIR transaction (``hl7_gateway.v2_to_fhir``), find the stays of
   Encounters named by no identifier (``hl7_gateway.stays``), resolve merged updates;
5. commit the transaction through ``FhirService.transaction``, and in the same commit
   (its ``on_commit``) the idempotency record with the outcome and a
   ``platform.lab.result_received`` event per lab report: the resources, the record and
   the events are stored together or not at all, so a message is never half processed
   and a resend after a crash is either answered from its record or processed afresh;
7. build the ACKs: original mode AA / AE / AR; enhanced mode the commit ACK (CA / CE /
   CR, per MSH-15) and then the application ACK (per MSH-16).

Nothing is acknowledged before it is safe: AA / CA only after the commit. A message with a
line that cannot be stored while the rest can (a result without its OBX-3) is committed
without that line and answered AE, an ERR of severity E naming the segment and field for
each such line. A message that
cannot be mapped, or whose resources the FHIR server refuses, is answered AE and kept in
the dead letters (``platform.hl7.message_failed``) with the raw message, to be retried
once the cause is fixed; a storage failure is answered AR (original mode: "retry
later") / CE and is not recorded, so the sender's resend is processed afresh.

Concurrent messages about the same things (one patient, one order) are serialised per
identifier inside this process; across processes the store's conditional writes and
version checks decide, and a lost race is retried.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any, Protocol

import orjson

from fhir_server.access import Access
from fhir_server.outcome import FhirError
from fhir_server.service import FhirService
from fhir_server.store import ConditionChanged, ResourceStore, Staging, VersionConflict
from fhir_server.transactions import process_bundle
from hl7_gateway.ack import (
    AckCode,
    AckMode,
    ErrorDetail,
    HeaderPolicy,
    Outcome,
    Severity,
    ack_mode,
    application_ack_required,
    build_ack,
    build_unparseable_ack,
    check_header,
    commit_ack_required,
)
from hl7_gateway.merge import AmbiguousMatch, resolve_merges
from hl7_gateway.parser import (
    HL7ParseError,
    Message,
    decode_message,
    parse,
    read_msh_leniently,
)
from hl7_gateway.stays import resolve_stays
from hl7_gateway.v2_to_fhir import SUPPORTED_MESSAGES, MappedMessage, MappingError, map_message
from hl7_gateway.v2_to_fhir.bundle import identifier_token
from hl7_gateway.v2_to_fhir.context import message_namespace

DEFAULT_MAX_SEGMENTS = 10_000

__all__ = [
    "DEAD_LETTERS",
    "FAILED_TOPIC",
    "MESSAGES",
    "RESULT_TOPIC",
    "HL7Gateway",
    "Processed",
    "build_acks",
    "idempotency_key",
    "kind_of",
]

log = logging.getLogger("healthplatform.hl7")

JSON = dict[str, Any]
MESSAGES = "hl7_messages"
DEAD_LETTERS = "dead_letters"
FAILED_TOPIC = "platform.hl7.message_failed"
RESULT_TOPIC = "platform.lab.result_received"
SOURCE_SERVICE = "hl7_gateway"
# A lost race (a concurrent write changed what a condition or an If-Match saw) is retried.
COMMIT_ATTEMPTS = 4

_APPLICATION = {Outcome.ACCEPT: AckCode.AA, Outcome.ERROR: AckCode.AE,
                Outcome.REJECT: AckCode.AR}
_COMMIT = {Outcome.ACCEPT: AckCode.CA, Outcome.ERROR: AckCode.CE, Outcome.REJECT: AckCode.CR}
_NORMAL_FLAGS = frozenset({"N", "NEG", "ND", "NR", "S"})
_CRITICAL = frozenset({"AA", "HH", "LL", "HU", "LU"})


class FhirTransactions(Protocol):
    """What the gateway needs of the FHIR side: one transaction per message, a search."""

    store: ResourceStore

    async def transaction(self, bundle: JSON, *, base_url: str = "",
                          prefer: str | None = None,
                          on_commit: Callable[[Staging, Sequence[str]], None] | None = None
                          ) -> JSON: ...
    async def search(self, resource_type: str, params: list[tuple[str, str]]) -> list[JSON]: ...


class SystemTransactions:
    """The FHIR service as the gateway writes through it: as the system itself. A lab
    interface is a trusted door (MLLP from the network it is configured on, HTTP ingest
    by an authorized caller); what a message stores belongs to the organizations that own
    the patient it is about (``fhir_server.ownership``)."""

    def __init__(self, service: FhirService, access: Access):
        # ``access``: the system's, handed over by the platform's access policy (its one
        # named elevation: the gateway imports no system rights of its own).
        self.service, self.store, self.access = service, service.store, access

    async def transaction(self, bundle: JSON, *, base_url: str = "",
                          prefer: str | None = None,
                          on_commit: Callable[[Staging, Sequence[str]], None] | None = None
                          ) -> JSON:
        return await process_bundle(self.service, bundle, access=self.access, base_url=base_url,
                                    prefer=prefer, on_commit=on_commit)

    async def search(self, resource_type: str, params: list[tuple[str, str]]) -> list[JSON]:
        return await self.service.search(resource_type, params)


def idempotency_key(message: Message) -> str:
    """MSH-3|MSH-4|MSH-10: IHE makes the control id unique per sending application."""
    msh = message.msh
    return f"{msh.raw_field(3)}|{msh.raw_field(4)}|{message.control_id}"


@dataclass
class Processed:
    """What became of one message, and what to answer."""

    outcome: Outcome
    acks: list[str]
    errors: list[ErrorDetail] = field(default_factory=list)
    control_id: str = ""
    message_type: str = ""
    duplicate: bool = False
    resources: list[str] = field(default_factory=list)  # "Type/id" written or referenced
    dead_letter_id: str | None = None

    @property
    def ack_code(self) -> str:
        """MSA-1 of the last ACK (the application ACK when there is one)."""
        if not self.acks:
            return ""
        msa = parse(self.acks[-1]).segment("MSA")
        return msa.field(1) if msa is not None else ""

    def to_json(self) -> JSON:
        return {"outcome": self.outcome.value, "ack_code": self.ack_code, "acks": self.acks,
                "ack": self.acks[-1] if self.acks else None, "control_id": self.control_id,
                "message_type": self.message_type, "duplicate": self.duplicate,
                "resources": self.resources, "dead_letter_id": self.dead_letter_id,
                "errors": [{"code": e.code, "severity": e.severity.value,
                            "message": e.message, "segment": e.segment or None,
                            "field": e.field} for e in self.errors]}


class _StorageFailure(Exception):
    """The commit failed for reasons unrelated to the message (the sender may retry)."""


class _KeyedLocks:
    """Per-key asyncio locks, held in sorted order (no deadlock), dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, keys: Iterable[str]) -> AsyncIterator[None]:
        registered: list[str] = []
        acquired: set[str] = set()
        try:
            for key in sorted(set(keys)):
                lock, users = self._locks.get(key, (asyncio.Lock(), 0))
                self._locks[key] = (lock, users + 1)
                registered.append(key)
                await lock.acquire()
                acquired.add(key)
            yield
        finally:
            for key in reversed(registered):
                lock, users = self._locks[key]
                if key in acquired:
                    lock.release()
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


def build_acks(message: Message, outcome: Outcome, errors: Sequence[ErrorDetail], *,
               safe: bool, commit_outcome: Outcome | None = None) -> list[str]:
    """The ACKs for ``message``; ``safe``: the message is in safe storage (committed, or
    kept in the dead letters), which is what a commit ACK CA asserts.

    ``commit_outcome`` overrides the commit ACK of an unsafe message: a storage failure
    is AR in original mode ("retry later") but CE in enhanced mode (CR would claim the
    header is incompatible).
    """
    if ack_mode(message) is AckMode.ORIGINAL:
        return [build_ack(message, _APPLICATION[outcome], errors=errors)]
    acks = []
    committed = Outcome.ACCEPT if safe else commit_outcome or outcome
    if commit_ack_required(message, committed):
        acks.append(build_ack(message, _COMMIT[committed], errors=[] if safe else errors))
    if safe and application_ack_required(message, outcome):
        acks.append(build_ack(message, _APPLICATION[outcome], errors=errors))
    return acks


class HL7Gateway:
    """Turns v2 messages into committed FHIR transactions and answers with ACKs."""

    def __init__(self, fhir: FhirService | FhirTransactions, *, access: Access | None = None,
                 default_tz: tzinfo = UTC, policy: HeaderPolicy | None = None,
                 max_segments: int = DEFAULT_MAX_SEGMENTS) -> None:
        if isinstance(fhir, FhirService):
            if access is None:
                raise TypeError("the gateway writes with the access it is given (the "
                                "platform's elevation for its interfaces)")
            fhir = SystemTransactions(fhir, access)
        self.fhir: FhirTransactions = fhir
        self.store: ResourceStore = fhir.store
        self.default_tz = default_tz
        self.policy = policy or HeaderPolicy(message_types=SUPPORTED_MESSAGES)
        self.max_segments = max_segments
        self._locks = _KeyedLocks()

    # -- entry points (a door's payload, batch or message: ``hl7_gateway.intake``) ----------
    async def process(self, raw: bytes | str, *, replay: bool = False) -> Processed:
        """Process one message; ``replay`` reprocesses a message whose earlier attempt
        failed (a dead letter retry) instead of answering with the recorded outcome."""
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        try:
            message = parse(data)
        except HL7ParseError as exc:
            return await self._unparseable(data, exc, replay)
        problems = check_header(message, self.policy) or self._check_size(message)
        if problems:
            return await self._rejected(message, data, problems, replay)
        key = idempotency_key(message)
        async with self._locks.hold([f"message:{key}"]):
            record = None if replay else await self.store.get_document(MESSAGES, key)
            if record is not None:
                return _from_record(record)
            return await self._process_new(message, data, key, replay)

    def _check_size(self, message: Message) -> list[ErrorDetail]:
        """A message of more segments than ``max_segments`` is refused (AR) before it is
        mapped: one ORU of 100,000 OBX would be a transaction of as many Observations,
        validated and indexed while every other message and request waits."""
        if len(message) <= self.max_segments:
            return []
        return [ErrorDetail(199, f"the message has {len(message):,} segments; the limit is "
                            f"{self.max_segments:,} (HEALTHPLATFORM_HL7_MAX_SEGMENTS): "
                            "send the results in several messages", "MSH")]

    # -- the steps ---------------------------------------------------------------------------
    async def _process_new(self, message: Message, raw: bytes, key: str, replay: bool
                           ) -> Processed:
        received = datetime.now(UTC)
        try:
            mapped = self._map(message, raw, received)
        except MappingError as exc:
            return await self._failed(message, raw, key, [exc.detail], received, replay)
        conditions = [f"{e.resource['resourceType']}:{identifier_token(e.identifier)}"
                      for e in mapped.entries if e.identifier is not None]
        committed: list[Processed] = []

        def record(staging: Staging, written: Sequence[str], *, mapped: MappedMessage
                   ) -> None:
            """Inside the commit: the outcome and the events, with the resources' ids.

            Segments that could not be stored (``mapped.errors``) make it an AE for a
            message whose other resources are committed: the ERR segments say which."""
            outcome = Outcome.ERROR if mapped.errors else Outcome.ACCEPT
            errors = [*mapped.errors, *mapped.warnings]
            acks = build_acks(message, outcome, errors, safe=True)
            processed = Processed(outcome, acks, errors, message.control_id,
                                  kind_of(message), resources=[r for r in written if r])
            staging.put_document(MESSAGES, key, _record_of(key, message, processed,
                                                           received, {}))
            for event_id, payload in _result_events(message, mapped, written):
                staging.emit(RESULT_TOPIC, payload, event_id=event_id,
                             source_service=SOURCE_SERVICE)
            committed[:] = [processed]

        async with self._locks.hold(conditions):
            try:
                await self._commit(message, raw, received, mapped, record)
            except AmbiguousMatch as exc:
                return await self._failed(message, raw, key, [ErrorDetail(205, str(exc))],
                                          received, replay)
            except FhirError as exc:
                detail = ErrorDetail(207, "the FHIR server refused the mapped resources: "
                                     + _fhir_message(exc))
                return await self._failed(message, raw, key, [detail], received, replay)
            except _StorageFailure as exc:
                return await self._storage_failure(message, raw, key, exc, replay)
        return committed[0]

    def _map(self, message: Message, raw: bytes, received: datetime) -> MappedMessage:
        try:
            return map_message(message, raw, received_at=received, default_tz=self.default_tz)
        except MappingError:
            raise
        except Exception as exc:  # a mapper bug must not lose the message: NAK + dead letter
            log.exception("mapping %s %s failed", kind_of(message), message.control_id)
            raise MappingError(ErrorDetail(207, f"internal error while mapping: {exc}")
                               ) from exc

    async def _commit(self, message: Message, raw: bytes, received: datetime,
                      mapped: MappedMessage,
                      record: Callable[..., None]) -> None:
        """Commit the mapped transaction, ``record`` (outcome, events) in the same commit;
        a lost race maps the message again and retries."""
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                await resolve_stays(mapped.entries, self.fhir.search)
                await resolve_merges(mapped.entries, self.fhir.search)
                await self.fhir.transaction(mapped.bundle, prefer="minimal",
                                            on_commit=functools.partial(record, mapped=mapped))
                return
            except AmbiguousMatch:
                raise
            except FhirError as exc:
                if exc.status >= 500:
                    raise _StorageFailure(_fhir_message(exc)) from exc
                if not _lost_race(exc):
                    raise
                failure: Exception = exc
            except (VersionConflict, ConditionChanged) as exc:
                failure = exc
            except Exception as exc:
                log.exception("committing %s %s failed", kind_of(message), message.control_id)
                raise _StorageFailure(f"{type(exc).__name__}: {exc}") from exc
            log.info("retrying %s %s after a concurrent write (%s), attempt %d",
                     kind_of(message), message.control_id, failure, attempt)
            mapped = self._map(message, raw, received)  # merges must see the new state
        raise _StorageFailure("concurrent writes kept changing the resources of this message")

    async def _record(self, key: str, message: Message, processed: Processed,
                      received: datetime, *, extra: Mapping[str, Any] | None = None) -> None:
        async with self.store.unit_of_work() as uow:
            uow.put_document(MESSAGES, key, _record_of(key, message, processed, received,
                                                       extra or {}))
            await uow.commit()

    # -- failures ------------------------------------------------------------------------------
    async def _keep(self, raw: bytes, reason: str, *, key: str | None,
                    message: Message | None, replay: bool, entry_id: str | None = None
                    ) -> tuple[bool, str | None]:
        """Keep a message that was not stored in the dead letters: (safe, entry id).

        A replay already comes from a dead letter, which stays as it is (no second one)."""
        if replay:
            return True, None
        try:
            return True, await self.dead_letter(raw, reason, key=key, message=message,
                                                entry_id=entry_id)
        except Exception:
            log.exception("could not keep message %r in the dead letters", key)
            return False, None

    async def _failed(self, message: Message, raw: bytes, key: str,
                      errors: list[ErrorDetail], received: datetime, replay: bool
                      ) -> Processed:
        """The message cannot be stored as FHIR: AE, dead letter, outcome recorded."""
        reason = "; ".join(e.message for e in errors)
        log.warning("%s %s not stored: %s", kind_of(message), message.control_id, reason)
        safe, dead_letter = await self._keep(raw, reason, key=key, message=message,
                                             replay=replay)
        processed = Processed(Outcome.ERROR,
                              build_acks(message, Outcome.ERROR, errors, safe=safe), errors,
                              message.control_id, kind_of(message), dead_letter_id=dead_letter)
        if safe:
            await self._record(key, message, processed, received,
                               extra={"dead_letter_id": dead_letter})
        return processed

    async def _storage_failure(self, message: Message, raw: bytes, key: str,
                               exc: Exception, replay: bool) -> Processed:
        """The store failed: AR (original mode: retry later) / CE; nothing recorded."""
        errors = [ErrorDetail(207, "the message could not be stored; send it again later")]
        _, dead_letter = await self._keep(raw, f"storage failure: {exc}", key=key,
                                          message=message, replay=replay)
        acks = build_acks(message, Outcome.REJECT, errors, safe=False,
                          commit_outcome=Outcome.ERROR)
        return Processed(Outcome.REJECT, acks, errors, message.control_id, kind_of(message),
                         dead_letter_id=dead_letter)

    async def _rejected(self, message: Message, raw: bytes, problems: list[ErrorDetail],
                        replay: bool) -> Processed:
        """A header this gateway does not take (message type, version, processing id):
        AR / CR, and the message kept in the dead letters with the reason, so an interface
        analyst sees what was refused and can replay it once the gateway takes it. A resend
        of the same message (MSH-3|MSH-4|MSH-10) replaces its entry instead of adding one."""
        key = idempotency_key(message)
        reason = "rejected: " + "; ".join(e.message for e in problems)
        log.warning("%s %s rejected: %s", kind_of(message), message.control_id, reason)
        entry_id = str(uuid.uuid5(message_namespace("dead-letter", "rejected", key), "entry"))
        _, dead_letter = await self._keep(raw, reason, key=key, message=message, replay=replay,
                                          entry_id=entry_id)
        return Processed(Outcome.REJECT,
                         build_acks(message, Outcome.REJECT, problems, safe=False),
                         problems, message.control_id, kind_of(message),
                         dead_letter_id=dead_letter)

    async def _unparseable(self, raw: bytes, exc: HL7ParseError, replay: bool) -> Processed:
        ack = build_unparseable_ack(raw, exc)
        msh = read_msh_leniently(raw)
        control_id = msh.field(10) if msh is not None else ""
        _, dead_letter = await self._keep(raw, f"unparseable message: {exc}", key=None,
                                          message=None, replay=replay)
        return Processed(Outcome.ERROR, [ack] if ack else [], [ErrorDetail.from_parse_error(exc)],
                         control_id, dead_letter_id=dead_letter)

    async def dead_letter(self, raw: bytes, error: str, *, key: str | None = None,
                          message: Message | None = None, entry_id: str | None = None) -> str:
        """Keep a message that could not be stored; returns the dead letter id (``entry_id``
        when given: an entry of that id is replaced).

        The entry has the shape of every dead letter (id, event_id, topic,
        original_payload, error, created_at). ``original_payload`` is the JSON text of a
        ``platform.hl7.message_failed`` event whose payload holds the raw message, so the
        generic dead-letter retry (deliver the event again) reaches
        :meth:`retry_failed_event`; ``raw_message`` holds the message text for reading.
        """
        entry_id = entry_id or str(uuid.uuid4())
        created = _now_instant()
        text = decode_message(raw).text
        event_id = str(uuid.uuid5(message_namespace("dead-letter", key or "", entry_id),
                                  "failed"))
        event = {"id": event_id, "topic": FAILED_TOPIC, "timestamp": created,
                 "source_service": SOURCE_SERVICE,
                 "payload": {"message": text,
                             "message_base64": base64.b64encode(raw).decode("ascii"),
                             "idempotency_key": key, "error": error}}
        document = {
            "id": entry_id, "event_id": event_id, "topic": FAILED_TOPIC,
            "original_payload": orjson.dumps(event).decode(), "error": error,
            "created_at": created, "raw_message": text, "idempotency_key": key,
            "message_type": kind_of(message) if message is not None else None,
            "control_id": message.control_id if message is not None else None,
        }
        async with self.store.unit_of_work() as uow:
            uow.put_document(DEAD_LETTERS, entry_id, document)
            await uow.commit()
        return entry_id

    # -- retries -------------------------------------------------------------------------------
    async def retry_failed_event(self, event: JSON) -> Processed:
        """Reprocess the message of a ``platform.hl7.message_failed`` event (a dead letter
        being retried). Raises ``RuntimeError`` when it fails again, so the event bus keeps
        it as a dead letter."""
        payload = event.get("payload") or {}
        encoded = payload.get("message_base64")
        raw = base64.b64decode(encoded) if encoded else str(payload.get("message", "")).encode()
        processed = await self.process(raw, replay=True)
        if processed.outcome is not Outcome.ACCEPT and not processed.resources:
            reasons = "; ".join(e.message for e in processed.errors) or processed.ack_code
            raise RuntimeError(f"HL7 message {processed.control_id!r} failed again: {reasons}")
        return processed

    async def retry_dead_letter(self, entry_id: str) -> Processed:
        """Reprocess a dead-lettered message; the entry is removed once it is stored."""
        entry = await self.store.get_document(DEAD_LETTERS, entry_id)
        if entry is None or entry.get("topic") != FAILED_TOPIC:
            raise KeyError(entry_id)
        processed = await self.retry_failed_event(orjson.loads(entry["original_payload"]))
        async with self.store.unit_of_work() as uow:
            uow.delete_document(DEAD_LETTERS, entry_id)
            await uow.commit()
        return processed


# --- helpers ----------------------------------------------------------------------------------


def kind_of(message: Message) -> str:
    """MSH-9.1^MSH-9.2, as the records and logs name the message."""
    return "^".join(p for p in (message.message_type, message.trigger_event) if p)


def _now_instant() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fhir_message(exc: FhirError) -> str:
    return "; ".join(i.diagnostics for i in exc.issues if i.diagnostics) or str(exc)


def _lost_race(exc: FhirError) -> bool:
    # A version conflict (If-Match of a merged update), a duplicate create or a condition
    # that kept changing: a concurrent write won; mapping again and retrying is right.
    return any(i.code in {"conflict", "duplicate"} for i in exc.issues)


def _record_of(key: str, message: Message, processed: Processed, received: datetime,
               extra: Mapping[str, Any]) -> JSON:
    msh = message.msh
    return {
        "id": key, "sending_application": msh.raw_field(3), "sending_facility": msh.raw_field(4),
        "control_id": message.control_id, "message_type": kind_of(message),
        "outcome": processed.outcome.value, "acks": processed.acks,
        "errors": [{"code": e.code, "severity": e.severity.value, "message": e.message,
                    "segment": e.segment, "sequence": e.sequence, "field": e.field}
                   for e in processed.errors],
        "resources": processed.resources,
        "received_at": received.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "processed_at": _now_instant(), **extra,
    }


def _from_record(record: JSON) -> Processed:
    errors = [ErrorDetail(e["code"], e.get("message", ""), e.get("segment") or "",
                          e.get("sequence", 1), e.get("field"),
                          severity=Severity(e.get("severity", "E")))
              for e in record.get("errors", [])]
    return Processed(Outcome(record["outcome"]), list(record.get("acks", [])), errors,
                     record.get("control_id", ""), record.get("message_type", ""),
                     duplicate=True, resources=list(record.get("resources", [])),
                     dead_letter_id=record.get("dead_letter_id"))


def _result_events(message: Message, mapped: MappedMessage, ids: Sequence[str]
                   ) -> list[tuple[str, JSON]]:
    """One ``platform.lab.result_received`` event (id, payload) per DiagnosticReport of an
    ORU; the event id derives from the message and report, so a replay repeats it."""
    if message.message_type != "ORU":
        return []
    located = {e.full_url: ids[i] for i, e in enumerate(mapped.entries) if i < len(ids)}
    msh = message.msh
    namespace = message_namespace(msh.raw_field(3), msh.raw_field(4), message.control_id)
    return [(str(uuid.uuid5(namespace, f"result:{entry.key}")),
             _result_payload(message, mapped, entry.resource, entry.full_url, located))
            for entry in mapped.resources("DiagnosticReport")]


def _result_payload(message: Message, mapped: MappedMessage, report: JSON, full_url: str,
                    located: Mapping[str, str]) -> JSON:
    results = {r.get("reference", "") for r in report.get("result", [])}
    flags = {c.get("code") for e in mapped.entries if e.full_url in results
             for i in e.resource.get("interpretation", []) for c in i.get("coding", [])}
    coding = (report.get("code", {}).get("coding") or [{}])[0]
    by_type = {((i.get("type") or {}).get("coding") or [{}])[0].get("code"): i.get("value")
               for i in report.get("identifier", [])}
    return {
        "diagnostic_report_id": _id_of(located.get(full_url, "")),
        "patient_id": _id_of(located.get(report["subject"]["reference"], "")),
        "observation_ids": [_id_of(located[r]) for r in
                            (ref.get("reference", "") for ref in report.get("result", []))
                            if r in located],
        "service_request_ids": [_id_of(located.get(b["reference"], ""))
                                for b in report.get("basedOn", [])],
        "status": report.get("status"),
        "code": {k: coding[k] for k in ("system", "code", "display") if coding.get(k)},
        "abnormal": bool(flags - _NORMAL_FLAGS - {None}),
        "critical": bool(flags & _CRITICAL),
        "filler_order_number": by_type.get("FILL"),
        "placer_order_number": by_type.get("PLAC"),
        "message": {"control_id": message.control_id, "type": kind_of(message),
                    "sending_application": message.msh.component(3, 1),
                    "sending_facility": message.msh.component(4, 1)},
    }


def _id_of(location: str) -> str:
    return location.split("/", 1)[1] if "/" in location else location

