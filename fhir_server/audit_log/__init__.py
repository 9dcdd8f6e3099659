"""The audit log: where AuditEvents live, apart from the clinical resources.

Every read, search and write of clinical data leaves an AuditEvent (the platform's
clinical audit trail, the auth trail, the MPI, AI and data-rights records, and
AuditEvents clients POST). Kept as resources they cost more than the work they record:
each was validated, indexed on every AuditEvent search parameter, versioned, announced
as an event and committed by the clinical writer, contending with it for its lock, its
commits and its WAL checkpoints. The log keeps them append-only instead:

- :mod:`.entry`: an AuditEvent as a compact entry (its JSON text, a few columns and the
  keys the audit searches compare), rendered back as the AuditEvent when read;
- :mod:`.port`: what a log adapter implements; :mod:`.sqlite` (a database file and a
  writer of its own) and :mod:`.mongo` (a collection per month), each store adapter
  bringing its own (``store.audit_log``);
- :mod:`.query`: a FHIR search of AuditEvent, with the caller's grants, as a log query;
- :mod:`.source`: the FHIR service's source of ``AuditEvent`` (read, search, create);
- :mod:`.retention`: entries older than the retention are exported (bulk export's
  NDJSON) and then purged.
"""
