#!/usr/bin/env bash
# The whole test suite, from a fresh clone. Needs only a Rust toolchain (cargo).
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
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
