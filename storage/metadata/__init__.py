"""Stream, object, node and KV metadata with AutoMQ's controller semantics.

``model`` holds the values and error codes, ``records`` the change records, ``image`` the
in-memory state and the object lookup, ``control`` the controller's checks (pure), ``sql`` the
portable schema, ``sqlite_store`` the SQLite backend behind ``store``'s interface, and
``manager`` the async API the storage layer calls.
"""
