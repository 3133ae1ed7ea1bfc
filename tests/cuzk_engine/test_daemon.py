"""The HTTP/WebSocket API: validation (clear 4xx JSON, never a 500), auth, SRS endpoints,
metrics and the status stream. Runs the real prover stages; no proof is needed here except in
the stream test, which proves one tiny winning-post."""

import asyncio
import itertools
import os

import aiohttp
import pytest

from cuzk_engine.config import EngineConfig
from cuzk_engine.daemon import EngineDaemon
from cuzk_engine.daemon.client import EngineClient
from cuzk_engine.engine.snapshot import EngineSnapshot, StreamHeartbeat
from cuzk_engine.errors import (
    ConfigError,
    EngineAPIError,
    EngineUnreachable,
    SnapshotFormatError,
)


def config(tmp_path, **daemon):
    cfg = EngineConfig()
    cfg.devices = ["cpu"]
    cfg.synthesis_workers = 1
    cfg.memory.total_budget = 2 * 1024**3
    cfg.param_cache = tmp_path / "params"
    cfg.daemon.listen = daemon.pop("listen", "127.0.0.1:0")
    cfg.daemon.token = daemon.pop("token", None)
    cfg.daemon.stream_interval = 0.05
    return cfg


@pytest.fixture
async def daemon(tmp_path):
    d = EngineDaemon(config(tmp_path))
    await d.start()
    yield d
    await d.stop(fast=True)


async def raw(d, method, path, **kw):
    async with aiohttp.ClientSession() as s, s.request(method, d.url + path, **kw) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize("body,needle", [
    ({"kind": "nope", "profile": "tiny", "seed": 1}, "unknown kind"),
    ({"kind": "porep-c2", "profile": "giant", "seed": 1}, "unknown profile"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 2**64}, "seed must be"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": -3}, "seed must be"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1.5}, "integers"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": "7"}, "seed must be"),
    ({"kind": "porep-c2", "profile": "tiny"}, "missing field"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1, "x": 1}, "unknown field"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1, "priority": "asap"}, "unknown priority"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1, "request_id": "a b"}, "request_id"),
    ([1, 2], "JSON object"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1, "priority": []}, "unknown priority"),
    ({"kind": ["porep-c2"], "profile": "tiny", "seed": 1}, "unknown kind"),
    ({"kind": "porep-c2", "profile": {"a": 1}, "seed": 1}, "unknown profile"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": True}, "seed must be"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 10**4000}, "seed must be"),
    ({"kind": "porep-c2", "profile": "tiny", "seed": 1, "request_id": 7}, "request_id"),
])
async def test_bad_submissions_get_400_with_a_message(daemon, body, needle):
    status, data = await raw(daemon, "POST", "/v1/proofs", json=body)
    assert status == 400 and needle in data["error"]


async def test_malformed_json_and_unknown_routes_and_ids(daemon):
    status, data = await raw(daemon, "POST", "/v1/proofs", data=b"{not json",
                             headers={"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in data["error"]
    status, data = await raw(daemon, "GET", "/v1/proofs/does-not-exist")
    assert status == 404 and "does-not-exist" in data["error"]
    status, data = await raw(daemon, "DELETE", "/v1/proofs/does-not-exist")
    assert status == 404
    status, data = await raw(daemon, "GET", "/v1/proofs/x?wait=forever")
    assert status == 400 and "wait" in data["error"]
    status, data = await raw(daemon, "GET", "/v1/proofs/x?wait=1e9")
    assert status == 400
    status, data = await raw(daemon, "GET", "/nowhere")
    assert status == 404 and data["error"]
    status, data = await raw(daemon, "POST", "/v1/srs/nope.tiny/preload")
    assert status == 400 and "unknown circuit" in data["error"]
    status, data = await raw(daemon, "POST", "/v1/proofs", data=b"x" * 100_000)
    assert status == 413


@pytest.mark.parametrize("body,headers,status,needle", [
    (b"[" * 5000 + b"]" * 5000, {}, 400, "nested 5000 deep"),
    (b'{"kind": ' + b"[" * 100_000, {}, 413, "size"),
    (b'{"kind": "a\\"[[[[[[[[[[[[[["}', {}, 400, "missing field"),  # brackets in a string
    (b'{"kind": 1, "seed": 1e400}', {}, 400, "integers"),
    (b'{"kind": "porep-c2", "profile": "tiny", "seed": NaN}', {}, 400, "NaN"),
    (b'{"seed": ' + b"9" * 5000 + b"}", {}, 400, "not valid JSON"),
    (b'{"kind": "\xff"}', {}, 400, "UTF-8"),
    (b"{}", {"Content-Type": "application/json; charset=no-such-charset"}, 415, "charset"),
    (b"{}", {"Content-Type": "application/json; charset=latin-1"}, 415, "UTF-8"),
])
async def test_hostile_bodies_get_a_json_4xx(daemon, body, headers, status, needle):
    got, data = await raw(daemon, "POST", "/v1/proofs", data=body,
                          headers={"Content-Type": "application/json", **headers})
    assert (got, needle in data["error"]) == (status, True), data


async def test_undecodable_bearer_token_is_refused_not_a_crash(tmp_path):
    d = EngineDaemon(config(tmp_path, token="s3cret"))
    await d.start()
    try:
        reader, writer = await asyncio.open_connection(*d.url[7:].rsplit(":", 1))
        writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                     b"Connection: close\r\n\r\n")
        reply = await reader.read()
        writer.close()
        assert reply.startswith(b"HTTP/1.1 401") and b"bearer" in reply
    finally:
        await d.stop(fast=True)


async def test_srs_preload_and_evict(daemon):
    async with EngineClient(daemon.url) as c:
        first = await c.preload("winning-post.tiny")
        assert first["already_loaded"] is False
        assert (await c.preload("winning-post.tiny"))["already_loaded"] is True
        srs = (await c.status())["allocations"]["srs"]
        assert [(a["circuit_id"], a["state"], a["evictable"]) for a in srs] == [
            ("winning-post.tiny", "loaded", True)]
        used = (await c.status())["memory"]["used_bytes"]
        evicted = await c.evict("winning-post.tiny")
        assert evicted["was_loaded"] and evicted["freed_bytes"] == used
        assert (await c.status())["memory"]["used_bytes"] == 0
        assert (await c.evict("winning-post.tiny"))["was_loaded"] is False


async def test_info_and_metrics(daemon):
    async with EngineClient(daemon.url) as c:
        info = await c.info()
        assert info["devices"][0]["name"] == "cpu" and "porep-c2" in info["kinds"]
        split = (await c.status())["cpu"]  # how synthesis and the MSMs share the cores
        assert split["synthesis_processes"] == info["synthesis_workers"]
        assert split["msm_threads"] == info["msm_threads"] >= 1
        assert split["provers"] == info["gpu_workers_per_device"]
        assert split["cores"] == os.cpu_count()
        text = await c.metrics()
    for family in ("cuzk_proofs_completed_total", "cuzk_queue_depth", "cuzk_gpu_worker_busy",
                   "cuzk_uptime_seconds", "cuzk_running_jobs", "cuzk_memory_bytes"):
        assert family in text


async def test_token_required_off_loopback_and_enforced(tmp_path):
    with pytest.raises(ConfigError, match="daemon.token"):
        EngineDaemon(config(tmp_path, listen="0.0.0.0:0"))
    d = EngineDaemon(config(tmp_path, token="s3cret"))
    await d.start()
    try:
        status, data = await raw(d, "GET", "/status")
        assert status == 401 and "bearer" in data["error"]
        status, _ = await raw(d, "GET", "/status", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        async with EngineClient(d.url, token="s3cret") as c:
            assert "pipelines" in await c.status()
        async with EngineClient(d.url) as c:
            with pytest.raises(EngineAPIError) as e:
                await c.submit("porep-c2", "tiny", 1)
            assert e.value.status == 401
    finally:
        await d.stop(fast=True)


async def stream_frames(d, query, seconds):
    """Every text frame the status stream sends in `seconds`, with when it arrived."""
    loop = asyncio.get_running_loop()
    frames = []
    async with aiohttp.ClientSession() as s, s.ws_connect(d.url + "/v1/status/stream" + query
                                                          ) as ws:
        end = loop.time() + seconds
        while (left := end - loop.time()) > 0:
            try:
                message = await ws.receive(timeout=left)
            except TimeoutError:
                break
            assert message.type == aiohttp.WSMsgType.TEXT, message
            frames.append((loop.time(), message.json()))
    return frames


async def test_a_quiet_stream_sends_heartbeats_with_the_seq_only_when_asked(daemon):
    frames = await stream_frames(daemon, "?heartbeat=0.2", 1.1)
    (_, first), beats = frames[0], frames[1:]
    seq = daemon.engine.tracker.seq
    assert first["seq"] == seq and "pipelines" in first
    assert 3 <= len(beats) <= 6, beats
    assert all(beat == {"heartbeat": True, "seq": seq} for _, beat in beats)
    times = [at for at, _ in frames]
    assert all(later - earlier >= 0.15 for earlier, later in itertools.pairwise(times)), times
    # Without the ask, a quiet stream stays silent after its snapshot.
    assert [frame["seq"] for _, frame in await stream_frames(daemon, "", 0.6)] == [seq]
    # A heartbeat cannot pass for a snapshot with a reader that does not know it.
    with pytest.raises(SnapshotFormatError):
        EngineSnapshot.from_json(beats[0][1])


async def test_a_change_is_sent_as_a_snapshot_before_any_heartbeat_with_its_seq(daemon):
    async with EngineClient(daemon.url) as c:
        stream = c.stream_status(heartbeat=0.1)
        first = await anext(stream)
        assert isinstance(first, EngineSnapshot)
        await c.preload("winning-post.tiny")  # changes the engine's state, more than once
        final = daemon.engine.tracker.seq  # quiet from here on
        messages: list = []
        async with asyncio.timeout(30):
            async for message in stream:
                messages.append(message)
                if isinstance(message, StreamHeartbeat) and message.seq == final:
                    break
        await stream.aclose()
    assert final > first.seq and any(isinstance(m, EngineSnapshot) for m in messages)
    snapshot_seq = first.seq
    for message in messages:
        if isinstance(message, EngineSnapshot):
            assert message.seq > snapshot_seq
            snapshot_seq = message.seq
        else:  # a heartbeat only ever says the seq of the last snapshot sent
            assert message.seq == snapshot_seq
    assert snapshot_seq == daemon.engine.tracker.seq


async def test_stopping_the_engine_ends_its_status_streams_at_once(tmp_path):
    """A client living on heartbeats asks nothing else: the stop must close its stream, not
    leave it (and the stop) waiting for the websocket ping to time out."""
    d = EngineDaemon(config(tmp_path))
    await d.start()
    async with EngineClient(d.url) as c:
        stream = c.stream_status(heartbeat=0.1)
        assert isinstance(await anext(stream), EngineSnapshot)
        async with asyncio.timeout(10):
            await d.stop()
            with pytest.raises(EngineUnreachable, match="closed"):
                while True:
                    await anext(stream)


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", "1e9"])
async def test_a_bad_heartbeat_ask_gets_400(daemon, value):
    status, data = await raw(daemon, "GET", f"/v1/status/stream?heartbeat={value}")
    assert status == 400 and "heartbeat" in data["error"]


async def test_stream_sends_full_snapshot_first_then_changes(daemon):
    async with EngineClient(daemon.url) as c:
        stream = c.stream_snapshots()
        first = await anext(stream)
        assert first.pipelines == [] and first.gpu_workers
        job = await c.submit("winning-post", "tiny", 3, request_id="stream-1")
        states = set()
        seqs = [first.seq]
        async with asyncio.timeout(60):
            async for snap in stream:
                seqs.append(snap.seq)
                for p in snap.pipelines:
                    states.update(pt.state for pt in p.partitions)
                if any(p.status == "done" for p in snap.pipelines):
                    break
        await stream.aclose()
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert "done" in states
        result = await c.get(job["job_id"], wait=5)
        assert result["status"] == "done" and result["verified"] is True
        again = await c.submit("winning-post", "tiny", 3, request_id="stream-1")
        assert again["job_id"] == "stream-1" and again["created"] is False
        with pytest.raises(EngineAPIError) as e:
            await c.submit("winning-post", "tiny", 4, request_id="stream-1")
        assert e.value.status == 409
