"""Engine commands: ``serve``, ``bench pipeline`` and ``bench status``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cuzk_engine.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run the proving engine daemon (HTTP API)")
    p.add_argument("--config", type=Path, default=None, help="TOML config file")
    p.add_argument("--listen", default=None, help="override daemon.listen (host:port)")
    p.add_argument("--param-cache", type=Path, default=None, help="override srs.param_cache")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)


def register_bench(bench) -> None:
    p = bench.add_parser("pipeline", help="continuous load in pipelined and monolithic modes")
    p.add_argument("--profile", default="small")
    p.add_argument("--kind", default="porep-c2")
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_bench_pipeline)
    s = bench.add_parser("status", help="snapshot build time and writer blocking")
    s.add_argument("--pipelines", type=int, default=100)
    s.add_argument("--partitions", type=int, default=16)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_bench_status)


def _load(args: argparse.Namespace):
    # imported here, not at module level: every `prove` process imports this module
    from cuzk_engine.config import load_config

    try:
        cfg = load_config(args.config)
        if getattr(args, "listen", None):
            from cuzk_engine.config import parse_listen

            parse_listen(args.listen)
            cfg.daemon.listen = args.listen
        if getattr(args, "param_cache", None):
            cfg.param_cache = args.param_cache
        cfg.check_daemon_security()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    return cfg


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _load(args)
    if cfg is None:
        return 2
    # imported here: asyncio (with ssl) costs a one-shot `prove` ~20 ms of start-up
    import asyncio

    from cuzk_engine.daemon import serve

    asyncio.run(serve(cfg, ready=lambda url: print(f"cuzk engine serving on {url}",
                                                   flush=True)))
    return 0


def _bench_pipeline(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if cfg is None:
        return 2
    import asyncio

    from cuzk_engine.bench.pipeline import print_report, run_pipeline_bench

    report = asyncio.run(run_pipeline_bench(cfg, args.kind, args.profile, args.jobs))
    print_report(report, as_json=args.json)
    return 0


def _bench_status(args: argparse.Namespace) -> int:
    from cuzk_engine.bench.status import print_report, run_status_bench

    print_report(run_status_bench(args.pipelines, args.partitions), as_json=args.json)
    return 0
