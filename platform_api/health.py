"""``GET /healthz``: public liveness/readiness for load balancers (store reachable)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from platform_api.envelope import JSONResponse

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness and store readiness (public)")
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
