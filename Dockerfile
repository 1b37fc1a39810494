# tpuctl in a container, with the locked versions (uv.lock) as scripts/setup installs them (uv pinned as
# there), not editable, without the test tools; run as a non-root user.
FROM python:3.11-slim
WORKDIR /opt/tpuctl
COPY pyproject.toml uv.lock README.md ./
COPY tpuctl ./tpuctl
# uv sync makes /opt/tpuctl/.venv from the image's python; uv itself is not kept.
RUN python -m pip install --no-cache-dir uv==0.13.9 \
 && UV_PYTHON_DOWNLOADS=never uv sync --locked --no-editable --compile-bytecode --no-cache --no-progress \
    --quiet \
 && python -m pip uninstall --yes --quiet uv \
 && useradd --create-home --uid 10001 tpuctl
ENV PATH=/opt/tpuctl/.venv/bin:$PATH
USER tpuctl
ENV XDG_STATE_HOME=/home/tpuctl/.local/state
ENTRYPOINT ["tpuctl"]
CMD ["--help"]
