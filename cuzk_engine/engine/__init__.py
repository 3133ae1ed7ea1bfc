"""The proving engine: orchestrator, synthesis pool, device workers and finalizers."""
