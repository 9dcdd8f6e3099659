"""One module per FHIR interaction, as the FHIR spec names them: read, vread, create,
update, patch, delete (each with its conditional form), history, search_type,
search_system, search_compartment, everything (Patient/$everything), transaction, batch
and capabilities."""
