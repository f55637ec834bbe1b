"""A client's address as Kafka (Java) writes it: what ACL hosts are matched against."""

from __future__ import annotations

import pytest

from automq_py.network.server import java_host_address


@pytest.mark.parametrize(
    ("peer", "java"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "0:0:0:0:0:0:0:1"),
        ("fe80::1%eth0", "fe80:0:0:0:0:0:0:1%eth0"),
        ("2001:db8::ff00:42:8329", "2001:db8:0:0:0:ff00:42:8329"),
        ("::ffff:10.0.0.7", "10.0.0.7"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_addresses_are_written_as_java_writes_them(peer: str, java: str) -> None:
    assert java_host_address(peer) == java
