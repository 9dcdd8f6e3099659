"""Terminology: the code systems, value sets and concept maps the server knows, and what
the terminology operations and binding checks ask of them.

- :mod:`.codesystems` a CodeSystem indexed: lookup, hierarchy (subsumption), property
  filters, designations;
- :mod:`.grammars` the code systems defined by a grammar rather than a list (MIME types,
  language tags, UCUM units): their codes are checked by syntax;
- :mod:`.valuesets` expansion (compose include/exclude, filters, imports) and
  membership;
- :mod:`.conceptmaps` translation;
- :mod:`.content` where they come from: the R4 content the server ships
  (``fhir_server/data/r4-terminology.json.gz``) and the CodeSystem, ValueSet and
  ConceptMap resources stored on the server.
"""
