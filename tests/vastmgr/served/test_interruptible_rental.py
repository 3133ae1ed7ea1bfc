"""An interruptible rental, end to end (issue 36's "Done when"): the served stack (`manage.py
up`) with the strict fake Vast as the provider and a real OpenSSH server on loopback as the
rented instance, driven over HTTP as an operator's browser does.

The operator searches bid offers, rents one from the rent dialog at a bid, provisions it, and
sends a batch of proofs that the dispatcher spreads over it and the local engine. While some
are in flight on the rented machine, a forged "outbid" webhook is refused and changes nothing;
then the fake's market outbids the instance (Vast stops it: its engine and sshd die), and Vast's
signed webhook tells the product. The oracle: the fake's own record of the instance (its bid,
its outbid status), the database's jobs and Events, and the local engine's own record of what
it proved (`GET /v1/proofs/<id>`): every job is proved exactly once, those in flight on the
outbid machine are re-queued once each and proved by the local engine, and the pages say
"outbid" (never "offline") and which signal told them."""

from __future__ import annotations

import json
import re
import sqlite3
import time
import urllib.error
import urllib.request
import uuid

import asyncssh
import pytest

from tests.conftest import eventually
from tests.vastmgr.live_engine import param_cache  # noqa: F401 - the stack's engine's cache
from tests.vastmgr.remote.real_sshd import host_python, real_sshd, unavailable_reason
from tests.vastmgr.remote.served import (
    FakeOnItsLoop,
    Operator,
    events_of,
    last_event,
    served_stack,
    wait_state,
)
from tests.vastmgr.remote.test_vast_webhooks import signed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

API_KEY = "vast-interruptible-key-0123456789"
WEBHOOK_SECRET = "whsec-served-interruptible-0123456789"
MACHINE_ID = 40_001  # the one machine of the fake's market
JOBS = 6  # porep-c2 proofs in the batch: enough that both engines hold some at once


@pytest.fixture(scope="module")
def sshd():
    """The rented instance's SSH server: it accepts the key each rent attaches to it."""
    if reason := unavailable_reason():
        pytest.skip(reason)
    nobody = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    with real_sshd(nobody) as server:
        yield server


@pytest.fixture(scope="module")
def vast(sshd):
    def authorize(public_key: str) -> None:
        with (sshd.home / ".ssh" / "authorized_keys").open("a") as keys:
            keys.write(public_key.strip() + "\n")

    fake = FakeOnItsLoop(API_KEY, ssh_endpoint=("127.0.0.1", sshd.port), on_ssh_key=authorize)
    fake(fake.fake.add_offer, gpu_name="RTX 4090", num_gpus=1, machine_id=MACHINE_ID)
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, param_cache, vast):  # noqa: F811 - the fixture imported above
    # As test_served_remote: the host has no network, one tiny benchmark proof gates it.
    yield from served_stack(tmp_path_factory.mktemp("interruptible"), param_cache, {
        "VAST_URL": vast.url, "VASTMGR_AUTOMATION_INTERVAL_S": "2",
        "VASTMGR_VAST_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "VASTMGR_PROVISION_PIP_ARGS": "--no-index", "VASTMGR_REMOTE_PYTHON": host_python(),
        "VASTMGR_MIN_BENCH_RATE": "0.01", "VASTMGR_BENCH_KIND": "winning-post",
        "VASTMGR_BENCH_PROFILE": "tiny", "VASTMGR_BENCH_PROOFS": "1"})


def deliver(stack, payload: dict, **signing) -> int:
    """POST to the product's webhook route as Vast does (no session: the signature is all)."""
    body = json.dumps(payload).encode()
    request = urllib.request.Request(
        stack.url + "/remote/vast/webhook/", data=body, method="POST",
        headers={"Content-Type": "application/json",
                 **signed(body, secret=signing.pop("secret", WEBHOOK_SECRET), **signing)})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def outbid_notice(instance_id: int) -> dict:
    return {"event_id": f"evt-{time.time_ns()}", "user_id": 1, "notif_type": "outbid",
            "subject": f"Instance {instance_id} was outbid", "instance_id": instance_id,
            "message": "Your interruptible instance was outbid", "timestamp": int(time.time())}


def job_ids(rows) -> set[str]:
    """Job ids as Events and engines write them (SQLite keeps a UUID as 32 hex digits)."""
    return {str(uuid.UUID(row[0])) for row in rows}


def jobs_on(stack, machine: int) -> set[str]:
    return job_ids(stack.query("SELECT id FROM proofs_proofjob WHERE machine_id = ? AND "
                               "status IN ('dispatched', 'running')", machine))


def fleet_badge(operator: Operator, machine: int) -> str:
    """The connection badge of the machine's row on the fleet page, as a person sees it."""
    page = operator.get("/").body
    row = page[page.index(f'id="host-{machine}-row"'):]
    return re.search(r'data-conn="(\w+)"', row[:row.index("</tr>")]).group(1)


def engine_record(stack, job: str, engine_job_id: str) -> dict:
    """The local engine's own record of a job (its result retention is an hour)."""
    url = f"http://127.0.0.1:{stack.engine_port}/v1/proofs/{engine_job_id}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        record = json.load(answer)
    assert record["request_id"] == job, record
    return record


def test_an_outbid_rental_requeues_its_proofs_elsewhere_and_a_forged_webhook_is_refused(
        stack, operator, vast, sshd):
    assert operator.post("/remote/offers/api-key/", {"api_key": API_KEY},
                         form="/remote/offers/").status == 200

    # The bid offers, each with the machine's minimum bid as the fake's market has it.
    [offer] = vast(lambda: list(vast.fake.offers.values()))
    page = operator.get("/remote/offers/?offer_type=bid").body
    row = page[page.index(f'id="offer-{offer["id"]}"'):]
    assert f'<td class="num min-bid">{offer["min_bid"]:.4f}</td>' in row[:row.index("</tr>")]
    assert 'name="offer_type" value="bid" checked' in page

    # Rented from the dialog at 1.2× the minimum bid; its page says so.
    bid = round(offer["min_bid"] * 1.2, 4)
    answer = operator.post("/remote/offers/rent/", {
        "offer_ids": offer["id"], "max_price_per_proof": "10", "disk_gb": "64",
        "offer_type": "bid", "bid_price": f"{bid:.4f}"}, form="/remote/offers/?offer_type=bid")
    assert answer.status == 200 and "/remote/machines/" in answer.url, answer.body[-2000:]
    assert f"interruptibly at a bid of ${bid:.4f}/h" in answer.body
    assert f'data-bid="{bid:.4f}">${bid:.4f}/h</span> for its GPUs' in answer.body
    machine = int(answer.url.rstrip("/").rsplit("/", 1)[1])
    instance_id, name = stack.query("SELECT vast_instance_id, name FROM fleet_machine "
                                    "WHERE id = ?", machine)[0]
    instance = vast(lambda: dict(vast.fake.instances[instance_id]))
    assert (instance["is_bid"], instance["dph_base"]) == (True, bid)

    # Vast boots it; the automation lists its address. Vast's login user is root; this
    # instance's sshd (loopback, a throwaway user) is the test's, so its user is set here.
    vast(vast.fake.advance, 120)
    eventually(lambda: stack.query("SELECT host FROM fleet_machine WHERE id = ?",
                                   machine)[0][0], 60, "the automation never saw it running")
    db = sqlite3.connect(stack.data / "vastmgr.sqlite3", timeout=30)
    with db:
        db.execute("UPDATE fleet_machine SET ssh_user = ? WHERE id = ?", (sshd.user, machine))
    db.close()
    mark = last_event(stack)
    operator.post(f"/remote/machines/{machine}/provision/", form=f"/remote/machines/{machine}/")
    wait_state(stack, machine, name, "running", after=mark)

    # A batch the dispatcher spreads over both engines.
    known = job_ids(stack.query("SELECT id FROM proofs_proofjob"))
    answer = operator.post("/proofs/new/", {"machine": "", "kind": "porep-c2", "profile": "tiny",
                                            "seed": 500, "count": JOBS, "priority": ""})
    assert answer.status == 200, answer.body[-2000:]
    batch = job_ids(stack.query("SELECT id FROM proofs_proofjob")) - known
    assert len(batch) == JOBS
    in_batch, stored = f"({','.join('?' * JOBS)})", [uuid.UUID(job).hex for job in batch]
    eventually(lambda: jobs_on(stack, machine), 120, "no proof reached the rented machine")

    # A forged outbid (the wrong secret) is refused and changes nothing.
    mark = last_event(stack)
    assert deliver(stack, outbid_notice(instance_id), secret="not-the-secret") == 401
    assert stack.query("SELECT vast_status FROM remote_remotemachine WHERE machine_id = ?",
                       machine) == [("running",)]
    assert stack.query("SELECT COUNT(*) FROM remote_vastnotification") == [(0,)]
    assert not [m for _, _, m in events_of(stack, machine, mark) if "re-queued" in m]

    # The fake's market outbids it and Vast says so at once; Vast stops the instance (its
    # sshd and every process there die).
    in_flight = jobs_on(stack, machine)
    mark = last_event(stack)
    vast(vast.fake.outbid, instance_id, competitor_bid=round(bid * 1.5, 4))
    assert deliver(stack, outbid_notice(instance_id)) == 204
    sshd.stop()
    sshd.kill_processes()
    assert stack.query("SELECT vast_status, vast_status_signal FROM remote_remotemachine "
                       "WHERE machine_id = ?", machine) == [("outbid", "Vast webhook")]
    assert stack.query("SELECT outcome FROM remote_vastnotification") == \
        [(f"{name}: Vast says outbid",)]
    # Re-queued at once (by the webhook; the automation's listing, the fallback, may have
    # been a moment quicker).
    assert [m for _, _, m in events_of(stack, machine, mark) if "re-queued" in m]

    # Until every proof is done the pages say "outbid", never "offline".
    badges: set[str] = set()

    def all_done() -> bool:
        badges.add(fleet_badge(operator, machine))
        return stack.query("SELECT COUNT(*) FROM proofs_proofjob WHERE status = 'done' AND "
                           f"id IN {in_batch}", *stored) == [(JOBS,)]
    eventually(all_done, 300, "the batch was not proved", every=0.5)
    assert "offline" not in badges and fleet_badge(operator, machine) == "outbid", badges
    page = operator.get(f"/remote/machines/{machine}/").body
    assert 'data-signal="Vast webhook">outbid</span>' in page

    # The oracle: each job once, the re-queued ones proved by the local engine.
    rows = {str(uuid.UUID(r[0])): r[1:] for r in stack.query(
        "SELECT p.id, p.status, p.verified, m.name, p.engine_job_id, hex(p.proof) FROM "
        "proofs_proofjob p JOIN fleet_machine m ON m.id = p.machine_id WHERE p.id IN "
        f"{in_batch}", *stored)}
    assert set(rows) == batch and all(r[:2] == ("done", 1) for r in rows.values()), rows
    requeue_events = [m for _, _, m in events_of(stack, machine) if "re-queued" in m]
    assert all("outbid on Vast (told by " in m for m in requeue_events), requeue_events
    moved = {job for job in batch if any(f"proof {job} re-queued" in m for m in requeue_events)}
    assert moved and len(requeue_events) == len(moved)  # once each
    done_there = {job for job, row in rows.items() if row[2] == name}
    assert not moved & done_there and in_flight <= moved | done_there, (moved, in_flight)
    for job in moved:
        on, engine_job_id, proof = rows[job][2:]
        assert on == "local", (job, on)
        record = engine_record(stack, job, engine_job_id)
        assert record["status"] == "done" and record["proof"].upper() == proof
