"""FHIR search: the parameter registry generated from the R4 definitions (``registry``),
a FHIRPath compiler for index extraction on every write (``fhirpath``, ``extract``),
the backend-neutral search plan (``plan``), result shaping (``summary``), value forms
shared by both sides (``values``, ``dates``, ``units``) and custom SearchParameters with
the reindex that activates them (``custom``). Each store adapter compiles plans itself
(SQLite: ``fhir_server.store.sqlite_search``)."""
