from django.db import models


class RelayedMetrics(models.Model):
    """One scrape relayed through the database: a fleet controller's own metrics, or the
    engine metrics of a host it watches (read over the controller's tunnel to that engine).

    The dashboard serves every fresh row with its labels added, so Prometheus reaches engines
    behind SSH tunnels through any dashboard process. A row stops being served once it is
    older than a few relay intervals: a host or controller that went away vanishes from
    the scrape instead of repeating its last values.
    """

    class Source(models.TextChoices):
        CONTROLLER = "controller"
        ENGINE = "engine"

    source = models.CharField(max_length=20, choices=Source.choices)
    # The label that names the origin: the controller's name, or the engine's host name.
    origin = models.CharField(max_length=200)
    text = models.TextField(help_text="Prometheus text exposition format")
    fetched_at = models.DateTimeField()

    class Meta:
        constraints = (models.UniqueConstraint(fields=("source", "origin"),
                                               name="unique_relayed_origin"),)

    def __str__(self) -> str:
        return f"{self.source} {self.origin} at {self.fetched_at}"
