"""ElasticLog: a Kafka partition as a MetaStream plus data streams (DESIGN.md section 4).

* ``meta_stream_record`` - the MetaStream key-value record format, leader epoch checkpoint
* ``elastic_log_meta`` - the ``LOG`` / ``PARTITION`` JSON values (AutoMQ-compatible)
* ``meta_stream`` - key-value replay, writes and compaction over the MetaStream
* ``time_index`` - the 12-byte time index entries in the ``tim`` stream, Kafka's indexing rule
* ``leader_epoch_cache`` - leader epoch -> start offset, as plain data
* ``log_config`` - the topic properties a log uses
* ``elastic_log_segment`` - one segment: offset mapping, append, read, scan, recovery
* ``elastic_log`` - the partition log: append, roll, truncate, read, timestamps, close
* ``log_loader`` - opening a log (the MetaStream found or created, recovery, producer state),
  and destroying a deleted topic's
"""
