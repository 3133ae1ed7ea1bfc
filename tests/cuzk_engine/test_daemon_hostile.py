"""Property-based: no request of any shape gets a 5xx from the engine API, and every error is a
JSON body ``{"error": ...}``. The routes are read from the app's router, so a new route is
covered without touching this module. One real daemon (real stages, tiny parameters) serves
every example from a thread of its own."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuzk_engine.daemon import EngineDaemon
from tests.cuzk_engine.test_daemon import config

EXAMPLES = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


class DaemonThread:
    """A daemon on its own event loop, so synchronous hypothesis tests can talk to it."""

    def __init__(self, daemon: EngineDaemon):
        self.daemon = daemon
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.call(self.daemon.start())
        host, port = self.daemon.url[7:].rsplit(":", 1)
        self.address = (host, int(port))
        return self

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def __exit__(self, *exc):
        self.call(self.daemon.stop(fast=True))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def request(self, method: str, target: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection(*self.address, timeout=30)
        try:
            conn.request(method, target, body=body, headers=headers or {})
            reply = conn.getresponse()
            return reply.status, reply.read(), reply.getheader("Content-Type", "")
        finally:
            conn.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_cache):
    cfg = config(tmp_path_factory.mktemp("engine"))
    cfg.param_cache = tiny_cache  # a valid preload then loads instead of generating
    with DaemonThread(EngineDaemon(cfg)) as served:
        yield served


def routes(served: DaemonThread) -> list[tuple[str, str]]:
    app = served.daemon._runner.app
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes()})


def check_reply(status: int, body: bytes, content_type: str, what: str) -> None:
    assert status < 500, f"{what} -> {status}: {body[:300]!r}"
    if status >= 400 and not what.startswith("HEAD "):  # a reply to HEAD has no body
        assert content_type.startswith("application/json"), f"{what} -> {status} not JSON"
        assert isinstance(json.loads(body)["error"], str)


JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
                | st.text(max_size=30) | st.sampled_from(["porep-c2", "winning-post", "tiny",
                                                          "normal", "high", "x" * 300]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                           max_leaves=8)
FIELDS = st.sampled_from(["request_id", "kind", "profile", "seed", "priority", "other", ""])
SUBMISSIONS = (st.dictionaries(FIELDS, JSON_VALUES, max_size=6)
               # each field valid half the time, so later checks are reached too
               | st.fixed_dictionaries({"kind": st.just("winning-post") | JSON_VALUES,
                                        "profile": st.just("tiny") | JSON_VALUES,
                                        "seed": st.integers(0, 2**64 - 1) | JSON_VALUES},
                                       optional={"priority": st.just("low") | JSON_VALUES,
                                                 "request_id": st.uuids().map(str) | JSON_VALUES})
               | JSON_VALUES)
RAW_BODIES = (st.binary(max_size=200)
              | st.integers(1, 6000).map(lambda n: b"[" * n + b"]" * n)
              | st.integers(1, 6000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n)
              | SUBMISSIONS.map(lambda v: json.dumps(v).encode()))
CONTENT_TYPES = st.sampled_from([
    None, "application/json", "application/json; charset=utf-8", "application/json; charset=UTF8",
    "application/json; charset=no-such-charset", "application/json; charset=utf-16",
    "text/plain", "multipart/form-data; boundary=x", "application/json; charset=",
    "application/x-www-form-urlencoded"])
SEGMENTS = (st.text(min_size=1, max_size=60)
            | st.sampled_from(["winning-post.tiny", "porep-c2.tiny", "..", "%00", "0" * 200]))
QUERIES = st.dictionaries(st.sampled_from(["wait", "timeout", "x", ""]),
                          st.text(max_size=12) | st.sampled_from(
                              ["0", "0.001", "-1", "nan", "inf", "1e309", "301", "9" * 400]),
                          max_size=2)


def target(canonical: str, segment: str, query: dict) -> str:
    path = canonical
    while "{" in path:  # every {placeholder} takes the generated segment
        start, end = path.index("{"), path.index("}")
        path = path[:start] + urllib.parse.quote(segment, safe="") + path[end + 1:]
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def test_the_router_lists_every_route_we_expect(engine):
    found = routes(engine)
    assert ("POST", "/v1/proofs") in found and ("DELETE", "/v1/srs/{circuit_id}") in found
    assert len(found) >= 10


@EXAMPLES
@given(data=st.data(), segment=SEGMENTS, query=QUERIES, body=RAW_BODIES,
       content_type=CONTENT_TYPES)
def test_any_request_to_any_route_gets_no_5xx(engine, data, segment, query, body, content_type):
    method, canonical = data.draw(st.sampled_from(routes(engine)), label="route")
    method = data.draw(st.sampled_from([method, "PUT", "PATCH"]), label="method")
    # The status stream only upgrades: a plain request to it must still be a clean 4xx.
    path = target(canonical, segment, query)
    headers = {"Content-Type": content_type} if content_type else {}
    status, reply, ctype = engine.request(method, path, body=body, headers=headers)
    check_reply(status, reply, ctype, f"{method} {path}")


@EXAMPLES
@given(body=SUBMISSIONS)
def test_any_json_submission_is_accepted_or_refused_with_a_message(engine, body):
    status, reply, ctype = engine.request("POST", "/v1/proofs", json.dumps(body).encode(),
                                          {"Content-Type": "application/json"})
    check_reply(status, reply, ctype, f"POST /v1/proofs {body!r}")
    if status < 300:  # a valid proof request: take it back, the test proves nothing
        job_id = json.loads(reply)["job_id"]
        assert engine.request("DELETE", f"/v1/proofs/{job_id}")[0] == 200
    else:
        assert status in (400, 409)
