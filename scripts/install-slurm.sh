#!/usr/bin/env bash
# Debian's Slurm and munge for the tests' throw-away two-node cluster (tests/slurm/cluster.py starts
# one per test session inside network namespaces; nothing here starts a daemon or enables a service).
set -euo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "install-slurm: run as root or install slurmctld slurmd slurm-client munge yourself"; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null
# The packages may start their daemons under systemd-less hosts' init scripts; the tests run their own.
