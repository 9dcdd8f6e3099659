"""FHIR R4 server: REST interactions, validation, versioning, search and the store."""
