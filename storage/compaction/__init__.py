"""Compaction, retention and garbage collection of objects (DESIGN section 6).

Pure planners (``analyzer`` for Stream Set Objects, ``stream_objects`` for Stream Objects,
``gc`` for what may leave the bucket) beside ``units``, the plain functions that carry out one
planned unit against object storage. Jobs (``spark_jobs``) hand units to executors and commit
the results through the broker's controller.
"""
