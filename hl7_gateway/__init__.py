"""HL7v2 gateway: MLLP listener and client, parsing, ACK/NAK, v2-to-FHIR mapping."""
