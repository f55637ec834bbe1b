"""Podman for the container tests: a local base image, the automq-py image, and podman's
Docker-API service for testcontainers (see ../shared/ENVIRONMENT.md, "Containers: podman").

No registry is reachable on the machines the suite runs on, so the base image is a Debian
bookworm ``debootstrap --variant=minbase`` with python3 and venv, imported once into podman's
storage as ``localhost/automq-base:bookworm``; the image under test is built from the checkout
with ``docker/Dockerfile`` over it (``BASE`` build argument), pip reaching PyPI with the host's
CA bundle as a build secret.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.broker import REPO

BASE_IMAGE = "localhost/automq-base:bookworm"
IMAGE = "localhost/automq-py:test"
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# runc (crun fails on these hosts' hybrid cgroups), rlimits podman may set, no systemd
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class Podman:
    """``podman`` with this suite's containers.conf; ``run`` raises on failure."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.conf = workdir / "containers.conf"
        self.conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        done = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done.stdout

    def logs(self, container: str) -> str:
        """The container's output, stdout and stderr (where the broker logs) together."""
        done = subprocess.run(
            ["podman", "logs", container],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        )
        return done.stdout

    def image_exists(self, image: str) -> bool:
        done = subprocess.run(["podman", "image", "exists", image], env=self.env)
        return done.returncode == 0

    def ensure_base_image(self) -> None:
        """The Debian base (python3, venv, CA certificates), made once per machine."""
        if self.image_exists(BASE_IMAGE):
            return
        rootfs = Path(tempfile.mkdtemp(prefix="automq-rootfs-", dir=self.workdir))
        try:
            subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates",
                    "bookworm",
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                check=True,
                capture_output=True,
                timeout=900,
            )
            for cache in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
                shutil.rmtree(rootfs / cache, ignore_errors=True)
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(
                ["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
                stdin=tar.stdout,
                env=self.env,
                check=True,
                capture_output=True,
                timeout=600,
            )
            assert tar.wait() == 0
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)

    def build_image(self, dockerfile: str = "docker/Dockerfile", tag: str = IMAGE) -> float:
        """Build ``tag`` from ``dockerfile`` of the checkout over the local base; its size in
        MB."""
        self.ensure_base_image()
        self.run(
            "build",
            "--format",
            "docker",
            "--quiet",
            "--file",
            str(REPO / dockerfile),
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            "--secret",
            f"id=hostca,src={HOST_CA}",
            "--tag",
            tag,
            str(REPO),
            timeout=1200,
        )
        self.run("image", "prune", "--force")  # the build stage's intermediate image
        return self.image_size(tag)

    def image_size(self, image: str) -> float:
        """MB."""
        return int(self.run("image", "inspect", image, "--format", "{{.Size}}")) / 1e6

    @contextmanager
    def docker_api(self) -> Iterator[dict[str, str]]:
        """podman's Docker-API service on a private socket; the environment testcontainers
        needs to use it (no Ryuk: its image cannot be pulled here)."""
        socket_path = self.workdir / "podman.sock"
        service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not socket_path.exists():
                if service.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("podman system service did not start")
                time.sleep(0.05)
            yield {
                "DOCKER_HOST": f"unix://{socket_path}",
                "TESTCONTAINERS_RYUK_DISABLED": "true",
                "TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1",
                "TESTCONTAINERS_CONNECTION_MODE": "docker_host",
            }
        finally:
            os.killpg(service.pid, signal.SIGTERM)
            try:
                service.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(service.pid, signal.SIGKILL)
                service.wait()
