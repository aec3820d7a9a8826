#!/bin/sh
# Register the connector with Kafka Connect once its REST API answers (the compose file's connect-init service);
# 409 means it is registered already.
set -eu
until curl -sf http://connect:8083/connectors >/dev/null; do sleep 2; done
code=$(curl -s -o /dev/stderr -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
  --data @/deploy/postgres-connector.json http://connect:8083/connectors)
[ "$code" = 201 ] || [ "$code" = 409 ]
