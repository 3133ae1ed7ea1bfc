"""A fake Vast.ai API on 127.0.0.1 following the documented endpoints, fields and errors."""

import itertools

from aiohttp import web

# The parsed JSON body, read once by the middleware for the request log.
BODY = web.RequestKey("body", object)


class FakeVast:
    def __init__(self, api_key: str, *, page_size: int = 25, ssh_endpoint=("127.0.0.1", 22),
                 on_ssh_key=None):
        self.api_key = api_key
        self.page_size = page_size
        self.ssh_endpoint = ssh_endpoint
        self.on_ssh_key = on_ssh_key or (lambda key: None)
        self.offers: dict[int, dict] = {}
        self.instances: dict[int, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.faults: list[tuple[str, int, dict]] = []
        self._ids = itertools.count(5000)
        self.runner = None
        self.url = ""

    def add_offer(self, **fields) -> dict:
        offer_id = fields.pop("id", next(self._ids))
        offer = {"id": offer_id, "machine_id": 100 + offer_id % 100, "host_id": 7,
                 "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "cpu_ram": 257000,
                 "dph_total": 0.4, "reliability2": 0.99, "geolocation": "US",
                 "verified": True, "rentable": True, "rented": False, "external": False,
                 **fields}
        self.offers[offer_id] = offer
        return offer

    def fail_next(self, path_prefix: str, status: int, body: dict) -> None:
        self.faults.append((path_prefix, status, body))

    async def start(self) -> str:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/api/v0/bundles/", self.search)
        app.router.add_put("/api/v0/asks/{id:\\d+}/", self.create)
        app.router.add_get("/api/v1/instances/", self.list_v1)
        app.router.add_get("/api/v0/instances/", self.list_v0)
        app.router.add_get("/api/v0/instances/{id:\\d+}/", self.show)
        app.router.add_delete("/api/v0/instances/{id:\\d+}/", self.destroy)
        app.router.add_post("/api/v0/instances/{id:\\d+}/ssh/", self.attach_ssh)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        await self.runner.cleanup()

    @web.middleware
    async def _middleware(self, request, handler):
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, body))
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"success": False, "error": "auth_error",
                                      "msg": "Invalid user key"}, status=404)
        for fault in self.faults:
            if request.path.startswith(fault[0]):
                self.faults.remove(fault)
                return web.json_response(fault[2], status=fault[1])
        request[BODY] = body
        return await handler(request)

    @staticmethod
    def _matches(value, condition: dict) -> bool:
        ops = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b,
               "gt": lambda a, b: a > b, "gte": lambda a, b: a >= b,
               "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b,
               "in": lambda a, b: a in b, "nin": lambda a, b: a not in b}
        return all(ops[op](value, expected) for op, expected in condition.items())

    async def search(self, request):
        query = request[BODY]
        filters = {k: v for k, v in query.items() if isinstance(v, dict)}
        offers = [o for o in self.offers.values()
                  if all(self._matches(o.get(k), cond) for k, cond in filters.items())]
        return web.json_response({"offers": offers[: query.get("limit", 64)]})

    async def create(self, request):
        offer = self.offers.pop(int(request.match_info["id"]), None)
        if offer is None:
            return web.json_response({"success": False, "error": "no_such_ask",
                                      "msg": "Instance type no longer available"}, status=404)
        body = request[BODY]
        if not body.get("image") or body.get("client_id") != "me" or \
                not isinstance(body.get("env"), dict):
            return web.json_response({"success": False, "error": "invalid_args"}, status=400)
        instance_id = next(self._ids)
        host, port = self.ssh_endpoint
        self.instances[instance_id] = {
            "id": instance_id, "label": body.get("label"), "actual_status": "running",
            "intended_status": "running", "machine_id": offer["machine_id"],
            "host_id": offer["host_id"], "gpu_name": offer["gpu_name"],
            "num_gpus": offer["num_gpus"], "dph_total": offer["dph_total"],
            "public_ipaddr": host, "ports": {"22/tcp": [{"HostIp": "0.0.0.0",
                                                        "HostPort": str(port)}]},
            "ssh_host": "ssh5.vast.example", "ssh_port": 40000, "onstart": body.get("onstart"),
            "image_uuid": body["image"], "jupyter_token": "never-render-this",
        }
        return web.json_response({"success": True, "new_contract": instance_id})

    async def list_v1(self, request):
        after = int(request.query.get("after_token") or 0)
        limit = min(int(request.query.get("limit", 25)), 25, self.page_size)
        rows = [i for key, i in sorted(self.instances.items()) if key > after][:limit]
        more = rows and any(key > rows[-1]["id"] for key in self.instances)
        return web.json_response({"success": True, "instances_found": len(rows),
                                  "total_instances": len(self.instances),
                                  "next_token": str(rows[-1]["id"]) if more else None,
                                  "instances": rows})

    async def list_v0(self, request):
        return web.json_response({"success": False, "error": "deprecated_endpoint"}, status=410)

    async def show(self, request):
        return web.json_response(
            {"instances": self.instances.get(int(request.match_info["id"]))})

    async def destroy(self, request):
        if self.instances.pop(int(request.match_info["id"]), None) is None:
            return web.json_response({"success": False, "error": "no_such_instance"},
                                     status=404)
        return web.json_response({"success": True})

    async def attach_ssh(self, request):
        instance = self.instances.get(int(request.match_info["id"]))
        if instance is None:
            return web.json_response({"success": False, "error": "no_such_instance"},
                                     status=404)
        instance.setdefault("ssh_keys", []).append(request[BODY]["ssh_key"])
        self.on_ssh_key(request[BODY]["ssh_key"])
        return web.json_response({"success": True})
