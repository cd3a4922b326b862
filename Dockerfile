# The tidegate image: every service of docker-compose.yml (registry, gateway, worker, init) runs
# one `tidegate` command from it. The local stack without Docker is infra/stack.sh.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# The whole checkout (less .dockerignore): the packages, plus infra/migrations for the init service.
COPY . .
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /app tidegate

# Nothing here needs root.
USER tidegate
ENTRYPOINT ["tidegate"]
CMD ["--help"]
