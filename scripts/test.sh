#!/usr/bin/env bash
# The whole test suite, from a fresh clone. Needs a Rust toolchain (cargo) and python3 (for cmake and the
# Kafka-compatible test broker, which scripts/setup.sh installs into .tools/), and, for the inspector's
# browser test, Node.js with npm and Debian's chromium (apt-get, as root). The checks that use
# ../shared (beside the repository) run last, as their own step, when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "scripts/test.sh: cargo not found; install Rust from https://rustup.rs" >&2
  exit 2
fi
# cmake for librdkafka, the tansu broker and the Python interop clients (see scripts/setup.sh).
source scripts/setup.sh
# Debian's Chromium and playwright-core for the inspector's browser test, first, so that a machine
# that cannot install them stops here and says why rather than after the build.
setup_browser
setup_wrk
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
# The samples' own tests (samples/*/*.test.json), as a CI job runs a project's definition tests.
echo "scripts/test.sh: the samples' tests (target/debug/sm4c test samples/)" >&2
target/debug/sm4c test samples/
# The web inspector in a real browser: playwright-core drives headless Chromium against a real
# `sm4c serve` on a SQLite file (list filters, diagram marks, the waiting-on panel, live updates,
# send, cancel, a server restart, tokens). It writes a screenshot to target/inspector.png.
echo "scripts/test.sh: testing the web inspector in Chromium (node host/api/ui/test/inspector.cjs)" >&2
node host/api/ui/test/inspector.cjs
# The same checks in Kafka mode: a tansu broker (SM4C_TANSU) and one worker per server.
echo "scripts/test.sh: testing the web inspector in Chromium, Kafka mode (SM4C_INSPECTOR_KAFKA=1 node host/api/ui/test/inspector.cjs)" >&2
SM4C_INSPECTOR_KAFKA=1 SM4C_SCREENSHOT=target/inspector-kafka.png node host/api/ui/test/inspector.cjs
# The soak, short: `sm4c serve` (the debug build) under wrk at 80% of the throughput it measures, three
# 10 s windows; it fails on an answer that is not 2xx, an instance left running, or RSS growing by more
# than 64 MB (bench/serve/soak.sh; the 10-minute run on a release build is in bench/serve/README.md).
echo "scripts/test.sh: a short soak of sm4c serve (SM4C=target/debug/sm4c bench/serve/soak.sh 30 10)" >&2
SM4C=target/debug/sm4c bench/serve/soak.sh 30 10
# Checks against what sits in ../shared beside the repository (never copied into it): the definitions
# written for the SM4C reference implementation must run unmodified. A clone without ../shared has
# passed its own tests above; this step says plainly that it did not run.
if [ -d ../shared/reference/sm4c ]; then
  echo "scripts/test.sh: checking the SM4C reference definitions in ../shared/reference/sm4c" >&2
  # --workspace, not -p sm4c: the dependencies keep the features the workspace build gave them, so
  # nothing is built again but this test (with -p sm4c, two minutes of rebuilding in CI).
  cargo test --workspace --test reference --locked
else
  echo "scripts/test.sh: NOT RUN: the checks against the SM4C reference definitions (cargo test --workspace --test reference): ../shared/reference/sm4c is not beside the repository" >&2
fi
# The ASL conformance cases in ../shared/conformance/asl (recorded against AWS Step Functions; never
# copied into the repository), all of them, the jsonata/ and variables/ folders too, through the debug
# binary built above (about 10 s). Any failing case fails the script.
if [ -d ../shared/conformance/asl ] && command -v jq >/dev/null; then
  echo "scripts/test.sh: running the ASL conformance cases in ../shared/conformance/asl" >&2
  ASL_ALL=1 python3 ../shared/conformance/run-cases.py target/debug/sm4c ../shared/conformance/asl
elif [ -d ../shared/conformance/asl ]; then
  echo "scripts/test.sh: NOT RUN: the ASL conformance cases (../shared/conformance/run-cases.py): their expectations need a jq command, and scripts/setup.sh could not provide one" >&2
else
  echo "scripts/test.sh: NOT RUN: the ASL conformance cases (../shared/conformance/run-cases.py target/debug/sm4c ../shared/conformance/asl): ../shared/conformance/asl is not beside the repository" >&2
fi
