# tpuctl in a container, installed the same way as scripts/setup does, run as a non-root user.
FROM python:3.11-slim
WORKDIR /opt/tpuctl
COPY pyproject.toml README.md ./
COPY tpuctl ./tpuctl
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip install --no-cache-dir . \
 && useradd --create-home --uid 10001 tpuctl
USER tpuctl
ENV XDG_STATE_HOME=/home/tpuctl/.local/state
ENTRYPOINT ["tpuctl"]
CMD ["--help"]
