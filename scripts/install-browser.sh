#!/usr/bin/env bash
# Debian's chromium for the dashboard's browser tests (playwright cannot download browsers here).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "install-browser: run as root or install chromium yourself"; exit 1; fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
