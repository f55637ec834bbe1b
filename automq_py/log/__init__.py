"""ElasticLog: a Kafka partition as a MetaStream plus data streams."""
