"""``GET /healthz``: public liveness/readiness for load balancers (store reachable)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from platform_api.envelope import JSONResponse

router = APIRouter(tags=["operations"])


class Health(BaseModel):
    status: str  # ok | unavailable
    store: str  # ok | unavailable


@router.get("/healthz", summary="Liveness and store readiness (public)", response_model=Health,
            responses={503: {"model": Health, "description": "The store cannot be reached"}})
async def healthz(request: Request) -> Any:
    services = request.app.state.services
    try:
        await services.store.count_documents("healthz")
        store_ok = True
    except Exception:  # any store failure means "not ready"; the reason goes to the log
        store_ok = False
    status = 200 if store_ok else 503
    return JSONResponse({"status": "ok" if store_ok else "unavailable",
                         "store": "ok" if store_ok else "unavailable"}, status_code=status)
