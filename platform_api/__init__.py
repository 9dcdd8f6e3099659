"""The ASGI app that mounts everything, the /api facades, auth, events and the CLI."""
