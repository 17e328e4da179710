#!/usr/bin/env bash
# The whole test suite, from a fresh clone. Needs a Rust toolchain (cargo) and python3 (for cmake and the
# Kafka-compatible test broker, which scripts/setup.sh installs into .tools/).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "scripts/test.sh: cargo not found; install Rust from https://rustup.rs" >&2
  exit 2
fi
if [ ! -d ../shared/reference/sm4c ]; then
  echo "scripts/test.sh: ../shared/reference/sm4c (the reference definitions) must sit beside the repository" >&2
  exit 2
fi
# cmake for librdkafka, the tansu broker and the Python interop clients (see scripts/setup.sh).
source scripts/setup.sh
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
