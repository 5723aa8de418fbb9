"""Base images built from Debian's packages, tagged with the names the project's files pull.

No image registry is reachable here, so `python:...-slim-bookworm`, the worker's CUDA PyTorch base and
`postgres:15-bookworm` are stand-ins: a debootstrap root (cached as a tarball between runs), the host's
CPU torch wheel on top of it, and Debian's PostgreSQL 15. The project's own Dockerfiles then build on
them unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.docker.engine import DockerEngine

IMAGES_DIR = Path(__file__).resolve().parent / "images"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ["python3", "python3-venv", "python3-pip", "ca-certificates"]
RAW_DEBIAN_IMAGE = "flightdeck-test/debian-raw:bookworm"
TORCH_BASE_IMAGE = "flightdeck-test/torch-cpu:latest"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")


def cache_dir() -> Path:
    """Where the debootstrap tarball is kept between runs (outside the repository)."""
    configured = os.environ.get("FLIGHTDECK_TEST_CACHE")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "flightdeck-test" if xdg else Path("/var/cache/flightdeck-test")


def apt_mirror() -> str:
    """The Debian mirror this host's apt uses, so debootstrap reaches the same registry."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        match = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", sources.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return "http://deb.debian.org/debian"


def debian_tarball() -> Path:
    """A minbase Debian root with Python, as a tar file; made once (about 150 s), then read from the cache."""
    key = hashlib.sha256(" ".join([DEBIAN_SUITE, *DEBIAN_PACKAGES]).encode()).hexdigest()[:12]
    tarball = cache_dir() / f"debootstrap-{DEBIAN_SUITE}-{key}.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tarball.parent) as work:
        rootfs = Path(work) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                apt_mirror(),
            ],
            check=True,
            capture_output=True,
        )
        # No apt lists or .debs in the image: the Dockerfiles run apt-get update themselves.
        for package in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            package.unlink()
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    return tarball


def from_image(dockerfile: Path, stage: int = 0) -> str:
    """The image a Dockerfile's FROM line names (its ARG default when it names an ARG)."""
    text = dockerfile.read_text()
    names = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    name = names[stage]
    argument = re.fullmatch(r"\$\{?(\w+)\}?", name)
    if argument:
        default = re.search(rf"^ARG\s+{argument.group(1)}=(\S+)", text, re.MULTILINE)
        assert default, f"{dockerfile}: FROM {name} has no default"
        return default.group(1)
    return name


def host_torch_wheel() -> Path:
    """The CPU torch wheel in the directory pip's configuration names (find-links)."""
    configured = subprocess.run(
        ["pip", "config", "get", "global.find-links"], capture_output=True, text=True
    ).stdout.strip()
    for directory in [configured, os.environ.get("PIP_FIND_LINKS", ""), "/opt/wheels"]:
        if directory:
            wheels = sorted(Path(directory).glob("torch-*+cpu-cp311-*.whl"))
            if wheels:
                return wheels[-1]
    raise FileNotFoundError("no CPU torch wheel for Python 3.11 in pip's find-links directory")


def _build(engine: DockerEngine, dockerfile: str, tag: str, context: Path, **build_args: str) -> None:
    shutil.copy(IMAGES_DIR / dockerfile, context / "Dockerfile")
    arguments = [item for name, value in build_args.items() for item in ("--build-arg", f"{name}={value}")]
    engine.docker("build", "-t", tag, *arguments, str(context), timeout=900).check()


def build_python_base(engine: DockerEngine, tag: str) -> None:
    """The imported Debian root plus the host's CA certificates, `python` and `pip`, tagged `tag`."""
    with debian_tarball().open("rb") as tar:
        imported = subprocess.run(
            ["docker", "import", "-", RAW_DEBIAN_IMAGE],
            stdin=tar,
            env=engine.environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert imported.returncode == 0, imported.stderr
    with tempfile.TemporaryDirectory() as context:
        certificates = Path(context) / "ca-certificates"
        certificates.mkdir()
        for certificate in HOST_CA_DIR.glob("*.crt"):
            shutil.copy(certificate, certificates)
        _build(engine, "debian-python.Dockerfile", tag, Path(context), BASE=RAW_DEBIAN_IMAGE)


def build_torch_base(engine: DockerEngine, python_base: str) -> str:
    """The worker's base: `python_base` plus the host's CPU torch wheel."""
    wheel = host_torch_wheel()
    with tempfile.TemporaryDirectory() as context:
        wheels = Path(context) / "wheels"
        wheels.mkdir()
        # A hard link where the filesystem allows: the wheel is 180 MB.
        try:
            os.link(wheel, wheels / wheel.name)
        except OSError:
            shutil.copy(wheel, wheels / wheel.name)
        _build(
            engine,
            "torch-cpu.Dockerfile",
            TORCH_BASE_IMAGE,
            Path(context),
            BASE=python_base,
            TORCH_WHEEL=wheel.name,
        )
    return TORCH_BASE_IMAGE


def build_postgres(engine: DockerEngine, python_base: str, tag: str) -> None:
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(IMAGES_DIR / "postgres-entrypoint.sh", Path(context) / "postgres-entrypoint.sh")
        _build(engine, "postgres.Dockerfile", tag, Path(context), BASE=python_base)
