# Flightdeck service: the FastAPI control plane and its SQLite database. The [service] extra only:
# no torch. Migrations are applied by `flightdeck serve` itself at start-up.
# Build from the repository root: docker build -f docker/service.Dockerfile -t flightdeck-service .
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid/gid so host directories can be chowned to it (docs/compose.md).
RUN groupadd --system --gid 10001 flightdeck \
    && useradd --system --uid 10001 --gid flightdeck --create-home --home-dir /home/flightdeck \
        --shell /usr/sbin/nologin flightdeck

# The source tree is bind-mounted only for the install, so no copy of it stays in a layer.
RUN --mount=type=bind,target=/src,rw \
    pip install --no-cache-dir "/src[service]" \
    && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch in the service image'"

# The installed package cannot find migrations/ next to itself, so the image says where they are.
COPY migrations /opt/flightdeck/migrations
RUN mkdir -p /var/lib/flightdeck && chown flightdeck:flightdeck /var/lib/flightdeck

ENV FLIGHTDECK_HOST=0.0.0.0 \
    FLIGHTDECK_PORT=8000 \
    FLIGHTDECK_DATA_DIR=/var/lib/flightdeck \
    FLIGHTDECK_MIGRATIONS_DIR=/opt/flightdeck/migrations

USER 10001:10001
WORKDIR /home/flightdeck
VOLUME ["/var/lib/flightdeck"]
EXPOSE 8000

# Python's urllib rather than curl: the slim image has no curl and needs none.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('FLIGHTDECK_PORT', '8000'), timeout=2)"]

ENTRYPOINT ["flightdeck"]
CMD ["serve"]
