"""The automq-py image, built from the checkout with podman, and podman's Docker API for
testcontainers: once per session (the build takes ~30 s, the base image ~1 min once a machine)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.podman import BASE_IMAGE, IMAGE, Podman


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def automq_image(podman: Podman) -> str:
    size_mb = podman.build_image()
    base_mb = podman.image_size(BASE_IMAGE)
    print(f"\nimage {IMAGE}: {size_mb:.0f} MB ({size_mb - base_mb:.0f} MB over its base)")
    return IMAGE


@pytest.fixture(scope="session")
def docker_api(podman: Podman, automq_image: str) -> Iterator[None]:
    """testcontainers pointed at podman's Docker-API socket for the session."""
    from testcontainers.core.config import ConnectionMode, testcontainers_config

    saved = (
        os.environ.get("DOCKER_HOST"),
        testcontainers_config.ryuk_disabled,
        testcontainers_config.tc_host_override,
        testcontainers_config.connection_mode_override,
    )
    with podman.docker_api() as env:
        os.environ["DOCKER_HOST"] = env["DOCKER_HOST"]
        testcontainers_config.ryuk_disabled = True  # Ryuk's image cannot be pulled here
        testcontainers_config.tc_host_override = env["TESTCONTAINERS_HOST_OVERRIDE"]
        testcontainers_config.connection_mode_override = ConnectionMode.docker_host
        try:
            yield
        finally:
            if saved[0] is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = saved[0]
            (
                testcontainers_config.ryuk_disabled,
                testcontainers_config.tc_host_override,
                testcontainers_config.connection_mode_override,
            ) = saved[1:]
