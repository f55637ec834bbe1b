"""S3Stream: a stream store over a write-ahead log, an in-memory LogCache and object storage.

The layout follows AutoMQ's s3stream: ``stream_record_batch`` and ``object_format`` define the
byte formats; ``object_writer``/``object_reader`` build and read objects; ``operator`` holds the
object stores; ``metadata`` the stream/object/node metadata; ``wal`` the write-ahead log;
``log_cache`` and ``s3_storage`` the write path, ``uploader`` its uploads (``upload`` plans a
block's objects, ``upload_worker`` is the process that builds and writes them from the WAL
file); ``stream_reader`` (read-ahead across objects) and ``block_cache`` the cold read path;
``stream`` the Stream API; ``config`` the store's settings, read by ``config_def``: the one
property parser, which the broker's and the topics' configurations use too.
"""
