"""PostgreSQL for the cluster-metadata tests: the pytest plugin's throwaway server
(:mod:`automq_py.testing.postgres`), with a database name made up when none is given."""

from __future__ import annotations

import uuid

from automq_py.testing import postgres


class PostgresServer(postgres.PostgresServer):
    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its ``postgresql://`` URL."""
        return super().create_database(name or f"meta_{uuid.uuid4().hex[:12]}")
