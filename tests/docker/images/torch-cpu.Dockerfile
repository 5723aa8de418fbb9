# Stand-in for the worker's CUDA PyTorch base (BASE_IMAGE): the same Python base plus the host's CPU torch
# wheel, so the build downloads no CUDA torch. Its other requirements come from the package registry.
ARG BASE
FROM ${BASE}
ARG TORCH_WHEEL
COPY wheels/ /tmp/wheels/
RUN pip install --no-cache-dir --find-links /tmp/wheels "/tmp/wheels/${TORCH_WHEEL}" \
    && rm -rf /tmp/wheels \
    && python -c "import torch; assert not torch.cuda.is_available()"
