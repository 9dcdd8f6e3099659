"""One module per FHIR interaction (read, vread, create, update, patch, delete, history,
search, capabilities), as the FHIR spec names them."""
