#!/usr/bin/env bash
# The whole test suite, from a fresh clone. Needs a Rust toolchain (cargo) and python3 (for cmake and the
# Kafka-compatible test broker, which scripts/setup.sh installs into .tools/). The checks that use
# ../shared (beside the repository) run last, as their own step, when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "scripts/test.sh: cargo not found; install Rust from https://rustup.rs" >&2
  exit 2
fi
# cmake for librdkafka, the tansu broker and the Python interop clients (see scripts/setup.sh).
source scripts/setup.sh
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
# Checks against what sits in ../shared beside the repository (never copied into it): the definitions
# written for the SM4C reference implementation must run unmodified. A clone without ../shared has
# passed its own tests above; this step says plainly that it did not run.
if [ -d ../shared/reference/sm4c ]; then
  echo "scripts/test.sh: checking the SM4C reference definitions in ../shared/reference/sm4c" >&2
  cargo test -p sm4c --test reference --locked
else
  echo "scripts/test.sh: NOT RUN: the checks against the SM4C reference definitions (cargo test -p sm4c --test reference): ../shared/reference/sm4c is not beside the repository" >&2
fi
