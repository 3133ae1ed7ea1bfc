"""The engine daemon: HTTP/WebSocket API, Prometheus metrics and the serve entry point."""

from cuzk_engine.daemon.serve import EngineDaemon, serve

__all__ = ["EngineDaemon", "serve"]
