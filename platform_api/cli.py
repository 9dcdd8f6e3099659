"""The ``healthplatform`` command: serve, administer, and (later) reindex and send HL7."""

from __future__ import annotations

import asyncio
import getpass

import typer
from rich.console import Console

from platform_api.settings import Settings

app = typer.Typer(help="healthplatform: FHIR R4 server, HL7v2 gateway and /api facades",
                  no_args_is_help=True)
console = Console()


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Bind address (HEALTHPLATFORM_HTTP_HOST)"),
    port: int | None = typer.Option(None, help="HTTP port (HEALTHPLATFORM_HTTP_PORT)"),
) -> None:
    """Serve the whole app (HTTP) on the configured store."""
    import uvicorn

    from platform_api.app import create_app

    overrides = {k: v for k, v in {"http_host": host, "http_port": port}.items() if v}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    console.print(f"[bold]healthplatform[/] on http://{settings.http_host}:{settings.http_port}"
                  f" (store {settings.store_url})")
    uvicorn.run(create_app(settings), host=settings.http_host, port=settings.http_port,
                loop="uvloop", http="httptools", access_log=False, log_level="warning")


@app.command("create-admin")
def create_admin(
    email: str = typer.Option(..., prompt=True, help="E-mail of the super admin"),
    first_name: str = typer.Option("Platform", help="First name"),
    last_name: str = typer.Option("Administrator", help="Last name"),
    password: str | None = typer.Option(None, envvar="HEALTHPLATFORM_ADMIN_PASSWORD",
                                        help="Password (prompted when absent)"),
) -> None:
    """Create a SUPER:ADMIN user, or promote an existing user to SUPER:ADMIN."""
    from fhir_server.store import store_from_url
    from platform_api.auth.service import AuthService

    if password is None:
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Repeat password: "):
            console.print("[red]Passwords differ[/]")
            raise typer.Exit(1)

    async def run() -> str:
        settings = Settings()
        store = store_from_url(settings.store_url)
        await store.open()
        try:
            auth = AuthService(settings, store)
            await auth.start()
            user, _created = await auth.create_admin(email, password, first_name, last_name)
            return str(user["id"])
        finally:
            await store.close()

    user_id = asyncio.run(run())
    console.print(f"[green]SUPER:ADMIN[/] {email} ({user_id})")


if __name__ == "__main__":
    app()
