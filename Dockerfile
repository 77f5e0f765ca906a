# The image every Sluice process runs from (compose.yaml; scripts/compose-check builds and runs it).
# One image, every role: the command names it (jobmanager, taskmanager, projector, ui, or any
# other `sluice` command); the HEALTHCHECK asks that process (sluice/cli/health.py).
#
# It runs as the user `sluice` (uid 10001) in its home, /home/sluice, which it can write: the
# default --home (.sluice: logs, the TaskManagers' temp files) and Spark's class-data archive
# (~/.cache/sluice, built below, so each container's Spark server starts warm) live there.
# /shared belongs to it too: mount one volume there for inputs, outputs and the storage root
# (SLUICE_STORAGE_ROOT=file:///shared/storage), as compose.yaml does.
FROM python:3.11-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 --user-group sluice \
 && mkdir -p /shared && chown sluice:sluice /shared

# The dependencies first, from pyproject.toml alone: a change to the code does not reinstall them.
WORKDIR /opt/sluice
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY sluice sluice
COPY events events
COPY store store
COPY services services
RUN pip install --no-cache-dir --no-deps . && rm -rf build *.egg-info

USER sluice
WORKDIR /home/sluice
ENV SLUICE_JOBMANAGER_METRICS_PORT=9250 \
    SLUICE_TASKMANAGER_METRICS_PORT=9251 \
    SLUICE_PROJECTOR_METRICS_PORT=9252
# Spark's class-data archive for this Java and PySpark (a Spark server runs a sample job once).
RUN sluice cluster prepare-spark
EXPOSE 9250 9251 9252 8087
HEALTHCHECK --interval=10s --timeout=6s --start-period=60s --retries=3 CMD ["python", "-m", "sluice.cli.health"]
ENTRYPOINT ["sluice"]
CMD ["--help"]
