"""PySpark jobs over the stream store: compaction, retention, object GC."""
