"""automq-py inside other projects' test suites.

* :class:`AutoMQProcess` (``process.py``): a throwaway broker subprocess on a free loopback
  port, embedded storage in a temporary directory, sized for tests.
* :class:`AutoMQCluster` (``cluster.py``): several of them forming one cluster over a private
  PostgreSQL (:class:`PostgresServer`, ``postgres.py``) and a shared object store directory.
* ``pytest_plugin.py``: the pytest plugin (entry point ``automq_py``) with the
  ``kafka_bootstrap``, ``automq_broker``, ``automq_broker_factory`` and
  ``automq_cluster_factory`` fixtures.

Nothing here imports the broker itself: the broker runs in the child process.
"""

from automq_py.testing.cluster import AutoMQCluster
from automq_py.testing.postgres import PostgresServer
from automq_py.testing.process import TEST_PROPERTIES, AutoMQError, AutoMQProcess

__all__ = ["TEST_PROPERTIES", "AutoMQCluster", "AutoMQError", "AutoMQProcess", "PostgresServer"]
