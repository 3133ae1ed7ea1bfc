"""Alerts: an Event always, and a JSON POST to the configured webhook when there is one."""

from dataclasses import dataclass, field

import aiohttp
from asgiref.sync import sync_to_async

from vastmgr.fleet.models import Event, Machine

WEBHOOK_TIMEOUT_S = 10


@dataclass(frozen=True)
class Alert:
    kind: str  # host_offline | job_failed | bad_benchmark | instance_down | unmanaged_instance
    message: str
    machine_id: int | None = None
    data: dict = field(default_factory=dict)


def _record(alert: Alert) -> Event:
    machine = Machine.objects.filter(pk=alert.machine_id).first() if alert.machine_id else None
    return Event.record("alert", alert.message, machine=machine, level=Event.Level.WARNING,
                        data={"alert": alert.kind, **alert.data})


async def send(alert: Alert, webhook_url: str) -> None:
    event = await sync_to_async(_record)(alert)
    if not webhook_url:
        return
    payload = {"kind": alert.kind, "message": alert.message, "machine_id": alert.machine_id,
               "time": event.time.isoformat(), **alert.data}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=WEBHOOK_TIMEOUT_S)) as http, http.post(webhook_url, json=payload) as response:
            if response.status >= 300:
                raise aiohttp.ClientResponseError(response.request_info, (),
                                                  status=response.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        # The webhook URL may carry a token: say which alert failed, not where it was sent.
        reason = getattr(exc, "status", None) or type(exc).__name__
        await sync_to_async(Event.record)(
            "alert", f"alert webhook failed ({reason}) for: {alert.message}",
            level=Event.Level.ERROR, data={"alert": alert.kind})
