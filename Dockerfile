# A freshplan worker image for docker-compose; the embedded broker is not used here.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY compiler compiler
COPY state state
COPY agents agents
COPY streams streams
COPY bench bench
COPY scenarios scenarios
RUN pip install --no-cache-dir .
ENV FRESHPLAN_STATE_DIR=/var/lib/freshplan FRESHPLAN_WEB_HOST=0.0.0.0
EXPOSE 6066
ENTRYPOINT ["freshplan", "run"]
