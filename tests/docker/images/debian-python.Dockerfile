# Stand-in for python:<version>-slim-bookworm, from the debootstrap root imported as BASE (no registry here):
# Debian 12's python3 with pip and venv, `python` and `pip` on PATH as in the official image.
ARG BASE
FROM ${BASE}
# The host's extra CA certificates (an egress proxy's), so pip and apt in later builds trust what the host does.
COPY ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null \
    && mkdir -p /var/cache/apt/archives/partial \
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
    && ln -s /usr/bin/python3 /usr/local/bin/python \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip \
    && printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\ndefault-timeout = 180\n' > /etc/pip.conf
ENV LANG=C.UTF-8 PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin
CMD ["python3"]
