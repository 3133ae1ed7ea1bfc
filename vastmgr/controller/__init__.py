"""The fleet controller: one long-running process that watches every engine, pushes rendered
fragments to the dashboards, dispatches queued proof jobs and keeps the host history."""
