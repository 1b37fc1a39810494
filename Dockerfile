# tpuctl in a container, with the locked versions (uv.lock) as scripts/setup installs them (uv pinned as
# there), not editable, without the test tools; run as a non-root user.
FROM python:3.11-slim
WORKDIR /opt/tpuctl
COPY pyproject.toml uv.lock README.md ./
COPY tpuctl ./tpuctl
# The image's interpreter is the environment (UV_PROJECT_ENVIRONMENT); --inexact keeps pip and uv there
# until uv is uninstalled.
RUN python -m pip install --no-cache-dir uv==0.13.9 \
 && UV_PROJECT_ENVIRONMENT=/usr/local UV_PYTHON_DOWNLOADS=never \
    uv sync --locked --inexact --no-editable --compile-bytecode --no-cache --no-progress --quiet \
 && python -m pip uninstall --yes --quiet uv \
 && useradd --create-home --uid 10001 tpuctl
USER tpuctl
ENV XDG_STATE_HOME=/home/tpuctl/.local/state
ENTRYPOINT ["tpuctl"]
CMD ["--help"]
