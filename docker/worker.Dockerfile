# Flightdeck worker agent on a CUDA PyTorch image: `flightdeck worker` pulls jobs and runs torchrun.
# The base image's torch is kept as it is; only the rest of the [worker] extra is installed.
# Build from the repository root: docker build -f docker/worker.Dockerfile -t flightdeck-worker .
# For a driver older than CUDA 12.8 needs (R570): --build-arg BASE_IMAGE=<a cuda12.x tag>.
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The same fixed uid/gid as the service image, so host directories can be chowned to it.
RUN groupadd --system --gid 10001 flightdeck \
    && useradd --system --uid 10001 --gid flightdeck --create-home --home-dir /home/flightdeck \
        --shell /usr/sbin/nologin flightdeck

# A constraint pinning the installed torch makes pip resolve the extra around it, and fail the build
# rather than download a second (CUDA) torch. The source is bind-mounted only for the install.
RUN --mount=type=bind,target=/src,rw \
    mkdir -p /opt/flightdeck \
    && python -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
        > /opt/flightdeck/torch-constraint.txt \
    && pip install --no-cache-dir --constraint /opt/flightdeck/torch-constraint.txt "/src[worker]" \
    && python -c "import accelerate, peft, transformers, flightdeck.worker.agent, flightdeck.worker.train"

# Mount points of the named volumes: a fresh volume takes the owner of the directory it covers.
RUN mkdir -p /workspace/models /workspace/data /workspace/runs /home/flightdeck/.cache/huggingface \
    && chown -R flightdeck:flightdeck /workspace /home/flightdeck/.cache

ENV FLIGHTDECK_WORKSPACE=/workspace \
    HF_HOME=/home/flightdeck/.cache/huggingface

USER 10001:10001
WORKDIR /workspace

ENTRYPOINT ["flightdeck"]
CMD ["worker"]
