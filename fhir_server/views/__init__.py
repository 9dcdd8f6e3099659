"""SQL on FHIR v2: ViewDefinitions flatten FHIR resources into rows.

- :mod:`.fhirpath`: a compiler from the FHIRPath a view may use to Python closures, with
  the static type and cardinality of each path (what a column holds, whether it repeats);
  its parser is :mod:`.syntax`, its functions :mod:`.functions`, and what the closures
  are made of (collections, operators) :mod:`.runtime`;
- :mod:`.definition`: a ViewDefinition checked (names, unions, paths, collections) and
  compiled once into a row function (:class:`~.definition.CompiledView`);
- :mod:`.engine`: the specification's processing algorithm over one resource;
- :mod:`.types`: the column types and how each output format writes them (the
  specification's type table);
- :mod:`.output`: the writers (json, ndjson, csv, parquet), row batch by row batch;
- :mod:`.source`: the resources a view runs over, searched as the caller (access policy,
  ``_since``, ``patient``, ``group``).

The operations are :mod:`fhir_server.interactions.view_run` (``$run``) and
:mod:`fhir_server.interactions.view_export` (``$viewdefinition-export``).
"""
