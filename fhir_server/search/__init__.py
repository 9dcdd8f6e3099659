"""FHIR search: parameter registry, index extraction, plans and their execution."""
