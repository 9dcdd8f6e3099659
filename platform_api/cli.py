"""The ``healthplatform`` command: serve, administer, reindex, purge and send HL7.

Commands fail with one line saying what to do (never a traceback for what the user got
wrong) and exit 1; each option names its value in the help (``HOST``, ``PORT``,
``FILE``), and the options a setting also controls say which ``HEALTHPLATFORM_*``
variable.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import getpass
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from typer import core as typer_core

from platform_api.envelope import ApiError
from platform_api.settings import Settings, SettingsProblem, load_settings


def _help_type_column(parameter: Any, ctx: Any) -> str | None:
    """The type column of the help: the option's metavar (HOST, PORT, SECONDS), nothing
    for flags and arguments (whose metavar is already their name), instead of typer's
    Python annotations (``<str>``, ``<list[Path]>``, ``<bool>`` for --help)."""
    if isinstance(parameter, typer_core.TyperArgument):
        return None
    return parameter.metavar or None


# typer >= 0.2x prints annotations in that column and has no setting for it.
for _parameter_class in (typer_core._TyperParameter, typer_core.TyperOption):
    _parameter_class.display_type_rich = _help_type_column  # type: ignore[method-assign,assignment]

app = typer.Typer(help="healthplatform: FHIR R4 server, HL7v2 gateway and /api facades",
                  no_args_is_help=True)
console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr saying what went wrong, and the exit code."""
    errors.print(f"[red]error:[/] {message}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def _settings(**overrides: Any) -> Settings:
    """The settings; a malformed one stops the command with one line (the variable, what
    was wrong, an example), not a traceback."""
    try:
        return load_settings(**overrides)
    except SettingsProblem as exc:
        fail(str(exc))


def tune_gc() -> None:
    """Collect garbage less often, and never walk what startup made.

    The FHIR models and search registry are hundreds of thousands of long-lived objects;
    every full collection walked them all, and Python's default gen-0 threshold (700
    allocations) triggers collections many times per request on the FHIR write path.
    ``gc.freeze`` moves what exists now out of the collector's sight; the higher
    threshold keeps cyclic collection for what requests really leave behind."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def tune_threads() -> None:
    """Hand the GIL over every millisecond instead of every 5.

    The store's writer and checkpoint threads release the GIL inside SQLite and need it
    back for a moment between statements; while the event loop is busy, each such return
    waited up to the switch interval, and every request in the batch waited with it.
    Measured with ``bench/fhir_crud.py``: write p99 about 2 ms lower (create 22.9 → 20.9
    ms, update 22.0 → 20.3, four runs each), throughput unchanged or better; HL7 ingest
    unchanged."""
    sys.setswitchinterval(0.001)


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, not an address of this machine,
    not allowed), or None. Bound as asyncio and uvicorn bind (``SO_REUSEADDR``), then
    released at once, so that the server fails before it says it is serving."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host} is not a known address ({exc.strerror})"
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "address already in use"
                return exc.strerror or str(exc)
    return None


def _check_ports(settings: Settings) -> None:
    listeners = [("HTTP", settings.http_host, settings.http_port, "HEALTHPLATFORM_HTTP_PORT")]
    if settings.mllp_enabled:
        listeners.append(("MLLP", settings.mllp_host, settings.mllp_port,
                          "HEALTHPLATFORM_MLLP_PORT, or HEALTHPLATFORM_MLLP_ENABLED=false"))
    for name, host, port, setting in listeners:
        problem = port_in_use(host, port)
        if problem is not None:
            fail(f"cannot listen for {name} on {host}:{port}: {problem} (another server "
                 f"running? see {setting})")


@app.command()
def serve(
    host: str | None = typer.Option(None, metavar="HOST",
                                    help="HTTP bind address (HEALTHPLATFORM_HTTP_HOST)"),
    port: int | None = typer.Option(None, metavar="PORT",
                                    help="HTTP port (HEALTHPLATFORM_HTTP_PORT)"),
) -> None:
    """Serve the platform: HTTP and the HL7v2 MLLP listener.

    HTTP serves the FHIR API at /fhir, the /api facades and the docs at /docs; the MLLP
    listener takes HL7v2 messages on HEALTHPLATFORM_MLLP_HOST:HEALTHPLATFORM_MLLP_PORT
    (127.0.0.1:2575 by default; HEALTHPLATFORM_MLLP_ENABLED=false turns it off). Both use
    the configured store."""
    import uvicorn

    from fhir_server.validation import preload as preload_validation
    from platform_api.app import create_app

    overrides = {k: v for k, v in {"http_host": host, "http_port": port}.items() if v}
    if "HEALTHPLATFORM_MLLP_ENABLED" not in os.environ:
        overrides["mllp_enabled"] = True  # serving means serving HL7 too, unless told not to
    settings = _settings(**overrides)
    _check_ports(settings)
    tls = bool(settings.tls_cert_file and settings.tls_key_file)
    console.print(f"[bold]healthplatform[/] on http{'s' if tls else ''}://{settings.http_host}:"
                  f"{settings.http_port} (store {settings.store_url})")
    if settings.mllp_enabled:
        console.print(f"HL7v2 MLLP{' over TLS' if tls else ''} on "
                      f"{settings.mllp_host}:{settings.mllp_port}")
    application = create_app(settings)
    preload_validation()  # before tune_gc freezes it: see fhir_server.validation.preload
    tune_gc()
    tune_threads()
    uvicorn.run(application, **server_options(settings))


def server_options(settings: Settings) -> dict[str, Any]:
    """How ``serve`` runs uvicorn. No ``Server`` banner (it tells an attacker what to
    look up); forwarded headers are read by the app, from the trusted proxies only
    (``platform_api.client_origin``), never by uvicorn, which would believe them from
    127.0.0.1 by default (any local process could then pose as any address)."""
    return {"host": settings.http_host, "port": settings.http_port, "loop": "uvloop",
            "http": "httptools", "access_log": False, "log_level": "warning",
            "log_config": None, "ssl_certfile": settings.tls_cert_file or None,
            "ssl_keyfile": settings.tls_key_file or None, "server_header": False,
            "proxy_headers": False}


PASSWORD_VARIABLE = "HEALTHPLATFORM_ADMIN_PASSWORD"


def _interactive() -> bool:
    return sys.stdin.isatty()


def _password_reader(from_stdin: bool, given: str | None) -> Callable[[], str]:
    """Where a new account's password comes from: stdin (``--password-stdin``, one line),
    the environment, or a prompt when there is a terminal; asked only when needed."""
    def read() -> str:
        if from_stdin:
            return sys.stdin.readline().rstrip("\r\n")
        if given is not None:
            return given
        if not _interactive():
            fail(f"no password for the new account: use --password-stdin or set "
                 f"{PASSWORD_VARIABLE} (there is no terminal to ask on)")
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Repeat password: "):
            fail("the passwords differ")
        return password
    return read


@app.command("create-admin")
def create_admin(
    email: str | None = typer.Option(None, metavar="EMAIL", help="E-mail of the "
                                     "administrator (asked when absent and on a terminal)"),
    first_name: str = typer.Option("Platform", metavar="NAME", help="First name"),
    last_name: str = typer.Option("Administrator", metavar="NAME", help="Last name"),
    password_stdin: bool = typer.Option(False, "--password-stdin",
                                        help="Read the password from the first line of "
                                             "stdin (for scripts)"),
    password: str | None = typer.Option(None, envvar=PASSWORD_VARIABLE, hidden=True),
) -> None:
    """Create a SUPER:ADMIN user, or promote an existing user to SUPER:ADMIN.

    A promoted user keeps their password (none is asked). A new account's password comes
    from --password-stdin, HEALTHPLATFORM_ADMIN_PASSWORD, or a prompt on a terminal."""
    from fhir_server.store import store_from_url
    from platform_api.auth.service import AuthService

    if email is None:
        if not _interactive():
            fail("give the administrator's e-mail with --email")
        email = typer.prompt("E-mail")
    read_password = _password_reader(password_stdin, password)

    async def run(address: str) -> tuple[str, bool]:
        settings = _settings()
        store = store_from_url(settings.store_url)
        await store.open()
        try:
            auth = AuthService(settings, store)
            await auth.start()
            existing = await auth.find_user_by_email(address)
            secret = "" if existing is not None else read_password()
            user, created = await auth.create_admin(address, secret, first_name, last_name)
            return str(user["id"]), created
        finally:
            await store.close()

    try:
        user_id, created = asyncio.run(run(email))
    except ApiError as refusal:
        fail(refusal.message)
    said = "created" if created else "promoted (the password is unchanged)"
    console.print(f"[green]SUPER:ADMIN[/] {email} ({user_id}) {said}", highlight=False,
                  soft_wrap=True)


@app.command("rotate-signing-key")
def rotate_signing_key() -> None:
    """Make a new Ed25519 token-signing key.

    Tokens signed with older keys stay valid until they expire, and running servers pick
    the new key up within half a minute."""
    from platform_api.auth.keys import KeyRing

    settings = _settings()
    key = KeyRing.load_or_create(settings.data_dir / "keys").rotate()
    console.print(f"[green]new signing key[/] {key.kid}")


@app.command()
def reindex() -> None:
    """Rebuild the FHIR search index of every resource with the current definitions
    (after the generated registry or the stored SearchParameter resources changed)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from fhir_server.search.custom import reindex as rebuild
    from fhir_server.store import store_from_url

    async def run() -> tuple[int, str]:
        settings = _settings()
        store = store_from_url(settings.store_url)
        await store.open()
        columns = ("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeRemainingColumn())
        try:
            with Progress(*columns, console=console) as progress:
                task = progress.add_task("Reindexing", total=None)
                done = 0

                def advance(finished: int, total: int) -> None:
                    nonlocal done
                    done = finished
                    progress.update(task, completed=finished, total=total)
                registry = await rebuild(store, advance)
            return done, registry.version
        finally:
            await store.close()

    count, version = asyncio.run(run())
    console.print(f"[green]Reindexed[/] {count} resources (search parameters {version})")


@app.command()
def purge() -> None:
    """Delete the bookkeeping the platform no longer needs, now.

    The server also does it every HEALTHPLATFORM_HOUSEKEEPING_INTERVAL_SECONDS: HL7v2
    idempotency records and dispatched events past their retention, expired tokens.
    Health data is kept."""
    from fhir_server.store import store_from_url
    from platform_api.housekeeping import Housekeeping

    async def run() -> dict[str, int]:
        settings = _settings()
        store = store_from_url(settings.store_url)
        await store.open()
        try:
            return await Housekeeping(store, settings).run_once()
        finally:
            await store.close()

    purged = asyncio.run(run())
    console.print("[green]Purged[/] " + ", ".join(f"{n} {kind.replace('_', ' ')}"
                                                  for kind, n in purged.items()))


@app.command("mongo-init")
def mongo_init(
    url: str | None = typer.Option(None, help="MongoDB URL (default: HEALTHPLATFORM_STORE)"),
) -> None:
    """Prepare a MongoDB database for the store: its collections and every index, and on
    a sharded cluster the shard keys (idempotent: safe to run again, e.g. after an
    upgrade adds an index). The server also makes collections and indexes at start."""
    from fhir_server.store.mongo import MongoStore
    from fhir_server.store.mongo_layout import COLLECTIONS

    target = url or _settings().store_url
    if not target.startswith(("mongodb://", "mongodb+srv://")):
        console.print(f"[red]not a MongoDB URL[/]: {target} (set HEALTHPLATFORM_STORE or "
                      "--url mongodb://...)")
        raise typer.Exit(2)

    async def run() -> tuple[str, str, list[str], dict[str, list[str]]]:
        store = MongoStore.from_url(target)
        await store.open()  # makes the collections and indexes
        try:
            sharded = await store.shard_collections()
            indexes = {name: sorted(await store.db[name].index_information())
                       for name in COLLECTIONS}
            return store.database_name, store.topology, sharded, indexes
        finally:
            await store.close()

    try:
        database, topology, sharded, indexes = asyncio.run(run())
    except Exception as exc:  # the server's refusal, said plainly
        console.print(f"[red]MongoDB refused[/]: {exc}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"[green]MongoDB ready[/]: database {database} on a {topology}")
    for name, names in indexes.items():
        console.print(f"  {name}: {len(names)} indexes"
                      + (" (sharded)" if name in sharded else ""))
    if topology == "standalone server":
        console.print("[yellow]standalone: transaction bundles are refused; run a replica "
                      "set (README, MongoDB)[/]")


@app.command()
def export(
    out: Path = typer.Option(..., "--out", metavar="DIR", file_okay=False,
                             help="Directory for the NDJSON files (made if missing)"),
    types: str | None = typer.Option(None, "--type", metavar="TYPES",
                                     help="Resource types, comma separated (default: all)"),
    since: str | None = typer.Option(None, metavar="INSTANT",
                                     help="Only resources changed after this instant"),
    type_filter: list[str] = typer.Option([], "--type-filter", metavar="TYPE?SEARCH",
                                          help="What of a type to export (repeatable)"),
    patient_level: bool = typer.Option(False, "--patient-level",
                                       help="The Patient compartments only (Patient/$export)"),
    group: str | None = typer.Option(None, metavar="ID",
                                     help="The members of this Group (Group/[id]/$export)"),
    page_size: int = typer.Option(1000, metavar="N", min=1, max=1000,
                                  help="Resources read per page"),
    resume: bool = typer.Option(False, "--resume",
                                help="Go on with an export to DIR that was cut off"),
) -> None:
    """Export resources as FHIR Bulk Data NDJSON files, as $export does, from the store
    itself (run on the server's machine: every resource, no access policy), with a
    manifest.json. Progress is kept in DIR/.progress.json: --resume goes on from it."""
    from rich.progress import Progress as Bar
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from fhir_server.bulk.local import export_to_directory
    from fhir_server.bulk.request import GROUP, PATIENT, SYSTEM
    from fhir_server.outcome import FhirError
    from fhir_server.store import StoreError

    if patient_level and group:
        fail("--patient-level and --group are two different exports: choose one")
    level = GROUP if group else PATIENT if patient_level else SYSTEM
    params = [*((("_type", types),) if types else ()), *((("_since", since),) if since else ()),
              *(("_typeFilter", f) for f in type_filter)]
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()) and not resume:
        fail(f"{out} is not empty: choose an empty directory, or --resume an export there")

    async def run() -> Any:
        from fhir_server.store import store_from_url

        store = store_from_url(_settings().store_url)
        await store.open()
        try:
            with Bar(SpinnerColumn(), TextColumn("{task.description}"),
                     TextColumn("{task.completed} resources"), TimeElapsedColumn(),
                     console=console) as bar:
                task = bar.add_task("Exporting", total=None)
                return await export_to_directory(
                    store, out, params, level=level, group_id=group, page_size=page_size,
                    resume=resume,
                    progress=lambda n: bar.update(task, completed=n))
        finally:
            await store.close()

    try:
        manifest = asyncio.run(run())
    except (FhirError, StoreError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted: the same command with --resume goes on from the last page "
             f"written to {out}", 130)
    for output in manifest["output"]:
        console.print(f"{output['type']:32} {output['count']:>10}")
    console.print(f"[green]Exported[/] {sum(o['count'] for o in manifest['output'])} "
                  f"resources to {out}")


package = typer.Typer(help="FHIR packages (implementation guides): install their profiles "
                       "and terminology", no_args_is_help=True)
app.add_typer(package, name="package")


@package.command("install")
def package_install(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                metavar="FILE", help="The package (.tgz), as an "
                                "implementation guide publishes it"),
) -> None:
    """Install a FHIR R4 package: its StructureDefinitions (snapshots generated where
    missing), CodeSystems, ValueSets, ConceptMaps and SearchParameters, in one step. A
    running server uses them within seconds: $validate, the profile check of writes and
    the terminology operations."""
    from fhir_server.conformance.packages import PackageError, install_package
    from fhir_server.outcome import FhirError
    from fhir_server.service import FhirService
    from fhir_server.store import store_from_url

    async def run() -> Any:
        settings = _settings()
        store = store_from_url(settings.store_url)
        await store.open()
        try:
            return await install_package(FhirService(store), file)
        finally:
            await store.close()

    try:
        installed = asyncio.run(run())
    except (PackageError, FhirError) as exc:
        fail(str(exc))
    for kind, count in sorted(installed.counts.items()):
        console.print(f"{kind:24} {count:>6}")
    if installed.dependencies:
        console.print("[yellow]depends on[/] " + ", ".join(installed.dependencies)
                      + " (not fetched: install them too if its profiles build on them)",
                      soft_wrap=True)
    console.print(f"[green]Installed[/] {installed.name}#{installed.version}: "
                  f"{sum(installed.counts.values())} resources"
                  + (f" ({installed.skipped} examples and others left out)"
                     if installed.skipped else ""), soft_wrap=True)


hl7 = typer.Typer(help="HL7v2: send messages over MLLP", no_args_is_help=True)
app.add_typer(hl7, name="hl7")


@hl7.command("send")
def hl7_send(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                       metavar="FILE",
                                       help="Files of v2 messages (one, several, or a "
                                            "FHS/BHS batch)"),
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="MLLP host"),
    port: int = typer.Option(2575, metavar="PORT", envvar="HEALTHPLATFORM_MLLP_PORT",
                             help="MLLP port (the port `serve` listens on)"),
    tls: bool = typer.Option(False, "--tls", help="Use TLS"),
    ca_file: str | None = typer.Option(None, metavar="FILE",
                                       help="CA bundle to verify the server (TLS)"),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Do not verify the server certificate (TLS)"),
    timeout: float = typer.Option(30.0, metavar="SECONDS",
                                  help="Seconds to wait for each acknowledgement"),
) -> None:
    """Send HL7 v2 messages over MLLP and print each acknowledgement (exit 1 on any NAK)."""
    from hl7_gateway.send import client_tls_context, send_files

    context = client_tls_context(ca_file, verify=not insecure) if tls else None
    try:
        results = asyncio.run(send_files(files, host, port, tls=context,
                                         reply_timeout=timeout))
    except (OSError, TimeoutError) as exc:
        console.print(f"[red]cannot reach {host}:{port}[/]: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    for sent in results:
        codes = "/".join(sent.codes) or ("-" if sent.error is None else "ERROR")
        colour = "green" if sent.accepted else "red"
        console.print(f"[{colour}]{codes:6}[/] {sent.source} {sent.control_id}",
                      soft_wrap=True)
        for text in ([sent.error] if sent.error else []) + sent.problems():
            console.print(f"       {text}", soft_wrap=True)
    if not all(sent.accepted for sent in results):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
