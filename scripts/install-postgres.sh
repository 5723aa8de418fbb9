#!/usr/bin/env bash
# Debian's PostgreSQL server for the tests' and benchmarks' throw-away clusters (bench/postgres_cluster.py
# starts one per test session; nothing here starts a server or enables a service).
set -euo pipefail
if command -v pg_ctl >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "install-postgres: run as root or install postgresql yourself"; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
