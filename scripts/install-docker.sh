#!/usr/bin/env bash
# What the `docker` tests (tests/docker) need, as root: a Docker engine, Compose v2 with Buildx, slirp4netns
# for the engine's own network namespace, and debootstrap for base images built from Debian's packages
# (no image registry is reachable here). Starts nothing; the tests start and stop their own engine.
# Idempotent: a second run installs nothing.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "install-docker: run as root"; exit 1; fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io containerd runc)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Debian 12's docker-compose is v1 (no `depends_on.required`, no `up --wait`); Debian 13's packages of
# Compose v2 and Buildx are Go binaries that need only libc >= 2.34, so they install here from Debian 13.
plugins=/usr/libexec/docker/cli-plugins
if [ ! -x "$plugins/docker-compose" ] || [ ! -x "$plugins/docker-buildx" ]; then
    trixie=/etc/apt/sources.list.d/flightdeck-debian13.sources
    # The Debian 12 entry's mirror, for the Debian 13 suite; only the two packages are taken from it.
    mirror=$(grep -h -m1 -E '^URIs: .*/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}')
    mirror=${mirror:-http://deb.debian.org/debian}
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$mirror" >"$trixie"
    trap 'rm -f "$trixie"; apt-get update -qq || true' EXIT
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker-compose/trixie docker-buildx/trixie >/dev/null
fi
docker compose version >/dev/null
docker buildx version >/dev/null
