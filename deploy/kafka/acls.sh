#!/bin/sh
# Topics and ACLs of the compose example (run once by the `acls` service, as the admin user).
# Only the policy service writes policy-versions, only IAM writes revocations, only CDC writes
# source-changes; freshplan reads the inputs, writes its outputs and the clock.
set -eu
: "${KAFKA_ADMIN_PASSWORD:?}" "${PARTITIONS:=4}"
cat > /tmp/admin.properties <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
ssl.truststore.type=PEM
ssl.truststore.location=/certs/ca.pem
PROPS
BS="--bootstrap-server kafka:9094 --command-config /tmp/admin.properties"
bin=/opt/kafka/bin
for t in source-changes policy-versions revocations clock plan-invalidations receipts dead-letters; do
  $bin/kafka-topics.sh $BS --create --if-not-exists --topic "$t" --partitions "$PARTITIONS" --replication-factor 1
done
for t in plans plan-dependencies; do
  $bin/kafka-topics.sh $BS --create --if-not-exists --topic "$t" --partitions "$PARTITIONS" --replication-factor 1 \
    --config cleanup.policy=compact
done
# The routed lanes are each shard's history: a gained shard is restored from them, so they are kept.
for t in entity-changes shared-changes; do
  $bin/kafka-topics.sh $BS --create --if-not-exists --topic "$t" --partitions "$PARTITIONS" --replication-factor 1 \
    --config retention.ms=-1
done
# Producers of the inputs: one writer per topic.
$bin/kafka-acls.sh $BS --add --allow-principal User:policy-service --operation Write --operation Describe --topic policy-versions
$bin/kafka-acls.sh $BS --add --allow-principal User:iam --operation Write --operation Describe --topic revocations
$bin/kafka-acls.sh $BS --add --allow-principal User:cdc --operation Write --operation Describe --topic source-changes
# Kafka Connect (Debezium) keeps its configs, offsets and status in topics of its own, as the cdc user.
$bin/kafka-acls.sh $BS --add --allow-principal User:cdc --operation All --resource-pattern-type prefixed --topic connect-
$bin/kafka-acls.sh $BS --add --allow-principal User:cdc --operation All --resource-pattern-type prefixed --group connect-
# freshplan: read every input and the internal topics (`plan-dependencies` for take-overs, the routed
# lanes), write its outputs, clock ticks and lanes, its consumer group, and Faust's internal topics
# (prefix = the app id).
for t in source-changes policy-versions revocations clock plans plan-dependencies entity-changes shared-changes; do
  $bin/kafka-acls.sh $BS --add --allow-principal User:freshplan --operation Read --operation Describe --topic "$t"
done
for t in clock plan-invalidations plans plan-dependencies entity-changes shared-changes receipts dead-letters; do
  $bin/kafka-acls.sh $BS --add --allow-principal User:freshplan --operation Write --operation Describe --topic "$t"
done
$bin/kafka-acls.sh $BS --add --allow-principal User:freshplan --operation All --resource-pattern-type prefixed \
  --topic freshplan-
$bin/kafka-acls.sh $BS --add --allow-principal User:freshplan --operation Read --operation Describe \
  --resource-pattern-type prefixed --group freshplan
$bin/kafka-acls.sh $BS --add --allow-principal User:freshplan --operation Describe --cluster
$bin/kafka-acls.sh $BS --list
