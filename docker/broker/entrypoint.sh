#!/usr/bin/env bash
# Writes the broker's configuration for KAFKA_LISTEN (host:port; the controller takes port + 1),
# formats the storage in /var/lib/kafka on the first start, and runs the broker in the foreground.
set -euo pipefail
host="${KAFKA_LISTEN%:*}" port="${KAFKA_LISTEN##*:}"
controller=$((port + 1))
data=/var/lib/kafka
cat >"$data/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$host:$controller
listeners=PLAINTEXT://$host:$port,CONTROLLER://$host:$controller
advertised.listeners=PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data/kraft-logs
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS
cp=(-cp "/opt/kafka/libs/*")
log4j=(-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties)
if [[ ! -f "$data/kraft-logs/meta.properties" ]]; then
  # A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'.
  id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
  [[ "$id" == -* ]] && id="A${id:1}"
  java -Xmx256m "${log4j[@]}" "${cp[@]}" kafka.tools.StorageTool format \
    --config "$data/server.properties" --cluster-id "$id"
fi
# shellcheck disable=SC2086 # the heap options are words
exec java $KAFKA_HEAP_OPTS -XX:+UseG1GC -Djava.awt.headless=true "${log4j[@]}" "${cp[@]}" \
  kafka.Kafka "$data/server.properties"
