#!/usr/bin/env bash
# The dependency direction of the workspace's crates, checked from `cargo tree`:
# - sm4c-runtime does no IO;
# - sm4c-host (the core an application embeds) depends on the runtime and tokio, nothing heavier;
# - the durable, Kafka, HTTP API and invoker crates depend on the core and the runtime, not on
#   each other, and each brings only its own heavy dependency (SQLite, librdkafka, axum, tonic);
# - the sm4c binary is the glue.
# Then it builds the embedding example with a target folder of its own and no cmake on the PATH,
# and says how many crates that took and how long.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

deps() { # every crate in the normal and build dependency tree of $1
  cargo tree -q --locked -p "$1" -e normal,build --prefix none | sed 's/ (\*)$//; s/ (proc-macro)$//' | awk '{print $1}' | sort -u
}

check() { # crate, allowed sm4c crates (space-separated), forbidden crates (regex)
  local crate=$1 allowed=$2 forbidden=$3 all bad internal
  all=$(deps "$crate")
  bad=$(grep -xE "$forbidden" <<<"$all" | tr '\n' ' ' || true)
  if [ -n "$bad" ]; then
    echo "check-deps: $crate must not depend on: $bad" >&2
    fail=1
  fi
  internal=$(grep -E '^sm4c' <<<"$all" | grep -vx "$crate" | tr '\n' ' ' || true)
  for c in $internal; do
    if ! grep -qw -- "$c" <<<"$allowed"; then
      echo "check-deps: $crate must not depend on $c (allowed: ${allowed:-none})" >&2
      fail=1
    fi
  done
  echo "check-deps: $crate: $(wc -l <<<"$all") crates; sm4c crates: ${internal:-none}"
}

io='tokio|mio|rdkafka|rdkafka-sys|rusqlite|libsqlite3-sys|reqwest|hyper|axum|tonic|socket2|cmake'
check sm4c-runtime "" "$io"
check sm4c-schedule "sm4c-runtime" "$io"
check sm4c-host "sm4c-runtime" 'rdkafka|rdkafka-sys|cmake|rusqlite|libsqlite3-sys|tonic|axum|hyper|reqwest|clap|prost|protox|mio|socket2'
check sm4c-durable "sm4c-runtime sm4c-host sm4c-schedule" 'rdkafka|rdkafka-sys|cmake|axum|tonic|hyper|reqwest|clap'
check sm4c-kafka "sm4c-runtime sm4c-host sm4c-schedule" 'rusqlite|libsqlite3-sys|axum|tonic|reqwest|clap'
check sm4c-api "sm4c-runtime sm4c-host" 'rdkafka|rdkafka-sys|cmake|rusqlite|libsqlite3-sys|tonic|reqwest|clap'
check sm4c-invoke "sm4c-runtime sm4c-host" 'rdkafka|rdkafka-sys|cmake|rusqlite|libsqlite3-sys|axum|clap'
# The libraries forbid unsafe code (the workspace's lints); the binary only denies it, for its
# allocator calls in one module.
unsafe_files=$(grep -rlE '\bunsafe\b *(\{|fn|impl)|expect\(unsafe_code|allow\(unsafe_code' host/cli/src | grep -vx host/cli/src/memory.rs || true)
if [ -n "$unsafe_files" ]; then
  echo "check-deps: only host/cli/src/memory.rs may hold unsafe code; also: $unsafe_files" >&2
  fail=1
fi
[ "$fail" = 0 ] || exit 1
# JSONata is a feature of the runtime (the sm4c binary turns it on); the runtime builds without it.
cargo check -q --locked -p sm4c-runtime --no-default-features
echo "check-deps: sm4c-runtime builds without its jsonata feature"

# The embedding example builds from nothing without cmake (librdkafka's build needs it).
path=$(tr ':' '\n' <<<"$PATH" | grep -v '/\.tools/' | paste -sd: -)
if PATH=$path command -v cmake >/dev/null; then
  echo "check-deps: note: cmake is installed on this machine, so the embedding build below cannot show it is not needed; the dependency check above does"
fi
target=target/embed-check
rm -rf "$target"
start=$(date +%s)
PATH=$path CARGO_TARGET_DIR=$target cargo build -q --locked -p sm4c-host --example embed
echo "check-deps: the embedding example built from nothing in $(( $(date +%s) - start )) s, without cmake"
"$target/debug/examples/embed" >/dev/null
rm -rf "$target"
echo "check-deps: the dependency direction holds"
