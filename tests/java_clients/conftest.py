"""The real broker process fixture, shared with tests/automq_py."""

from tests.automq_py.conftest import make_broker

__all__ = ["make_broker"]
