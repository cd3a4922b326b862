# The tidegate image: every tidegate service of docker-compose.yml (init, schemas, registry, gateway,
# worker, controller) and of deploy/k8s runs one `tidegate` command from it. The local stack without
# Docker is infra/stack.sh.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# The whole checkout (less .dockerignore): the packages and constraints.txt.
COPY . .
# - A non-editable install of every part, at constraints.txt's exact versions; the migrations are
#   package data (tidegate.core.migrations), so the controller finds them in site-packages.
# - uid and gid 10001, as deploy/k8s's securityContext says.
# - /app/var (the model store, var/models, and packages, var/packages) exists and belongs to that
#   user, so the named volume docker-compose.yml mounts there starts out owned by it, not by root.
RUN pip install -c constraints.txt ".[all]" \
    && groupadd --system --gid 10001 tidegate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin tidegate \
    && mkdir -p /app/var/models /app/var/packages \
    && chown -R 10001:10001 /app/var

# gateway (V2 HTTP, /metrics), registry, worker and controller /metrics.
EXPOSE 8080 8081 9100

# Nothing here needs root.
USER 10001:10001
ENTRYPOINT ["tidegate"]
CMD ["--help"]
