"""Benchmarks: the pipeline under continuous load, and the StatusTracker's snapshot cost."""
