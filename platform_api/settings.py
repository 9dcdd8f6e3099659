"""Settings of the whole service, read from ``HEALTHPLATFORM_*`` environment variables."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEALTHPLATFORM_", extra="ignore")

    http_host: str = "127.0.0.1"
    http_port: int = 8000
    mllp_host: str = "127.0.0.1"
    mllp_port: int = 2575
    data_dir: Path = Path("./data")
    # Empty means sqlite:///<data_dir>/healthplatform.db
    store: str = ""
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

    @cached_property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir / 'healthplatform.db'}"

    @cached_property
    def public_base_url(self) -> str:
        return (self.base_url or f"http://{self.http_host}:{self.http_port}").rstrip("/")
