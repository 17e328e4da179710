#!/usr/bin/env bash
# Builds each fuzz target's seed corpus in fuzz/corpus/<target>/ (not committed; see .gitignore) from the
# repository's own definitions and tests: samples/, bench/counter/, host/cli/tests/data/ and the strings of
# runtime/tests/*.rs; kafka_records and store_records (and store_reads, which reads the same input) also from the records their
# built targets write. When the shared conformance and reference definitions sit beside the repository
# (../shared/conformance/asl, ../shared/reference/sm4c), they are read too, at run time only.
# Usage: fuzz/seed-corpus.sh [corpus-dir]   (default fuzz/corpus)
set -euo pipefail
fuzz="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$fuzz/.." && pwd)"
out="${1:-$fuzz/corpus}"
python3 - "$root" "$out" <<'PY'
import glob, hashlib, json, os, re, sys

root, out = sys.argv[1], sys.argv[2]
targets = ["load_definition", "asl_execution", "asl_paths_intrinsics", "jq_expression", "timespan", "cloudevent_http",
           "kafka_records", "store_records", "store_reads", "store_roundtrip"]
for t in targets:
    os.makedirs(os.path.join(out, t), exist_ok=True)
counts = dict.fromkeys(targets, 0)

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    if not data or len(data) > 64 * 1024:
        return
    name = hashlib.sha1(data).hexdigest()
    path = os.path.join(out, target, name)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)
        counts[target] += 1

def files(*patterns):
    for p in patterns:
        yield from sorted(glob.glob(os.path.join(root, p), recursive=True))

def strings(v, key=None):
    """Every (key, string) in a JSON value, keys included."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield None, k
            yield from strings(x, k)
    elif isinstance(v, list):
        for x in v:
            yield from strings(x, key)
    elif isinstance(v, str):
        yield key, v

def seed_strings(pairs):
    for key, s in pairs:
        if "${" in s:
            put("jq_expression", s)
            put("jq_expression", re.sub(r"^\s*\$\{\s*|\s*\}\s*$", "", s))
        if s.startswith("$") or s.startswith("States.") or s.startswith("{%") or (key or "").endswith(".$"):
            put("asl_paths_intrinsics", s)
        if key and ("Path" in key or key in ("Variable",)):
            put("asl_paths_intrinsics", s)
        if key and re.search(r"(?i)timeout|delay|duration|interval", key):
            put("timespan", s)

definitions = []
for f in files("samples/**/*.json", "bench/counter/*.json", "host/cli/tests/data/**/*.json",
               "../shared/conformance/asl/**/*.asl.json", "../shared/reference/sm4c/*.json"):
    if os.path.getsize(f) > 64 * 1024:
        continue
    try:
        doc = json.load(open(f))
    except ValueError:
        continue
    if not isinstance(doc, dict):
        continue
    if "states" in doc or "States" in doc:
        raw = open(f, "rb").read()
        put("load_definition", raw)
        definitions.append((f, doc, raw))
    seed_strings(strings(doc))

# Definitions with the input they run with: samples/<name>/input.json, or a conformance case's input.
for f, doc, raw in definitions:
    inputs = [b"{}"]
    d = os.path.dirname(f)
    if os.path.exists(os.path.join(d, "input.json")):
        inputs.append(open(os.path.join(d, "input.json"), "rb").read())
    case = f[: -len(".asl.json")] + ".case.json" if f.endswith(".asl.json") else None
    if case and os.path.exists(case):
        try:
            inputs.append(json.dumps(json.load(open(case)).get("input", {})).encode())
        except ValueError:
            pass
    for i in inputs:
        put("asl_execution", raw + b"\0" + i)

# The runtime's tests write definitions and expressions as Rust string literals inside json!(...).
lit = re.compile(r'"((?:[^"\\]|\\.)*)"')
for f in files("runtime/tests/*.rs", "runtime/src/**/*.rs"):
    src = open(f, encoding="utf-8").read()
    pairs = []
    prev = None
    for m in lit.finditer(src):
        try:
            s = json.loads('"' + m.group(1) + '"')
        except ValueError:
            continue
        pairs.append((prev, s))
        prev = s
    seed_strings(pairs)
    for _, s in pairs:
        if s.startswith("$.") or s.startswith("$$.") or re.match(r"^States\.[A-Za-z0-9]+\(", s):
            put("asl_paths_intrinsics", s)
        if re.fullmatch(r"(?i)(P[0-9TWDHMS.]+|[0-9.]+:[0-9:.]+|[0-9]+ ?(ms|s|m|h|d|w)( [0-9]+ ?(ms|s|m|h|d|w))*)", s):
            put("timespan", s)
    # raw JSON documents embedded as r#"..."# strings
    for m in re.finditer(r'r#"(.*?)"#', src, re.S):
        try:
            doc = json.loads(m.group(1))
        except ValueError:
            continue
        if isinstance(doc, dict) and ("states" in doc or "States" in doc):
            put("load_definition", m.group(1))
            put("asl_execution", m.group(1).encode() + b"\0{}")

for s in ["PT15M", "P1DT2H", "PT0.5S", "pt1h30m", "P2W", "00:00:10", "1.02:00:00", "00:00:00.250",
          "15m", "1h 30m", "500ms", "PT0S", "P1Y", "-PT1S", "PT1.5H", "99999999:00:00"]:
    put("timespan", s)
for s in [".", ".a", ".c[0]", "[.c[] | numbers] | add", "${ .a + 1 }", "reduce range(10) as $i (0; . + $i)",
          ".o | to_entries", "try error(\"x\") catch .", "def f: .; f", "[limit(3; repeat(1))]", "\"\\(.a)\"",
          ".s | fromdate", "tojson | fromjson", "[paths]", "@base64 \"\\(.b)\""]:
    put("jq_expression", s)

# CloudEvents over HTTP: header lines, an empty line, the body; binary and structured mode.
binary = "ce-specversion: 1.0\nce-id: 1\nce-source: /s\nce-type: t\n"
for s in [binary + "content-type: application/json\n\n{\"a\":1}",
          binary + "ce-time: 2024-01-01T00:00:00Z\nce-subject: x\nce-dataschema: http://x/y\nce-ext1: v\n"
          "content-type: text/plain\n\nhello",
          "content-type: application/cloudevents+json\n\n{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/s\","
          "\"type\":\"t\",\"datacontenttype\":\"application/json\",\"data\":{\"a\":1}}",
          "content-type: application/cloudevents+json\n\n{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/s\","
          "\"type\":\"t\",\"data_base64\":\"aGVsbG8=\",\"time\":\"2024-01-01T00:00:00Z\"}"]:
    put("cloudevent_http", s)

# Kafka records (kafka_records: a kind byte, then the record): incoming events in both content modes, as
# header lines, an empty line and the payload; a structured payload without headers; tombstones.
kbinary = "ce_specversion: 1.0\nce_id: 1\nce_source: /s\nce_type: t\n"
for s in [kbinary + "content-type: application/json\n\n{\"a\":1}",
          kbinary + "ce_time: 2024-01-01T00:00:00Z\nce_subject: x\nce_sm4cinstanceid: i\n"
          "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ncontent-type: text/plain\n\nhello",
          "content-type: application/cloudevents+json\n\n{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/s\","
          "\"type\":\"t\",\"datacontenttype\":\"application/json\",\"data\":{\"a\":1}}",
          "content-type: application/cloudevents+json\nce_null\n\n{\"specversion\":\"1.0\",\"id\":\"1\","
          "\"source\":\"/s\",\"type\":\"t\",\"data_base64\":\"aGVsbG8=\"}"]:
    put("kafka_records", b"\x04" + s.encode())
put("kafka_records", b"\x04{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"/s\",\"type\":\"t\",\"data\":{}}")
put("kafka_records", b"\x02i-1\n17")
put("kafka_records", b"\x02\x00tally/events/0/7")
# The store (store_records: NUL-separated row texts): the repository's definitions as the definition row.
for f, doc, raw in definitions:
    put("store_records", raw.replace(b"\0", b"") + b"\0\0\0\0[]")
    put("store_reads", raw.replace(b"\0", b"") + b"\0\0\0\0[]")

for t in targets:
    print(f"{t}: {counts[t]} new seeds, {len(os.listdir(os.path.join(out, t)))} in {os.path.join(out, t)}")
PY
# Records the runtime's own serializers write: each built kafka_records / store_records target writes its
# seeds (instances of its definitions started by the real driver) when SM4C_FUZZ_SEEDS is set. Build the
# targets first (`cargo fuzz build -O -a`) for these; without them the seeds above are all.
one="$(mktemp)"
printf '\003' >"$one"
for t in kafka_records store_records; do
  bin="$(ls "$fuzz"/target/*/release/"$t" 2>/dev/null | head -n 1 || true)"
  if [ -n "$bin" ] && [ -x "$bin" ]; then
    if SM4C_FUZZ_SEEDS="$out/$t" ASAN_OPTIONS=detect_leaks=0 "$bin" "$one" >/dev/null 2>&1; then
      echo "$t: seeds from the real serializers in $out/$t"
    else
      echo "$t: the target did not write its seeds" >&2
    fi
  else
    echo "$t: not built; no seeds from the real serializers (cargo fuzz build -O -a, then run this again)"
  fi
done
rm -f "$one"
# store_reads reads the same input as store_records: it starts from the same seeds.
cp -n "$out"/store_records/* "$out/store_reads/" 2>/dev/null || true
