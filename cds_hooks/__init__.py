"""CDS Hooks: discovery, invocation, prefetch, feedback and the CDS services."""
