#!/usr/bin/env bash
# XState 5 baseline for the sm4c counter loop.
#
# Usage: ./run.sh [N] [RUNS]        (defaults: N=500000, RUNS=5)
#   NODE=/path/to/node ./run.sh     (default: node on PATH)
#
# 1. installs the pinned dependencies with `npm ci` if node_modules is missing,
# 2. does one correctness run with --verify (not timed; transitions are counted
#    through XState's inspection API and checked against the reported number),
# 3. runs `node counter.mjs N` RUNS times, timing each whole process with
#    `date +%s%N` around it, and prints the medians.
set -euo pipefail

cd "$(dirname "$0")"
N="${1:-500000}"
RUNS="${2:-5}"
NODE="${NODE:-node}"

if [ ! -d node_modules/xstate ]; then
  echo "# installing dependencies (npm ci)" >&2
  npm ci --no-audit --no-fund >&2
fi

echo "# node $("$NODE" --version), xstate $("$NODE" -p "require('./node_modules/xstate/package.json').version"), $(nproc) cores, N=$N, runs=$RUNS" >&2

# Correctness check (not timed).
if ! "$NODE" counter.mjs "$N" --verify >/dev/null; then
  echo "verify run failed" >&2
  exit 1
fi

results=()
for i in $(seq 1 "$RUNS"); do
  start_ns=$(date +%s%N)
  line=$("$NODE" counter.mjs "$N")
  end_ns=$(date +%s%N)
  wall_ns=$((end_ns - start_ns))
  echo "run $i: wallNs=$wall_ns $line" >&2
  results+=("$wall_ns $line")
done

# Medians (RUNS values each, sorted independently).
printf '%s\n' "${results[@]}" | "$NODE" -e '
  const lines = require("fs").readFileSync(0, "utf8").trim().split("\n");
  const rows = lines.map((l) => {
    const sp = l.indexOf(" ");
    return { wallNs: Number(l.slice(0, sp)), ...JSON.parse(l.slice(sp + 1)) };
  });
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  };
  const transitions = rows[0].transitions;
  if (!rows.every((r) => r.transitions === transitions)) throw new Error("transition counts differ between runs");
  const wallSeconds = median(rows.map((r) => r.wallNs / 1e9));
  const summary = {
    engine: "xstate",
    xstateVersion: rows[0].xstateVersion,
    node: process.version,
    runs: rows.length,
    transitions,
    // in-process: top of counter.mjs (before importing xstate) -> Done
    medianSeconds: +median(rows.map((r) => r.seconds)).toFixed(6),
    medianTransitionsPerSecond: Math.round(median(rows.map((r) => r.transitionsPerSecond))),
    // in-process, machine only: createActor() -> Done
    medianRunSeconds: +median(rows.map((r) => r.runSeconds)).toFixed(6),
    medianRunTransitionsPerSecond: Math.round(median(rows.map((r) => r.runTransitionsPerSecond))),
    // whole `node counter.mjs N` process incl. node startup, timed with date +%s%N
    medianWholeProcessSeconds: +wallSeconds.toFixed(6),
    wholeProcessTransitionsPerSecond: Math.round(transitions / wallSeconds),
  };
  console.log(JSON.stringify(summary));
'
