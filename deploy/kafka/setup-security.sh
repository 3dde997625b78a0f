#!/usr/bin/env bash
# One-shot setup for Apache Kafka: SCRAM users, least-privilege ACLs and the market's topics.
# Run by the kafka-init service of docker-compose.yml against the broker's internal listener.
#
# Principals:
#   market-worker  reads the input topics, owns its consumer group and Faust's internal topics,
#                  writes the catalog, the dead-letter topic and every buyer topic
#   seller         writes registrations and values, reads the catalog
#   <buyer>        one principal per buyer: writes purchases, reads the catalog and ONLY its own
#                  topic <prefix>.buyer.<buyer>
set -euo pipefail
: "${BOOTSTRAP:?}" "${PREFIX:?}" "${PARTITIONS:?}" "${APP_ID:?}" "${WORKER_PASSWORD:?}" "${SELLER_PASSWORD:?}"
BIN=/opt/kafka/bin
B=(--bootstrap-server "$BOOTSTRAP")

scram() {  # user password
  "$BIN/kafka-configs.sh" "${B[@]}" --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$2]"
}
acl() { "$BIN/kafka-acls.sh" "${B[@]}" --add --force "$@"; }
topic() {  # name partitions config...
  local name=$1 parts=$2; shift 2
  "$BIN/kafka-topics.sh" "${B[@]}" --create --if-not-exists --topic "$name" \
    --partitions "$parts" --replication-factor 1 "$@"
}

DAY=86400000
topic "$PREFIX.registrations" "$PARTITIONS" --config retention.ms=$((7 * DAY))
topic "$PREFIX.values" "$PARTITIONS" --config retention.ms=$((7 * DAY))
topic "$PREFIX.purchases" "$PARTITIONS" --config retention.ms=$((30 * DAY))
topic "$PREFIX.catalog" 1 --config cleanup.policy=compact
topic "$PREFIX.rejections" 1 --config retention.ms=$((30 * DAY))

scram market-worker "$WORKER_PASSWORD"
W=(--allow-principal User:market-worker)
acl "${W[@]}" --operation Read --operation Describe --topic "$PREFIX.registrations"
acl "${W[@]}" --operation Read --operation Describe --topic "$PREFIX.values"
acl "${W[@]}" --operation Read --operation Describe --topic "$PREFIX.purchases"
acl "${W[@]}" --operation Write --operation Describe --topic "$PREFIX.catalog"
acl "${W[@]}" --operation Write --operation Describe --topic "$PREFIX.rejections"
acl "${W[@]}" --operation All --resource-pattern-type prefixed --topic "$PREFIX.buyer."
acl "${W[@]}" --operation All --resource-pattern-type prefixed --topic "$APP_ID-"
acl "${W[@]}" --operation All --resource-pattern-type prefixed --group "$APP_ID"
acl "${W[@]}" --operation Describe --operation IdempotentWrite --cluster

scram seller "$SELLER_PASSWORD"
S=(--allow-principal User:seller)
acl "${S[@]}" --operation Write --operation Describe --topic "$PREFIX.registrations"
acl "${S[@]}" --operation Write --operation Describe --topic "$PREFIX.values"
acl "${S[@]}" --operation Read --operation Describe --topic "$PREFIX.catalog"

IFS=',' read -ra PAIRS <<< "${BUYERS:-}"
for pair in "${PAIRS[@]}"; do
  [ -n "$pair" ] || continue
  buyer=${pair%%:*}; password=${pair#*:}
  scram "$buyer" "$password"
  topic "$PREFIX.buyer.$buyer" 1 --config retention.ms=$((365 * DAY))
  U=(--allow-principal "User:$buyer")
  acl "${U[@]}" --operation Write --operation Describe --topic "$PREFIX.purchases"
  acl "${U[@]}" --operation Read --operation Describe --topic "$PREFIX.catalog"
  acl "${U[@]}" --operation Read --operation Describe --topic "$PREFIX.buyer.$buyer"
done
echo "kafka security and topics ready"
