# The image every Sluice process runs from (see compose.yaml).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sluice sluice
COPY events events
COPY store store
COPY services services
RUN pip install --no-cache-dir .
RUN useradd --create-home sluice
USER sluice
ENTRYPOINT ["sluice"]
