#!/bin/sh
# Single-node KRaft broker: clients only on SASL_SSL (PLAIN over TLS), ACLs enforced, deny by default.
# Passwords come from the environment (docker compose reads them from yours).
set -eu
: "${KAFKA_ADMIN_PASSWORD:?}" "${FRESHPLAN_KAFKA_PASSWORD:?}" "${POLICY_KAFKA_PASSWORD:?}" "${IAM_KAFKA_PASSWORD:?}" "${CDC_KAFKA_PASSWORD:?}"
cat > /tmp/server.properties <<PROPS
node.id=1
process.roles=broker,controller
controller.quorum.voters=1@kafka:9093
controller.listener.names=CONTROLLER
# The controller listener is internal to this container's network and never published.
listeners=SASL_SSL://:9094,CONTROLLER://:9093
advertised.listeners=SASL_SSL://kafka:9094
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
  username="admin" password="${KAFKA_ADMIN_PASSWORD}" \
  user_admin="${KAFKA_ADMIN_PASSWORD}" \
  user_freshplan="${FRESHPLAN_KAFKA_PASSWORD}" \
  user_policy-service="${POLICY_KAFKA_PASSWORD}" \
  user_iam="${IAM_KAFKA_PASSWORD}" \
  user_cdc="${CDC_KAFKA_PASSWORD}";
ssl.keystore.type=PEM
ssl.keystore.location=/certs/kafka.pem
ssl.truststore.type=PEM
ssl.truststore.location=/certs/ca.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
# ANONYMOUS is the controller listener's (PLAINTEXT, internal) principal.
super.users=User:admin;User:ANONYMOUS
auto.create.topics.enable=false
num.partitions=4
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.dirs=/var/lib/kafka/data
PROPS
# For the healthcheck: the admin's client settings.
cat > /tmp/admin.properties <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
ssl.truststore.type=PEM
ssl.truststore.location=/certs/ca.pem
PROPS
chmod 600 /tmp/admin.properties
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted -t "$(/opt/kafka/bin/kafka-storage.sh random-uuid)" \
  -c /tmp/server.properties
exec /opt/kafka/bin/kafka-server-start.sh /tmp/server.properties
