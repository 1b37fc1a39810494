# tpuctl in a container, with the locked versions (uv.lock) as scripts/setup installs them (uv pinned as
# there), not editable, without the test tools; run as a non-root user. The install steps are
# scripts/image-install, which a test runs too (there is no Docker engine where tpuctl is tested).
#
# The image runs the team server as well as the CLI: `docker run IMAGE server --listen 0.0.0.0:8471`
# (with the workspace file that turns authentication on), or deploy/tpuctl-server.yaml on Kubernetes.
FROM python:3.11-slim
WORKDIR /opt/tpuctl
COPY pyproject.toml uv.lock README.md ./
COPY tpuctl ./tpuctl
COPY scripts/image-install /usr/local/bin/tpuctl-image-install
# uv sync makes /opt/tpuctl/.venv from the image's python; uv itself is not kept, nor its cache.
RUN UV_NO_CACHE=1 tpuctl-image-install /opt/tpuctl \
 && rm /usr/local/bin/tpuctl-image-install \
 && useradd --create-home --uid 10001 tpuctl
ENV PATH=/opt/tpuctl/.venv/bin:$PATH
USER tpuctl
ENV XDG_STATE_HOME=/home/tpuctl/.local/state
EXPOSE 8471
ENTRYPOINT ["tpuctl"]
CMD ["--help"]
