# Shared by scripts/demo, scripts/test, scripts/bench, scripts/chaos and .ci/run (sourced, not run).

# What a build and a local broker need on Debian/Ubuntu: a C/C++ toolchain, pkg-config, OpenSSL and
# zlib headers (librdkafka, openssl-sys), libclang (bindgen in librocksdb-sys: "Unable to find
# libclang" after minutes of building without it), a JDK 17+ and Maven (the broker's jars).
MILLRACE_PACKAGES=(build-essential pkg-config libssl-dev zlib1g-dev libclang-dev openssl)
MILLRACE_JAVA_PACKAGES=(openjdk-17-jdk-headless maven)

# Checks the system packages and tools before anything is built (a second or two), and installs the
# missing ones with apt-get when it can (as root, or with sudo that needs no password); otherwise it
# stops at once and prints the one command to run. On a system without dpkg it checks only the
# commands and says which libraries the build needs. Set MILLRACE_SKIP_SETUP_CHECK=1 to skip it.
# Arguments: more packages this script needs (scripts/test: prometheus, curl and chromium for the
# metrics tests and the status page's browser test).
ensure_system() {
  [[ "${MILLRACE_SKIP_SETUP_CHECK:-0}" == 1 ]] && return 0
  if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found. Install Rust with rustup (https://rustup.rs), then run this again." >&2
    return 1
  fi
  local wanted=("${MILLRACE_PACKAGES[@]}" "$@") missing=() pkg
  # A JDK and Maven from elsewhere (SDKMAN, Temurin) are as good as Debian's.
  if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    wanted+=("${MILLRACE_JAVA_PACKAGES[@]}")
  fi
  if ! command -v dpkg-query >/dev/null 2>&1; then
    local tool
    for tool in cc c++ pkg-config java mvn; do
      command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if ((${#missing[@]})); then
      echo "setup: missing commands: ${missing[*]}. Install a C/C++ toolchain, pkg-config, a JDK 17+ and" \
        "Maven, and the OpenSSL, zlib and libclang development files, then run this again." >&2
      return 1
    fi
    return 0
  fi
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  local install=(apt-get install -y --no-install-recommends "${missing[@]}")
  if [[ "$(id -u)" == 0 ]]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${install[@]}" || return 1
  elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} (sudo)"
    sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive "${install[@]}" || return 1
  else
    echo "setup: missing system packages: ${missing[*]}. Install them with:" >&2
    echo "  sudo apt-get update && sudo ${install[*]}" >&2
    return 1
  fi
}

# One build directory outside the clone, reused across clones and by tests and benchmarks alike
# (one profile): a fresh clone does not rebuild librdkafka when this machine built it before.
cargo_env() {
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/millrace/target}"
}

# Runs each registered command when the script exits (several services can each register theirs).
MILLRACE_ON_EXIT=()
on_exit() {
  MILLRACE_ON_EXIT+=("$1")
  trap 'for c in "${MILLRACE_ON_EXIT[@]}"; do eval "$c"; done' EXIT
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
    on_exit 'scripts/kafka down'
  fi
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:${KAFKA_PORT:-9092}"
}

# Starts the local Prometheus (scripts/observe) unless PROMETHEUS_URL points at one; stops it again
# on exit if this script started it. The metrics tests register their pipelines as scrape targets in
# PROMETHEUS_TARGETS_DIR.
ensure_prometheus() {
  if [[ -n "${PROMETHEUS_URL:-}" ]]; then
    echo "using Prometheus at $PROMETHEUS_URL"
    return
  fi
  if ! scripts/observe status >/dev/null 2>&1; then
    scripts/observe up
    on_exit 'scripts/observe down'
  fi
  export PROMETHEUS_URL="http://127.0.0.1:${PROMETHEUS_PORT:-9090}"
  export PROMETHEUS_TARGETS_DIR="${PROMETHEUS_DATA_DIR:-$HOME/.cache/millrace/prometheus}/targets"
}

# Starts scripts/postgres unless MILLRACE_POSTGRES_URL is set; stops it again on exit if it started it.
ensure_postgres() {
  if [[ -n "${MILLRACE_POSTGRES_URL:-}" ]]; then
    # Without its password, if the URL has one.
    echo "using PostgreSQL at $(sed -E 's#(://[^:@/]+):[^@/]*@#\1:***@#' <<<"$MILLRACE_POSTGRES_URL")"
    return
  fi
  if ! scripts/postgres status >/dev/null 2>&1; then
    scripts/postgres up
    on_exit 'scripts/postgres down'
  fi
  export MILLRACE_POSTGRES_URL="postgres://millrace@127.0.0.1:${POSTGRES_PORT:-5432}/millrace"
}
