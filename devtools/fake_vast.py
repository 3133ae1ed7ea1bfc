"""A strict fake of the Vast.ai API on 127.0.0.1: the tests' Vast, and the market of the
autopilot's simulated day (`devtools/autopilot_day.py`, `manage.py bench_autopilot`), which drives the
product's own Vast client against it.

Written from the official client (PyPI `vastai` 1.9.1: api/client.py, api/offers.py,
api/instances.py, api/keys.py, api/query.py, data/offer.py, data/instance.py,
cli/commands/offers.py) and Vast's API docs, not from this project's client. Where the
contract is clear it is stricter than the real service, so that a client mistake fails here:

- routes exist only with their trailing slash and method (404 / 405 otherwise);
- every call needs `Authorization: Bearer <key>`; a wrong key is 401 `auth_error`;
- a search field outside the official `offers_fields`, an operator outside
  eq neq gt gte lt lte in notin, an unknown `type` or `order` column is 400;
- a create body without `client_id: "me"`, `image` or `disk` is 400 `invalid_args`;
- offers carry the official field names and units (gpu_ram and cpu_ram in MB, dph_total in
  $/h including `allocated_storage` GB of disk at `storage_cost` $/GB/month), `order` and
  `limit` are honoured, and a market of several hundred offers is one call away;
- instances go null → loading → running on the fake's own clock (`advance`), `ports` only while
  running, each machine on its own schedule where `boots` gives one (None: it never gets past
  loading); they can exit, go offline or disappear; with `relist`, a destroyed instance's
  machine is offered again, as Vast lists a machine again once its renter leaves;
- faults: 429 with or without Retry-After (seconds or HTTP date; JSON or plain-text body),
  5xx, broken bodies, and a lost response after a create that did happen;
- billing as Vast documents it, by the second of wall time: the disk (storage_cost $/GB/month
  × disk GB) from creation to destruction, the GPUs (dph_base) only while the instance holds
  them (running, frozen, rebooting, unknown, offline), a new price from the moment it changes
  (`reprice`, as at a contract's extension), bandwidth where a test reports some
  (`charge_bandwidth`); `PUT /api/v0/instances/<id>/` with `{"state": "stopped"|"running"}`
  stops and starts an instance, and `GET /api/v0/charges/` answers as the official OpenAPI
  (vast-ai/docs api-reference/openapi.yaml, operation showCharges) describes: `select_filters`
  with `day.gte` and `day.lte` required (400 otherwise), `type.in`, `format` table|tree,
  `latest_first`, `limit` 1..500, `after_token` (400 `invalid_token` when undecodable), and
  per-contract rows with `gpu` / `disk` / `bwd` / `bwu` items, amounts rounded to 3 decimals.
  `billing_records()` gives the fake's own record of every contract, for tests to check
  the product's figures against.
- interruptible rentals (vastai `create instance --bid_price`, `change bid`, `search offers -t
  bid`; Vast's instance-types guide): a bid search prices each offer at its machine's current
  minimum bid; a create with `price` makes an interruptible instance, created stopped when the
  bid is below that minimum; a seeded market outbids running interruptible instances
  (`preemption_rate` per hour, one reproducible draw sequence per instance), which stops them
  until their bid is raised above the competitor's; `outbid()` does it on demand;
- account SSH keys (`/api/v0/ssh/`): create, list, delete.
"""

import base64
import itertools
import json
import math
import random
import time

from aiohttp import web

# The parsed JSON body, read once by the middleware for the request log.
BODY = web.RequestKey("body", object)

# api/query.py `offers_fields`: what the search accepts as filters.
OFFER_FIELDS = {
    "bw_nvlink", "compute_cap", "cpu_arch", "cpu_cores", "cpu_cores_effective", "cpu_ghz",
    "cpu_ram", "cuda_max_good", "datacenter", "direct_port_count", "driver_version", "disk_bw",
    "disk_space", "dlperf", "dlperf_per_dphtotal", "dph_total", "duration", "external",
    "flops_per_dphtotal", "gpu_arch", "gpu_display_active", "gpu_frac", "gpu_mem_bw", "gpu_name",
    "gpu_ram", "gpu_total_ram", "gpu_max_power", "gpu_max_temp", "has_avx", "host_id", "id",
    "inet_down", "inet_down_cost", "inet_up", "inet_up_cost", "machine_id", "min_bid",
    "mobo_name", "num_gpus", "pci_gen", "pcie_bw", "reliability", "rentable", "rented",
    "storage_cost", "static_ip", "total_flops", "ubuntu_version", "verification", "verified",
    "vms_enabled", "geolocation", "cluster_id",
}
SEARCH_KEYS = {"order", "type", "limit", "allocated_storage", "disable_bundling"}
OPERATORS = {
    "eq": lambda a, b: a == b, "neq": lambda a, b: a != b,
    "gt": lambda a, b: a > b, "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b,
    "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}
# v1 instance list: only stored columns can be filtered.
INSTANCE_FILTER_COLUMNS = {"actual_status", "gpu_name", "verification", "id", "label"}
HOURS_PER_MONTH = 30 * 24
DEFAULT_STORAGE_GB = 5.0  # the official client's default `allocated_storage`

# name, gpu_ram MB, $/h per GPU, arch, TFLOPs per GPU
GPUS = [
    ("RTX 3090", 24576, 0.16, "nvidia", 35.6), ("RTX 4090", 24564, 0.32, "nvidia", 82.6),
    ("RTX A6000", 49140, 0.45, "nvidia", 38.7), ("A100 SXM4", 81920, 1.10, "nvidia", 19.5),
    ("H100 SXM", 81559, 2.10, "nvidia", 67.0), ("RTX 3060", 12288, 0.06, "nvidia", 12.7),
]
PLACES = ["Texas, US", "Oregon, US", "Quebec, CA", "Sweden, SE", "Taiwan, TW", "Bavaria, DE",
          "Ontario, CA", "Virginia, US"]


class FakeVast:
    def __init__(self, api_key: str, *, page_size: int = 25, ssh_endpoint=("127.0.0.1", 22),
                 on_ssh_key=None, boot_s=(10.0, 60.0), relist: bool = False,
                 market_seed: int = 1, preemption_rate: float = 0.0):
        self.api_key = api_key
        self.page_size = page_size
        self.ssh_endpoint = ssh_endpoint
        self.on_ssh_key = on_ssh_key or (lambda key: None)
        self.boot_s = boot_s  # (null → loading, loading → running) seconds after create
        # Per machine_id: its own boot_s, or None for a machine that never boots.
        self.boots: dict[int, tuple[float, float] | None] = {}
        self.relist = relist
        self.clock = 0.0
        self.offers: dict[int, dict] = {}
        self.instances: dict[int, dict] = {}
        self.requests: list[tuple[str, str, object, dict]] = []
        self.faults: list[dict] = []
        self._offer_ids = itertools.count(31_000_000, 7)
        self._instance_ids = itertools.count(18_000_000)
        self._machine_ids = itertools.count(40_000)
        self.runner: web.AppRunner | None = None
        self.url = ""
        # Wall-clock billing: per instance, its contract's segments (each at one rate) and
        # bandwidth charges; kept after the instance is destroyed, as Vast keeps charges.
        self.wall_clock = time.time
        self.contracts: dict[int, dict] = {}
        # Interruptible market: see the "interruptible" section.
        self.market_seed = market_seed
        self.preemption_rate = preemption_rate  # chance per hour that a running bid is outbid
        # machine_id → (a competitor's bid, until when on the clock): the minimum bid there
        self.min_bids: dict[int, tuple[float, float]] = {}
        self.ssh_keys: dict[int, dict] = {}
        self._ssh_key_ids = itertools.count(9_000)

    # ------------------------------------------------------------------ market and clock

    def add_offer(self, **fields) -> dict:
        """One offer with every official field; `fields` override (prices: dph_base for the
        GPUs, storage_cost in $/GB/month)."""
        rng = random.Random(len(self.offers))
        name, gpu_ram, per_gpu, arch, tflops = next(
            (g for g in GPUS if g[0] == fields.get("gpu_name")), GPUS[1])
        num_gpus = fields.get("num_gpus", 1)
        offer_id = fields.pop("id", None) or next(self._offer_ids)
        machine_id = fields.pop("machine_id", None) or next(self._machine_ids)
        cpu_cores = 8 * num_gpus * rng.choice([1, 2, 4])
        offer = {
            "id": offer_id, "ask_contract_id": offer_id, "bundle_id": offer_id,
            "bundled_results": 1, "machine_id": machine_id, "host_id": machine_id // 3,
            "num_gpus": num_gpus, "gpu_name": name, "gpu_ram": gpu_ram,
            "gpu_total_ram": gpu_ram * num_gpus, "gpu_frac": 1.0, "gpu_arch": arch,
            "gpu_lanes": 16, "gpu_mem_bw": 900.0, "gpu_max_power": 450.0, "gpu_max_temp": 83.0,
            "compute_cap": 890, "cuda_max_good": 12.4, "bw_nvlink": 0.0,
            "cpu_name": "AMD EPYC 7543 32-Core Processor", "cpu_cores": cpu_cores,
            "cpu_cores_effective": float(cpu_cores), "cpu_ghz": 3.7,
            "cpu_ram": rng.choice([32, 64, 128, 256, 512]) * 1000 * num_gpus + rng.randrange(900),
            "cpu_arch": "amd64", "disk_space": float(rng.choice([200, 500, 1000, 2000])),
            "disk_bw": 2500.0, "disk_name": "Samsung SSD 980", "inet_up": 800.0,
            "inet_down": float(rng.choice([100, 500, 1000, 5000])), "inet_up_cost": 0.002,
            "inet_down_cost": 0.002, "direct_port_count": 100, "pci_gen": 4.0, "pcie_bw": 24.5,
            "mobo_name": "ROME2D16", "os_version": "22.04", "driver_version": "550.54.14",
            "driver_vers": 550054014, "has_avx": 1,
            "dph_base": round(per_gpu * num_gpus * rng.uniform(0.8, 1.5), 4),
            "storage_cost": round(rng.uniform(0.1, 0.3), 3),
            "dlperf": tflops * num_gpus * 1.1, "total_flops": tflops * num_gpus,
            "score": rng.uniform(50, 500), "credit_discount_max": 0.1, "rentable": True,
            "rented": False, "is_bid": False, "external": False, "hosting_type": 0,
            "hostname": None, "public_ipaddr": f"127.0.{machine_id // 250 % 250}.{machine_id % 250 + 1}",
            "geolocation": rng.choice(PLACES), "geolocode": 0,
            "reliability": round(rng.uniform(0.9, 0.9999), 4), "reliability_mult": 1.0,
            "verification": "verified", "vericode": 1, "verified": True, "static_ip": True,
            "vms_enabled": False, "gpu_display_active": False, "resource_type": "gpu",
            "start_date": time.time() - 86_400, "end_date": time.time() + 30 * 86_400,
            "cluster_id": None, "platform_fee": 0.0, **fields,
        }
        offer["expected_reliability"] = offer["reliability"]
        # The machine's minimum bid (GPU part, like dph_base): interruptible is far cheaper.
        offer.setdefault("min_bid", round(offer["dph_base"] * rng.uniform(0.3, 0.55), 4))
        self.offers[offer_id] = offer
        return self.priced(offer, DEFAULT_STORAGE_GB)

    def populate(self, count: int, seed: int = 1) -> None:
        """A market of `count` offers with a realistic spread of GPUs, sizes and prices."""
        rng = random.Random(seed)
        for _ in range(count):
            name = rng.choices([g[0] for g in GPUS], weights=[30, 30, 10, 8, 5, 17])[0]
            self.add_offer(gpu_name=name, num_gpus=rng.choice([1, 1, 1, 2, 4, 8]),
                           verified=rng.random() > 0.1)

    @staticmethod
    def priced(offer: dict, storage_gb: float) -> dict:
        """The offer as search shows it: dph_total includes `storage_gb` of disk."""
        storage = offer["storage_cost"] * storage_gb / HOURS_PER_MONTH
        return {**offer, "storage_total_cost": storage,
                "dph_total": offer["dph_base"] + storage,
                "dlperf_per_dphtotal": offer["dlperf"] / (offer["dph_base"] + storage),
                "flops_per_dphtotal": offer["total_flops"] / (offer["dph_base"] + storage)}

    def advance(self, seconds: float) -> None:
        """Move the fake's clock: instances progress null → loading → running on it."""
        self.clock += seconds
        for instance_id in self.instances:
            self._bill(instance_id)

    def set_status(self, instance_id: int, status: str, status_msg: str = "") -> None:
        """Force an instance's actual_status (exited, offline, unknown, running...)."""
        self.instances[instance_id]["_forced"] = status
        self.instances[instance_id]["status_msg"] = status_msg
        self._bill(instance_id)

    def vanish(self, instance_id: int) -> None:
        """The instance is destroyed on Vast's side (the console, another tool)."""
        del self.instances[instance_id]
        self._end_contract(instance_id)

    def reprice(self, instance_id: int, dph_base: float) -> None:
        """The host's new GPU price, in force from now (as at a contract's extension)."""
        instance = self.instances[instance_id]
        instance["dph_base"] = dph_base
        instance["dph_total"] = dph_base + self._storage_per_hour(instance)
        self._bill(instance_id)

    def charge_bandwidth(self, instance_id: int, *, down: float = 0.0, up: float = 0.0) -> None:
        """Dollars of download / upload traffic billed to the instance's contract."""
        contract = self.contracts[instance_id]
        contract["bwd"] += down
        contract["bwu"] += up

    # ------------------------------------------------------------------ billing

    GPU_BILLING = {"running", "frozen", "rebooting", "unknown", "offline"}

    @staticmethod
    def _storage_per_hour(instance: dict) -> float:
        return instance["storage_cost"] * instance["disk_space"] / HOURS_PER_MONTH

    def _bill(self, instance_id: int) -> None:
        """Bring the contract's billing up to the instance's state now: a segment per rate."""
        instance = self.instances[instance_id]
        contract = self.contracts[instance_id]
        status = self._status(instance)
        gpu = instance["dph_base"] if status in self.GPU_BILLING else 0.0
        rates = (gpu, self._storage_per_hour(instance))
        segments = contract["segments"]
        if segments and segments[-1]["end"] is None and (
                segments[-1]["gpu"], segments[-1]["disk"]) == rates:
            return
        now = self.wall_clock()
        if segments and segments[-1]["end"] is None:
            segments[-1]["end"] = now
        segments.append({"start": now, "end": None, "gpu": rates[0], "disk": rates[1],
                         "gpus": instance["num_gpus"] if gpu else 0})

    def _end_contract(self, instance_id: int) -> None:
        contract = self.contracts[instance_id]
        if contract["segments"] and contract["segments"][-1]["end"] is None:
            contract["segments"][-1]["end"] = self.wall_clock()
        contract["end"] = self.wall_clock()

    def billing_records(self, until: float | None = None) -> dict[int, dict]:
        """The fake's own record per contract (instance id → label, dollars billed up to
        `until` (default now) by item, $/h and GPUs billing at `until`), computed from its
        segments alone, for a test to hold the product's figures against."""
        self._bill_all()
        until = self.wall_clock() if until is None else until
        records = {}
        for instance_id, contract in self.contracts.items():
            gpu = disk = dph = 0.0
            gpus = 0
            for seg in contract["segments"]:
                end = until if seg["end"] is None else min(seg["end"], until)
                hours = max(end - seg["start"], 0.0) / 3600
                gpu += seg["gpu"] * hours
                disk += seg["disk"] * hours
                if seg["start"] <= until and (seg["end"] is None or seg["end"] > until):
                    dph, gpus = seg["gpu"] + seg["disk"], seg["gpus"]
            records[instance_id] = {"label": contract["label"], "gpu": gpu, "disk": disk,
                                    "bwd": contract["bwd"], "bwu": contract["bwu"],
                                    "dollars": gpu + disk + contract["bwd"] + contract["bwu"],
                                    "dph": dph, "gpus": gpus}
        return records

    def _bill_all(self) -> None:
        for instance_id in self.instances:
            self._bill(instance_id)

    # ------------------------------------------------------------------ faults

    def fail_next(self, path_prefix: str, status: int, body=None, *, headers=None,
                  times: int = 1, text: str | None = None) -> None:
        """The next `times` calls under `path_prefix` get this answer (JSON `body` or `text`)."""
        self.faults.append({"prefix": path_prefix, "status": status, "body": body,
                            "text": text, "headers": headers or {}, "times": times})

    def rate_limit(self, path_prefix: str, *, retry_after: str | None = None, times: int = 1,
                   text: bool = False, window_s: float | None = None) -> None:
        """429s under `path_prefix`: `times` of them, or (window_s) every call until that many
        real seconds have passed since the first one, like Vast's per-endpoint limiter."""
        body = None if text else {"detail": "API requests too frequent endpoint threshold=2.0"}
        fault = {"prefix": path_prefix, "status": 429, "body": body,
                 "text": "Too Many Requests" if text else None,
                 "headers": {"Retry-After": retry_after} if retry_after else {},
                 "times": times, "window_s": window_s}
        self.faults.append(fault)

    def break_next(self, path_prefix: str, how: str) -> None:
        """`not_json`: 200 with an HTML page; `truncated`: a body shorter than its length;
        `drop`: the connection closes with no answer."""
        self.faults.append({"prefix": path_prefix, "break": how, "times": 1})

    def lose_next_create(self, how: str = "504") -> None:
        """The next create happens, but its answer is lost (a 504 from the gateway, or the
        connection drops)."""
        self.faults.append({"prefix": "/api/v0/asks/", "lose": how, "times": 1})

    def _take_fault(self, path: str) -> dict | None:
        for fault in self.faults:
            if not path.startswith(fault["prefix"]):
                continue
            if fault.get("window_s") is not None:
                started = fault.setdefault("started", time.monotonic())
                if time.monotonic() - started >= fault["window_s"]:
                    self.faults.remove(fault)
                    return None
                return fault
            fault["times"] -= 1
            if fault["times"] <= 0:
                self.faults.remove(fault)
            return fault
        return None

    # ------------------------------------------------------------------ server

    async def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:`port` (0: any free port); returns the base URL."""
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/api/v0/bundles/", self.search)
        app.router.add_put("/api/v0/asks/{id:\\d+}/", self.create)
        app.router.add_get("/api/v1/instances/", self.list_v1)
        app.router.add_get("/api/v0/instances/", self.list_v0)
        app.router.add_get("/api/v0/instances/{id:\\d+}/", self.show)
        app.router.add_delete("/api/v0/instances/{id:\\d+}/", self.destroy)
        app.router.add_put("/api/v0/instances/{id:\\d+}/", self.manage)
        app.router.add_get("/api/v0/charges/", self.charges)
        app.router.add_post("/api/v0/instances/{id:\\d+}/ssh/", self.attach_ssh)
        self._add_interruptible_routes(app)
        self._add_account_key_routes(app)
        runner = self.runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @web.middleware
    async def _middleware(self, request, handler):
        if request.match_info.http_exception is not None:
            raise request.match_info.http_exception  # 404 / 405, before anything else
        raw = await request.read() if request.can_read_body else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return _error(400, "invalid_args", "the body is not JSON")
        self.requests.append((request.method, request.path, body, dict(request.query)))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "auth_error", "Invalid user key")
        fault = self._take_fault(request.path)
        request[BODY] = body
        if fault is None:
            return await handler(request)
        if "lose" in fault:
            await handler(request)
            if fault["lose"] == "drop":
                return await _drop(request)
            return web.Response(status=504, text="<html>504 Gateway Time-out</html>",
                                content_type="text/html")
        if "break" in fault:
            return await _broken(request, fault["break"])
        if fault["text"] is not None:
            return web.Response(status=fault["status"], text=fault["text"],
                                headers=fault["headers"])
        return web.json_response(fault["body"], status=fault["status"],
                                 headers=fault["headers"])

    # ------------------------------------------------------------------ offers

    async def search(self, request):
        query = request[BODY]
        if not isinstance(query, dict):
            return _error(400, "invalid_args", "the search body must be a JSON object")
        filters = {}
        for key, value in query.items():
            if key in SEARCH_KEYS:
                continue
            if key not in OFFER_FIELDS:
                return _error(400, "invalid_args", f"unknown search field {key!r}")
            if not isinstance(value, dict) or not value:
                return _error(400, "invalid_args", f"{key}: expected {{operator: value}}")
            for op, operand in value.items():
                if op not in OPERATORS:
                    return _error(400, "invalid_args", f"{key}: unknown operator {op!r}")
                if op in ("in", "notin") and not isinstance(operand, list):
                    return _error(400, "invalid_args", f"{key} {op}: expected a list")
            filters[key] = value
        if query.get("type", "on-demand") not in ("on-demand", "bid", "reserved"):
            return _error(400, "invalid_args", f"unknown offer type {query['type']!r}")
        storage = query.get("allocated_storage", DEFAULT_STORAGE_GB)
        limit = query.get("limit", 64)
        if not isinstance(storage, int | float) or storage < 0 or \
                not isinstance(limit, int) or limit < 1:
            return _error(400, "invalid_args", "allocated_storage and limit must be positive")
        offer_type = query.get("type", "on-demand")
        offers = [self.priced_as(o, storage, offer_type) for o in self.offers.values()]
        order = query.get("order", [["score", "desc"]])
        for column, direction in reversed(self._order(order, offers)):
            offers.sort(key=_by(column), reverse=direction == "desc")
        found = [o for o in offers if all(_matches(k, o.get(k), cond)
                                          for k, cond in filters.items())]
        return web.json_response({"offers": found[:limit]})

    @staticmethod
    def _order(order, offers) -> list:
        columns = set(offers[0]) if offers else OFFER_FIELDS | {"score"}
        if not isinstance(order, list) or not all(
                isinstance(o, list) and len(o) == 2 and o[0] in columns | {"score"} and
                o[1] in ("asc", "desc") for o in order):
            raise web.HTTPBadRequest(text=json.dumps({
                "success": False, "error": "invalid_args",
                "msg": "order must be [[column, 'asc'|'desc'], ...]"}),
                content_type="application/json")
        return order

    # ------------------------------------------------------------------ instances

    async def create(self, request):
        offer = self.offers.get(int(request.match_info["id"]))
        if offer is None:
            return _error(404, "no_such_ask", "Instance type no longer available")
        body = request[BODY]
        problem = _create_problem(body)
        if problem:
            return _error(400, "invalid_args", problem)
        if "price" in body and (problem := _bid_problem(body["price"], CREATE_MAX_BID)):
            return _error(400, "invalid_price", problem)
        return web.json_response({"success": True, "new_contract": self._create(offer, body)})

    def add_instance(self, label: str | None = None) -> int:
        """An instance someone else created on the account (the console, another tool)."""
        first = next(iter(self.offers), None)
        offer = (self.offers[first] if first is not None else None) or self.add_offer()
        return self._create(offer, {"client_id": "me", "image": "ubuntu:22.04", "disk": 16,
                                    "label": label})

    def _create(self, offer: dict, body: dict) -> int:
        del self.offers[offer["id"]]
        instance_id = next(self._instance_ids)
        priced = self.priced(offer, body["disk"])
        self.instances[instance_id] = {
            "id": instance_id, "machine_id": offer["machine_id"], "host_id": offer["host_id"],
            "label": body.get("label"), "cur_state": "running", "next_state": "running",
            "intended_status": "running", "image_uuid": body["image"],
            "image_runtype": body.get("runtype", "ssh"), "image_args": "",
            "num_gpus": offer["num_gpus"], "gpu_name": offer["gpu_name"], "gpu_util": 0.0,
            "gpu_arch": offer["gpu_arch"], "gpu_ram": offer["gpu_ram"],
            "cpu_ram": offer["cpu_ram"], "cpu_cores_effective": offer["cpu_cores_effective"],
            "disk_space": float(body["disk"]), "inet_up": offer["inet_up"],
            "inet_down": offer["inet_down"], "ssh_host": "127.0.0.1",
            "ssh_port": 40_000 + instance_id % 20_000, "ssh_idx": "5",
            "public_ipaddr": self.ssh_endpoint[0] + "\n", "local_ipaddrs": ["127.0.0.2"],
            "direct_port_start": self.ssh_endpoint[1], "direct_port_end": self.ssh_endpoint[1],
            "status_msg": "", "jupyter_token": "never-render-this",
            "extra_env": [[k, v] for k, v in body.get("env", {}).items()]
            if isinstance(body.get("env"), dict) else [], "onstart": body.get("onstart"),
            "start_date": time.time(), "end_date": None, "reliability2": offer["reliability"],
            "dph_base": offer["dph_base"], "dph_total": priced["dph_total"],
            "storage_cost": offer["storage_cost"], "geolocation": offer["geolocation"],
            "template_id": None, "template_hash_id": None, "_created": self.clock,
            "_offer": offer, "is_bid": False,
        }
        if "price" in body:
            self._start_bid(self.instances[instance_id], float(body["price"]))
        self.contracts[instance_id] = {"label": body.get("label"), "start": self.wall_clock(),
                                       "end": None, "segments": [], "bwd": 0.0, "bwu": 0.0}
        self._bill(instance_id)
        return instance_id

    def _status(self, instance: dict) -> str | None:
        """actual_status now: forced (exited, stopped...), else from the fake's clock."""
        age = self.clock - instance["_created"]
        boot = self.boots.get(instance["machine_id"], self.boot_s)
        return instance.get("_forced") or self._bid_status(instance) or (
            None if age < (boot or self.boot_s)[0] else
            "loading" if boot is None or age < boot[1] else "running")

    def _public(self, instance: dict) -> dict:
        """The instance as the API shows it now: status from the clock, ports while running."""
        status = self._status(instance)
        row = {k: v for k, v in instance.items() if not k.startswith("_")}
        row["actual_status"] = status
        if status == "running":
            row["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0",
                                        "HostPort": str(self.ssh_endpoint[1])}]}
        return row

    async def list_v1(self, request):
        try:
            params = {k: json.loads(request.query[k]) for k in
                      ("select_filters", "order_by", "select_cols") if k in request.query}
            limit = int(request.query.get("limit", 25))
            after = int(base64.urlsafe_b64decode(request.query["after_token"]).decode()) \
                if "after_token" in request.query else 0
        except ValueError:
            return _error(400, "invalid_args", "malformed query parameters")
        if not 1 <= limit <= 25:
            return _error(400, "invalid_args", "limit must be 1..25")
        filters = params.get("select_filters") or {}
        for column, condition in filters.items():
            if column not in INSTANCE_FILTER_COLUMNS:
                return _error(400, "invalid_args", f"cannot filter on {column!r}")
            if not isinstance(condition, dict) or not set(condition) <= set(OPERATORS):
                return _error(400, "invalid_args", f"{column}: bad condition")
        rows = [self._public(i) for key, i in sorted(self.instances.items()) if key > after]
        rows = [r for r in rows if all(_matches(c, r.get(c), cond) for c, cond in filters.items())]
        page = rows[:min(limit, self.page_size)]
        more = len(rows) > len(page)
        token = base64.urlsafe_b64encode(str(page[-1]["id"]).encode()).decode() if more else None
        return web.json_response({"success": True, "instances_found": len(page),
                                  "total_instances": len(self.instances), "label_counts": {},
                                  "next_token": token, "instances": page})

    async def list_v0(self, request):
        return _error(410, "deprecated_endpoint", "use /api/v1/instances/")

    async def show(self, request):
        if request.query.get("owner") != "me":
            return _error(400, "invalid_args", "owner=me is required")
        instance = self.instances.get(int(request.match_info["id"]))
        return web.json_response({"instances": self._public(instance) if instance else None})

    async def destroy(self, request):
        if not isinstance(request[BODY], dict):
            return _error(400, "invalid_args", "the body must be a JSON object")
        instance = self.instances.pop(int(request.match_info["id"]), None)
        if instance is None:
            return _error(404, "no_such_instance", "Instance not found")
        self._end_contract(instance["id"])
        if self.relist:
            self.offers[instance["_offer"]["id"]] = instance["_offer"]
        return web.json_response({"success": True})

    async def manage(self, request):
        """Start or stop an instance (`{"state": "running"|"stopped"}`), or label it."""
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return _error(404, "no_such_instance", "Instance not found")
        body = request[BODY]
        if not isinstance(body, dict) or not body or not set(body) <= {"state", "label"}:
            return _error(400, "invalid_args", "the body sets state or label")
        state = body.get("state")
        if state is not None and state not in ("running", "stopped"):
            return _error(400, "invalid_args", "state must be running or stopped")
        if "label" in body:
            instance["label"] = body["label"]
        if state == "stopped":
            instance["_forced"], instance["intended_status"] = "stopped", "stopped"
        elif state == "running":
            instance.pop("_forced", None)
            instance["intended_status"] = "running"
        self._bill(instance["id"])
        return web.json_response({"success": True})

    async def charges(self, request):
        """Per-contract charges over a day range (showCharges in the official OpenAPI)."""
        try:
            filters = json.loads(request.query.get("select_filters", "null"))
            limit = int(request.query.get("limit", 100))
        except ValueError:
            return _error(400, "invalid_args", "select_filters must be JSON; limit an integer")
        day = filters.get("day") if isinstance(filters, dict) else None
        if not isinstance(day, dict) or not all(
                isinstance(day.get(k), int | float) for k in ("gte", "lte")):
            return web.json_response({"success": False, "msg": "Must provide both 'day' gte "
                                      "and lte filters for instance charges"}, status=400)
        kinds = (filters.get("type") or {}).get("in", ["instance", "volume", "serverless"])
        if not 1 <= limit <= 500 or request.query.get("format", "table") not in (
                "table", "tree") or request.query.get("latest_first", "true") not in (
                "true", "false", "True", "False"):
            return _error(400, "invalid_args", "limit 1..500, format table|tree, "
                                               "latest_first a boolean")
        try:
            after = int(base64.urlsafe_b64decode(request.query["after_token"]).decode())                 if "after_token" in request.query else 0
        except ValueError:
            return web.json_response({"success": False, "error": "invalid_token",
                                      "msg": "Invalid pagination token"}, status=400)
        self._bill_all()
        now = self.wall_clock()
        since, until = float(day["gte"]), min(float(day["lte"]), now)
        rows = []
        for instance_id, contract in sorted(self.contracts.items()):
            if "instance" not in kinds or contract["start"] > until or (
                    contract["end"] is not None and contract["end"] < since):
                continue
            rows.append(self._charge_row(instance_id, contract, since, until))
        if request.query.get("latest_first", "true").lower() == "true":
            rows.reverse()
        page = rows[after:after + limit]
        token = base64.urlsafe_b64encode(str(after + limit).encode()).decode() \
            if after + limit < len(rows) else None
        return web.json_response({"success": True, "count": len(page), "total": len(rows),
                                  "next_token": token, "results": page})

    def _charge_row(self, instance_id: int, contract: dict, since: float, until: float) -> dict:
        items: list[dict] = []
        start, end = max(contract["start"], since), min(contract["end"] or until, until)
        for kind in ("gpu", "disk"):
            amount = hours = 0.0
            rate = 0.0
            for seg in contract["segments"]:
                seg_end = until if seg["end"] is None else min(seg["end"], until)
                span = max(seg_end - max(seg["start"], since), 0.0) / 3600
                if seg[kind] and span:
                    amount += seg[kind] * span
                    hours += span
                    rate = seg[kind]
            if amount:
                items.append({"start": int(start), "end": int(end), "type": kind, "source": None,
                              "description": f"{hours:.3f} hours at ${rate:.3f}/hour",
                              "amount": round(amount, 3), "metadata": {}, "items": []})
        for kind in ("bwd", "bwu"):
            if contract[kind]:
                items.append({"start": int(start), "end": int(end), "type": kind, "source": None,
                              "description": f"{'download' if kind == 'bwd' else 'upload'}",
                              "amount": round(contract[kind], 3), "metadata": {},
                              "items": []})
        days = max(end - start, 0.0) / 86400
        return {"start": int(start), "end": int(end), "type": "instance",
                "source": f"instance-{instance_id}",
                "description": f"Instance {instance_id} Charges - {days:.0f} days",
                "amount": round(sum(i["amount"] for i in items), 3),
                "metadata": {"label": contract["label"]} if contract["label"] else {},
                "items": items}

    async def attach_ssh(self, request):
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return _error(404, "no_such_instance", "Instance not found")
        key = (request[BODY] or {}).get("ssh_key")
        if not isinstance(key, str) or not key.startswith(("ssh-", "ecdsa-")):
            return _error(400, "invalid_args", "ssh_key must be an OpenSSH public key")
        instance.setdefault("ssh_keys", []).append(key)
        self.on_ssh_key(key)
        return web.json_response({"success": True})

    # ------------------------------------------------------------------ interruptible (bids)
    # Vast's instance types: an interruptible instance runs while its bid is the machine's
    # highest; when someone bids more it is stopped ("outbid", storage still billed) and runs
    # again when its bid is raised above theirs or they leave. What the real service shows on an
    # outbid instance is not documented; the fake says actual_status "stopped" with
    # intended_status "running" (the renter still wants it) and a status_msg naming the outbid.

    def _add_interruptible_routes(self, app: web.Application) -> None:
        app.router.add_put("/api/v0/instances/bid_price/{id:\\d+}/", self.change_bid)

    def priced_as(self, offer: dict, storage_gb: float, offer_type: str) -> dict:
        """The offer as a search of `offer_type` shows it: a bid search prices it at the
        machine's minimum bid now; reserved at the on-demand price less the prepay discount."""
        if offer_type == "bid":
            base = self.min_bid(offer["machine_id"], offer["min_bid"])
            return {**self.priced({**offer, "dph_base": base}, storage_gb), "is_bid": True,
                    "min_bid": base}
        if offer_type == "reserved":
            base = offer["dph_base"] * (1 - offer["credit_discount_max"])
            return self.priced({**offer, "dph_base": round(base, 4)}, storage_gb)
        return self.priced(offer, storage_gb)

    def min_bid(self, machine_id: int, listed: float) -> float:
        """A machine's minimum bid now: its listed one, or a competitor's above it."""
        competitor, until = self.min_bids.get(machine_id, (0.0, 0.0))
        return max(listed, competitor) if self.clock < until else listed

    def _draws(self, instance: dict) -> random.Random:
        """The market's draws for one instance and one run of it: reproducible per seed,
        whatever order the instances were created in."""
        runs = instance["_bid_runs"] = instance.get("_bid_runs", 0) + 1
        return random.Random(f"{self.market_seed}:{instance['id']}:{runs}")

    def _start_bid(self, instance: dict, price: float) -> None:
        offer = instance["_offer"]
        storage = instance["dph_total"] - offer["dph_base"]
        instance.update(is_bid=True, _bid=price, dph_base=price, dph_total=price + storage,
                        min_bid=self.min_bid(offer["machine_id"], offer["min_bid"]))
        if price < instance["min_bid"]:
            # Underbid at create: created stopped, until the bid is raised.
            self._stop_outbid(instance, instance["min_bid"], until=math.inf)
        else:
            self._schedule_outbid(instance, self.clock)

    def _schedule_outbid(self, instance: dict, since: float) -> None:
        draws = self._draws(instance)
        rate = self.preemption_rate / 3600
        instance["_outbid_at"] = since + draws.expovariate(rate) if rate > 0 else math.inf
        # The competitor who will outbid it: how much more, and for how long.
        instance["_competitor"] = (draws.uniform(1.1, 1.6), draws.expovariate(1 / 5400))
        instance["_outbid"] = False

    def _stop_outbid(self, instance: dict, competitor_bid: float, until: float) -> None:
        machine_id = instance["_offer"]["machine_id"]
        self.min_bids[machine_id] = (competitor_bid, until)
        instance.update(_outbid=True, _competitor_until=until, cur_state="stopped",
                        min_bid=competitor_bid,
                        status_msg=f"outbid: the machine's minimum bid is now "
                                   f"${competitor_bid:.4f}/h")

    def _resume(self, instance: dict, at: float) -> None:
        self.min_bids.pop(instance["_offer"]["machine_id"], None)
        instance.update(cur_state="running", status_msg="",
                        min_bid=instance["_offer"]["min_bid"])
        self._schedule_outbid(instance, at)

    def _bid_status(self, instance: dict) -> str | None:
        """Settle the market up to the clock; "stopped" while outbid, else None (the boot
        schedule decides)."""
        if not instance.get("is_bid"):
            return None
        for _ in range(1000):  # a bounded walk through every outbid and resume so far
            if instance["_outbid"]:
                if self.clock < instance["_competitor_until"]:
                    return "stopped"
                self._resume(instance, instance["_competitor_until"])
            elif self.clock >= instance["_outbid_at"]:
                more, stay = instance["_competitor"]
                self._stop_outbid(instance, instance["_bid"] * more,
                                  instance["_outbid_at"] + stay)
            else:
                return None
        return "stopped" if instance["_outbid"] else None

    def outbid(self, instance_id: int, *, competitor_bid: float | None = None,
               for_s: float = math.inf) -> None:
        """Someone outbids this interruptible instance now (tests; the seeded market does it
        by itself at `preemption_rate`)."""
        instance = self.instances[instance_id]
        if not instance.get("is_bid"):
            raise ValueError(f"instance {instance_id} is on-demand: it cannot be outbid")
        self._bid_status(instance)
        self._stop_outbid(instance, competitor_bid or instance["_bid"] * 1.25,
                          self.clock + for_s)

    async def change_bid(self, request):
        body = request[BODY]
        if not isinstance(body, dict) or body.get("client_id") != "me":
            return _error(400, "invalid_args", "client_id must be 'me'")
        if problem := _bid_problem(body.get("price"), CHANGE_MAX_BID):
            return _error(400, "invalid_args", problem)
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return _error(404, "no_such_instance", "Instance with that ID does not exist.")
        if not instance.get("is_bid"):
            return _error(400, "invalid_args", "the instance is on-demand: it has no bid")
        self._bid_status(instance)
        price = float(body["price"])
        storage = instance["dph_total"] - instance["dph_base"]
        instance.update(_bid=price, dph_base=price, dph_total=price + storage)
        if instance["_outbid"] and price > self.min_bid(instance["_offer"]["machine_id"],
                                                        instance["_offer"]["min_bid"]):
            self._resume(instance, self.clock)
        return web.json_response({"success": True})

    # ------------------------------------------------------------------ account SSH keys

    def _add_account_key_routes(self, app: web.Application) -> None:
        app.router.add_post("/api/v0/ssh/", self.create_account_key)
        app.router.add_get("/api/v0/ssh/", self.list_account_keys)
        app.router.add_delete("/api/v0/ssh/{id:\\d+}/", self.delete_account_key)

    async def create_account_key(self, request):
        key = (request[BODY] or {}).get("ssh_key") if isinstance(request[BODY], dict) else None
        if not key:
            return _error(400, "no_ssh_key", "No ssh key provided")
        if not isinstance(key, str) or not key.startswith(("ssh-", "ecdsa-")):
            return _error(400, "invalid_request", "ssh_key must be an OpenSSH public key")
        key_id = next(self._ssh_key_ids)
        row = {"id": key_id, "user_id": 1, "public_key": key.strip(),
               "created_at": "2026-12-01T00:00:00Z", "deleted_at": None}
        self.ssh_keys[key_id] = row
        # "The key will be automatically added to all your current instances."
        for instance in self.instances.values():
            instance.setdefault("ssh_keys", []).append(key)
        self.on_ssh_key(key)
        return web.json_response({"success": True, "key": row})

    async def list_account_keys(self, request):
        return web.json_response([{"id": r["id"], "user_id": r["user_id"], "key": r["public_key"],
                                   "created_at": r["created_at"], "deleted_at": None}
                                  for r in self.ssh_keys.values()])

    async def delete_account_key(self, request):
        if self.ssh_keys.pop(int(request.match_info["id"]), None) is None:
            return _error(404, "no_such_key", "SSH key not found")
        return web.json_response({"success": True})


def _by(column: str):
    """A sort key on one column: missing values last."""
    return lambda offer: (offer.get(column) is None, offer.get(column) or 0)


def _matches(column: str, value, condition: dict) -> bool:
    if value is None:
        return False
    if column == "geolocation":  # filters use the country code; offers say "Region, CC"
        value = value.rsplit(", ", 1)[-1]
    try:
        return all(OPERATORS[op](value, _as_column_type(value, expected))
                   for op, expected in condition.items())
    except (TypeError, ValueError):  # not comparable with the column: no match
        return False


def _as_column_type(value, operand):
    """The official CLI sends most operands as strings (`num_gpus: {"eq": "1"}`); the server
    casts them to the column's type."""
    if isinstance(operand, list):
        return [_as_column_type(value, item) for item in operand]
    if isinstance(operand, str) and isinstance(value, int | float) and \
            not isinstance(value, bool):
        return float(operand)
    return operand


# The runtypes the official client sends (cli `get_runtype`): `--ssh --direct` is the third.
RUNTYPES = {"ssh", "ssh_proxy", "ssh_direc ssh_proxy", "jupyter_proxy ssh_proxy",
            "jupyter_direc ssh_direc ssh_proxy", "args"}


def _create_problem(body) -> str:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if body.get("client_id") != "me":
        return "client_id must be 'me'"
    if not isinstance(body.get("image"), str) or not body["image"] or \
            any(c.isspace() for c in body["image"]):
        return "image is required (a Docker reference without spaces)"
    if not isinstance(body.get("disk"), int | float) or body["disk"] < 8:
        return "disk (GB, at least 8) is required"
    env = body.get("env", {})
    if not isinstance(env, dict | str):
        return "env must be an object or a docker-flags string"
    # The client's parse_env makes every value a string; docker takes nothing else.
    if isinstance(env, dict) and not all(isinstance(k, str) and k and isinstance(v, str)
                                         for k, v in env.items()):
        return "env must map names to string values"
    if "runtype" in body and body["runtype"] not in RUNTYPES:
        return f"unknown runtype {body['runtype']!r}"
    if len(body.get("label") or "") > 256:
        return "label is longer than 256 characters"
    if len(body.get("onstart") or "") + len(" ".join(body.get("args") or [])) > 4096:
        return "onstart and args exceed 4096 characters"
    return ""


# The OpenAPI file's bounds on a bid ($/h): create accepts up to 128, change bid up to 32.
CREATE_MAX_BID, CHANGE_MAX_BID = 128.0, 32.0


def _bid_problem(price, maximum: float) -> str:
    if isinstance(price, bool) or not isinstance(price, int | float) or \
            not 0.001 <= price <= maximum:
        return f"Please set a bid price between 0.001 and {maximum:g} $/h."
    return ""


def _error(status: int, code: str, message: str):
    return web.json_response({"success": False, "error": code, "msg": message}, status=status)


async def _drop(request):
    request.transport.abort()
    return web.Response(status=200)


async def _broken(request, how: str):
    if how == "not_json":
        return web.Response(text="<html><body>Cloudflare: origin error</body></html>",
                            content_type="text/html")
    if how == "truncated":
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"offers": [')
        request.transport.abort()
        return response
    return await _drop(request)
