"""automq-py: a Kafka-compatible broker whose storage is S3Stream (see ``storage``)."""
