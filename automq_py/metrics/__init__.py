"""What the broker tells Prometheus, and its health probes.

* :mod:`.window`: the latest samples of a latency, kept in a flat ring for quantiles.
* :mod:`.topic_stats`: Kafka's BrokerTopicMetrics, counted on the produce and fetch paths.
* :mod:`.consumer_lag`: each group's lag per partition, from committed offsets and high
  watermarks (kafka-exporter's ``kafka_consumergroup_lag``).
* :mod:`.collector`: the metric families, built from the broker's parts when scraped.
* :mod:`.http`: ``/metrics``, ``/healthz`` and ``/readyz`` on ``metrics.port``, served from a
  thread so that a busy event loop (WAL recovery) still answers the probes.

The hot paths only add to plain numbers; everything Prometheus sees is built at scrape time.
"""
