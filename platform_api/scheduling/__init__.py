"""The Scheduling area: schedulable resources, schedules and their slots, appointments
(booking without double booking), appointment requests, and video visits.

One module per part, each stating its FHIR mapping: :mod:`.resources` (Practitioner,
Location, Device), :mod:`.schedules` (Schedule) and :mod:`.slots` (Slot),
:mod:`.booking` (taking and freeing Slots), :mod:`.appointments` (Appointment),
:mod:`.contacts` (booking, public or for oneself; confirming whom a booking is for),
:mod:`.requests` (Appointment proposed/pending, AppointmentResponse),
:mod:`.telemedicine` (Encounter, class VR) over :mod:`.video` (the video platform's API).

:func:`start` subscribes the area's event handlers (confirmation e-mails, the video
platform's room events) and starts the slot keeper; the app stops it on shutdown.
"""

from __future__ import annotations

from fastapi import APIRouter

# contacts declares a route of the appointments facade (confirm-patient): imported before
# appointments.router is included below.
from platform_api.scheduling import (
    appointments,
    contacts,
    requests,
    resources,
    schedules,
    telemedicine,
)
from platform_api.scheduling.slots import SlotKeeper
from platform_api.services import Services

router = APIRouter()
router.include_router(resources.router)
router.include_router(schedules.router)
router.include_router(contacts.router)
router.include_router(appointments.router)
router.include_router(requests.router)
router.include_router(telemedicine.router)


def start(services: Services) -> SlotKeeper:
    """Subscribe the handlers and start the slot keeper (``await keeper.stop()``)."""
    appointments.subscribe_notices(services)
    telemedicine.subscribe_video_events(services)
    keeper = SlotKeeper(services, services.settings.scheduling_upkeep_interval_seconds)
    keeper.start()
    return keeper


__all__ = ["router", "start"]
