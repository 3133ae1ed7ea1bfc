"""Prometheus metrics of the fleet: computed from the database at scrape time, so every
dashboard process answers the same; the controller's own timings and the engines' metrics are
relayed through the database by the controller that holds each host (see docs/deployment.md, "Operations")."""
