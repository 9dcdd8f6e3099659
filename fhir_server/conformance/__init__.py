"""Conformance: validation of resources against StructureDefinitions, as the HL7 reference
validator does it.

- :mod:`.definitions` the R4 StructureDefinitions the server ships;
- :mod:`.model` a StructureDefinition's snapshot compiled into a tree of element rules
  (once per profile);
- :mod:`.primitives` the primitive types' JSON types, formats and ranges;
- :mod:`.invariants` the ``constraint`` FHIRPath expressions, each compiled once;
- :mod:`.validator` the walk of a resource against its rules: cardinality, types and
  choice types, fixed and pattern values, ranges and lengths, slicing, bindings,
  extensions, contained resources, invariants;
- :mod:`.narrative`, :mod:`.bundles`, :mod:`.references`, :mod:`.attachments` the rules
  the specification states in prose (XHTML narrative, Bundle structure, references,
  attachment size and hash);
- :mod:`.snapshot` a differential turned into a snapshot;
- :mod:`.profiles` where profiles come from (shipped, stored on the server, installed
  from packages) and :mod:`.enforcement` what writes make of ``meta.profile``;
- :mod:`.packages` FHIR packages (``.tgz``) read for installation.
"""
