# Shared by scripts/demo, scripts/test and .ci/run (sourced, not run).

# One build directory outside the clone, reused across clones and by tests and benchmarks alike
# (one profile): a fresh clone does not rebuild librdkafka when this machine built it before.
cargo_env() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/millrace/target}"
}

# Starts the local broker unless KAFKA_BOOTSTRAP_SERVERS points at one; stops it again on exit if
# this script started it.
ensure_broker() {
  if [[ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ]]; then
    echo "using brokers at $KAFKA_BOOTSTRAP_SERVERS"
    return
  fi
  if ! scripts/kafka status >/dev/null 2>&1; then
    scripts/kafka up
    trap 'scripts/kafka down' EXIT
  fi
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:${KAFKA_PORT:-9092}"
}
