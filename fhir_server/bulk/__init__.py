"""FHIR Bulk Data export: the kick-off request, the exporter, the jobs (see each module)."""
