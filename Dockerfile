# One image for the dstream operator, the drivers and Spark's executors.
#
#   docker build -t dstream:0.1.0 .     (the version in pyproject.toml: e2e/image/tag.sh)
#
# Debian bookworm's own python3 (3.11) and OpenJDK 17; the project and pyspark in a venv.
# BASE lets an offline build start from a locally made bookworm image, and PIP_INDEX_URL point
# pip at a local mirror.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ARG PIP_INDEX_URL=https://pypi.org/simple
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    PYTHONPATH=/opt/dstream/examples

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Versions come from the bookworm snapshot the base image was made from. The slim image has no
# /usr/share/man/man1, where openjdk's postinst puts update-alternatives links (fails without it).
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv openjdk-17-jre-headless tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 185 spark \
    && useradd --uid 185 --gid 185 --home-dir /opt/dstream --shell /usr/sbin/nologin spark \
    && python3 -m venv /opt/venv

# Dependencies first: this layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt "setuptools>=70.1" \
    && rm /tmp/requirements.txt

# Where Java lives, so that an executor's entrypoint need not start a JVM to ask
# (`java -XshowSettings:properties`) before it starts the executor's.
RUN ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java
ENV JAVA_HOME=/opt/java

# The project itself: the engine, the API and the operator.
COPY README.md* /src/
COPY driver /src/driver
COPY api /src/api
COPY operator /src/operator
RUN pip install --no-deps --no-build-isolation /src \
    && install -m 0755 /src/operator/image/entrypoint.sh /usr/local/bin/dstream-entrypoint \
    && rm -rf /src

# Spark's classes, parsed and verified, which the driver's and the executors' JVMs map instead
# of loading them again at every start (dstream/service/jvm_archive.py; made again whenever the
# project changes, since it comes from a run of the project's own code).
RUN SPARK_LOCAL_IP=127.0.0.1 python -m dstream.service.jvm_archive \
    && rm -rf /tmp/*

# Example job modules (`module: jobs.<name>:build`), importable by drivers and executors.
COPY --chown=185:185 examples /opt/dstream/examples

WORKDIR /opt/dstream
USER 185
EXPOSE 8000 7078 7079 8080 8081

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/dstream-entrypoint"]
CMD ["dstream", "--help"]
