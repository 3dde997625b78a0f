#!/usr/bin/env bash
# One-shot setup for Apache Kafka: SCRAM users, least-privilege ACLs and the market's topics.
# Run by the kafka-init service of docker-compose.yml against the broker's INTERNAL listener,
# authenticated as the `admin` super user (SASL/PLAIN; no anonymous access anywhere).
#
# Principals (Kafka ACLs are the second layer: every event is also signed by its account's key,
# and the market checks the signature whoever wrote it):
#   market-worker  reads the input topics (and writes them: a signed event a producer put on
#                  another partition than its id's is moved to its own), is the only principal
#                  with any ACL on its consumer group "$APP_ID" and on the workers' own topics
#                  "$APP_ID-*" (Faust's changelogs and assignor topic, the progress changelog),
#                  writes the catalog, rejections, refusals, dead letters, its identity record
#                  and every inbox (v1: it creates them when accounts are opened; v2: the one
#                  partitioned <prefix>.inbox, made here)
#   operator       reads the rejections and dead letters (`epsilon-market rejections`)
#   <seller>       one principal per seller: writes accounts, registrations and values, reads the
#                  catalog, the market's identity and refusals (public, signed: the clients
#                  read the market's key and why an event was refused there) and ONLY its own
#                  inbox <prefix>.inbox.<seller> (v2: the shared <prefix>.inbox, whose records
#                  are keyed by pseudonyms and sealed to their accounts, docs/protocol.md §8.5.6)
#   <buyer>        one principal per buyer: writes accounts and purchases, reads the catalog and
#                  the identity and refusals, and ONLY its own inbox <prefix>.inbox.<buyer> (v2:
#                  the shared <prefix>.inbox)
# INBOXES (v1 | v2, default v1) must be the workers' EMARKET_INBOXES, INBOX_PARTITIONS their
# EMARKET_INBOX_PARTITIONS: the market's identity records the layout its first worker made.
# The SASL user name of a party is its account id.
set -euo pipefail
: "${BOOTSTRAP:?}" "${PREFIX:?}" "${PARTITIONS:?}" "${APP_ID:?}" "${ADMIN_PASSWORD:?}"
: "${WORKER_PASSWORD:?}" "${OPERATOR_PASSWORD:?}"
BIN=/opt/kafka/bin

# Party names are SASL principals: refuse the market's own principals (a buyer called `admin`
# would be Kafka's super user; one called `market-worker` would take the worker's password),
# malformed ids, and an id listed twice with different passwords (the second would silently
# replace the first). An id both selling and buying is listed in both with the same password.
declare -A SEEN=()
check_parties() {  # "id:password,..."
  local pair name pw
  IFS=',' read -ra pairs <<< "${1:-}"
  for pair in "${pairs[@]}"; do
    [ -n "$pair" ] || continue
    name=${pair%%:*} pw=${pair#*:}
    if ! [[ $name =~ ^[A-Za-z0-9_-]{1,64}$ ]] || [ "$pair" = "$name" ] || [ -z "$pw" ]; then
      echo "refused: '$name' is not id:password with an account id of 1-64 [A-Za-z0-9_-]" >&2
      exit 2
    fi
    case "$name" in admin|market-worker|operator)
      echo "refused: '$name' is one of the market's own principals; choose another account id" >&2
      exit 2 ;;
    esac
    if [ -n "${SEEN[$name]+set}" ] && [ "${SEEN[$name]}" != "$pw" ]; then
      echo "refused: '$name' is listed twice with different passwords" >&2
      exit 2
    fi
    SEEN[$name]=$pw
  done
}
case "${INBOXES:=v1}" in v1|v2) ;; *)
  echo "refused: INBOXES '$INBOXES' is neither v1 nor v2 (EMARKET_INBOXES)" >&2; exit 2 ;;
esac
check_parties "${SELLERS:-}"
check_parties "${BUYERS:-}"
# The workers' own topics ("$APP_ID-...") and the market's ("$PREFIX....", a party's inbox among
# them) must not share names: a party's inbox grant would otherwise reach the workers' state.
case "$APP_ID-" in "$PREFIX".*)
  echo "refused: APP_ID '$APP_ID' names topics inside the market's prefix '$PREFIX.'" >&2; exit 2 ;;
esac
case "$PREFIX." in "$APP_ID"-*)
  echo "refused: PREFIX '$PREFIX' names topics inside the workers' own '$APP_ID-'" >&2; exit 2 ;;
esac
CONF=$(mktemp)
trap 'rm -f "$CONF"' EXIT
cat > "$CONF" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$ADMIN_PASSWORD";
PROPS
B=(--bootstrap-server "$BOOTSTRAP" --command-config "$CONF")

scram() {  # user password
  "$BIN/kafka-configs.sh" "${B[@]}" --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$2]"
}
acl() { "$BIN/kafka-acls.sh" "${B[@]}" --add --force "$@"; }
topic() {  # name partitions config...
  local name=$1 parts=$2; shift 2
  "$BIN/kafka-topics.sh" "${B[@]}" --create --if-not-exists --topic "$name" \
    --partitions "$parts" --replication-factor "${REPLICATION:-1}" "$@"
}

DAY=86400000
topic "$PREFIX.accounts" "$PARTITIONS" --config retention.ms=$((30 * DAY))
topic "$PREFIX.registrations" "$PARTITIONS" --config retention.ms=$((7 * DAY))
topic "$PREFIX.values" "$PARTITIONS" --config retention.ms=$((7 * DAY))
topic "$PREFIX.purchases" "$PARTITIONS" --config retention.ms=$((30 * DAY))
topic "$PREFIX.catalog" 1 --config cleanup.policy=compact
topic "$PREFIX.rejections" 1 --config retention.ms=$((30 * DAY))
topic "$PREFIX.deadletters" 1 --config retention.ms=$((30 * DAY))
topic "$PREFIX.market" 1 --config retention.ms=-1
topic "$PREFIX.refusals" 1 --config cleanup.policy=compact,delete --config retention.ms=$DAY \
  --config retention.bytes=$((64 * 1024 * 1024))

scram market-worker "$WORKER_PASSWORD"
W=(--allow-principal User:market-worker)
for t in accounts registrations values purchases; do
  acl "${W[@]}" --operation Read --operation Write --operation Describe --topic "$PREFIX.$t"
done
for t in catalog rejections refusals deadletters; do
  acl "${W[@]}" --operation Write --operation Describe --topic "$PREFIX.$t"
done
acl "${W[@]}" --operation Read --operation Write --operation Describe --topic "$PREFIX.market"
acl "${W[@]}" --operation All --resource-pattern-type prefixed --topic "$PREFIX.inbox."
if [ "$INBOXES" = v2 ]; then
  topic "$PREFIX.inbox" "${INBOX_PARTITIONS:-16}" --config retention.ms=$((365 * DAY))
  acl "${W[@]}" --operation All --topic "$PREFIX.inbox"
fi
# The workers' state and membership, theirs alone (docs/operations.md, "Group membership"): no
# other principal has an ACL on these, and with allow.everyone.if.no.acl.found=false nobody
# else may read, write, join or describe them. Not Delete, Alter or AlterConfigs: the worker's
# password cannot delete the state or shorten its retention.
acl "${W[@]}" --operation Read --operation Write --operation Create --operation Describe \
  --operation DescribeConfigs --resource-pattern-type prefixed --topic "$APP_ID-"
acl "${W[@]}" --operation Read --operation Describe --group "$APP_ID"
acl "${W[@]}" --operation Describe --operation IdempotentWrite --cluster

scram operator "$OPERATOR_PASSWORD"
O=(--allow-principal User:operator)
acl "${O[@]}" --operation Read --operation Describe --topic "$PREFIX.rejections"
acl "${O[@]}" --operation Read --operation Describe --topic "$PREFIX.deadletters"
acl "${O[@]}" --operation Read --operation Describe --topic "$PREFIX.catalog"

# A party's client quota: what one principal may write (bytes a second) and the share of one
# broker thread its requests may take (percent), so that a flood of garbage from one party is
# throttled by the broker before it costs the market anything (docs/operations.md, "Garbage
# flood"). Defaults: 256 KiB/s and 25 % (thousands of signed events a second; a seller with
# more traffic gets its own values with PARTY_PRODUCE_BYTES raised).
quota() {  # user
  "$BIN/kafka-configs.sh" "${B[@]}" --alter --entity-type users --entity-name "$1" \
    --add-config "producer_byte_rate=${PARTY_PRODUCE_BYTES:-262144},request_percentage=${PARTY_REQUEST_PERCENT:-25}"
}

party() {  # name password topic-it-writes...
  local name=$1 password=$2; shift 2
  scram "$name" "$password"
  quota "$name"
  local inbox="$PREFIX.inbox"  # v2: one topic, each record sealed to its account
  if [ "$INBOXES" = v1 ]; then
    inbox="$PREFIX.inbox.$name"
    topic "$inbox" 1 --config retention.ms=$((365 * DAY))
  fi
  local P=(--allow-principal "User:$name")
  for t in accounts "$@"; do
    acl "${P[@]}" --operation Write --operation Describe --topic "$PREFIX.$t"
  done
  for t in catalog market refusals; do
    acl "${P[@]}" --operation Read --operation Describe --topic "$PREFIX.$t"
  done
  acl "${P[@]}" --operation Read --operation Describe --topic "$inbox"
}

IFS=',' read -ra SELLER_PAIRS <<< "${SELLERS:-}"
for pair in "${SELLER_PAIRS[@]}"; do
  [ -n "$pair" ] || continue
  party "${pair%%:*}" "${pair#*:}" registrations values
done
IFS=',' read -ra BUYER_PAIRS <<< "${BUYERS:-}"
for pair in "${BUYER_PAIRS[@]}"; do
  [ -n "$pair" ] || continue
  party "${pair%%:*}" "${pair#*:}" purchases
done
echo "kafka security and topics ready"
