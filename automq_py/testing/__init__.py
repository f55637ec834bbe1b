"""automq-py inside other projects' test suites.

* :class:`AutoMQProcess` (``process.py``): a throwaway broker subprocess on a free loopback
  port, embedded storage in a temporary directory, sized for tests.
* ``pytest_plugin.py``: the pytest plugin (entry point ``automq_py``) with the
  ``kafka_bootstrap``, ``automq_broker`` and ``automq_broker_factory`` fixtures.

Nothing here imports the broker itself: the broker runs in the child process.
"""

from automq_py.testing.process import TEST_PROPERTIES, AutoMQError, AutoMQProcess

__all__ = ["TEST_PROPERTIES", "AutoMQError", "AutoMQProcess"]
