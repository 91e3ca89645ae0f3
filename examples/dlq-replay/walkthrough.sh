#!/usr/bin/env bash
# Break, dead-letter, fix, replay: what an operator does when records land in a DLQ, one step at a
# time. Run it with `scripts/demo dlq-replay` (builds both programs, starts a local broker when
# KAFKA_BOOTSTRAP_SERVERS is unset), or by hand with
#   SHIPPING=target/debug/shipping MILLRACE=target/debug/millrace examples/dlq-replay/walkthrough.sh
# SHIPPING_TOPIC, SHIPPING_LABELS_TOPIC and SHIPPING_GROUP rename what it uses (the test does).
set -euo pipefail
SHIPPING=${SHIPPING:-shipping}
MILLRACE=${MILLRACE:-millrace}
TOPIC=${SHIPPING_TOPIC:-shipping.orders}
DLQ="$TOPIC.dlq"
step() { printf '\n## %s\n' "$*"; }

step "1. Orders arrive: one in ten ships to New Zealand"
"$SHIPPING" produce --orders 200

step "2. Version 1 has no carrier for NZ: those orders fail as permanent and go to $DLQ; the rest ship"
"$SHIPPING" run

step "3. Look at the DLQ: how many, why, from where (alert on millrace_dead_lettered_total in production)"
"$MILLRACE" dlq stats "$DLQ"
"$MILLRACE" dlq list "$DLQ" --limit 2

step "4. Fix and deploy: version 2 has a carrier for NZ (here: shipping run --also-ship-to NZ, step 6)"

step "5. Replay: a dry run says what would go back to $TOPIC; then the replay itself"
"$MILLRACE" dlq replay "$DLQ" --dry-run | tail -3
"$MILLRACE" dlq replay "$DLQ" | tail -3

step "6. Version 2 ships the replayed orders (a running instance picks them up as they arrive)"
"$SHIPPING" run --also-ship-to NZ

step "7. Check: every order labelled once"
"$SHIPPING" check
