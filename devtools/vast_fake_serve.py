"""The strict fake Vast on its own, for a trial of the dashboard without a Vast account:
`./dev up --vast-fake` runs it on loopback and points the stack at it. It lists a small market
of offers; rented instances boot after the fake's usual delays. It is the tests' fake, not a
simulator: SSH into its instances reaches nothing, so Provision fails (saying why).

    python -m devtools.vast_fake_serve --port 8123 --api-key KEY [--offers 8]
"""

import argparse
import asyncio
import signal

from devtools.fake_vast import GPUS, FakeVast


async def serve(port: int, api_key: str, offers: int) -> None:
    fake = FakeVast(api_key)
    url = await fake.start(port)
    for index in range(offers):
        fake.add_offer(gpu_name=GPUS[index % len(GPUS)][0], num_gpus=1 + index % 2)
    print(f"fake Vast on {url} with {offers} offers; its API key: {api_key}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await fake.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="on 127.0.0.1")
    parser.add_argument("--api-key", required=True, help="the key the dashboard must send")
    parser.add_argument("--offers", type=int, default=8, help="offers on the market")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.api_key, args.offers))


if __name__ == "__main__":
    main()
