// XState 5 baseline for the sm4c counter loop.
//
//   Inc   --(always, guard: alwaysTrue)-----------> Check
//   Check --(always, guard: count >= LIMIT)-------> Done
//   Check --(always, guard: count <  LIMIT)-------> Inc
//   Done  (final)
//
// Inc's entry action is assign({ count: count + 1 }), the equivalent of the
// sm4c enter action injecting `.count + 1` and its result handler writing it
// back to `.count`.
//
// Usage: node counter.mjs [N] [--verify]
//   N         target number of transitions (default 500000); LIMIT = floor(N/2)
//   --verify  additionally count every microstep through XState's inspection
//             API and check it against the reported transition count. This adds
//             overhead, so it is off for timed runs.
//
// Prints one JSON line on stdout. `seconds` / `transitionsPerSecond` are
// measured from a timestamp taken at the very top of this script (before
// xstate is imported) to the moment the actor reports completion (Done).

const t0 = process.hrtime.bigint(); // very top of the script: nothing else runs before this

const args = process.argv.slice(2);
const verify = args.includes('--verify');
const positional = args.filter((a) => !a.startsWith('--'));
const N = positional.length ? Number.parseInt(positional[0], 10) : 500000;
if (!Number.isInteger(N) || N < 2) {
  console.error(`counter.mjs: N must be an integer >= 2, got ${positional[0]}`);
  process.exit(2);
}
const LIMIT = Math.floor(N / 2);

// Dynamic import so that module loading is included in the measured time
// (static imports would be evaluated before t0 is taken).
const { createMachine, createActor, assign } = await import('xstate');
const tImported = process.hrtime.bigint();
const { readFileSync } = await import('node:fs'); // only used after timing, for reporting

const machine = createMachine(
  {
    id: 'counter',
    initial: 'Inc',
    context: { count: 0 },
    states: {
      Inc: {
        entry: 'increment',
        always: [{ target: 'Check', guard: 'alwaysTrue' }],
      },
      Check: {
        always: [
          { target: 'Done', guard: 'reachedLimit' },
          { target: 'Inc', guard: 'belowLimit' },
        ],
      },
      Done: { type: 'final' },
    },
  },
  {
    actions: {
      increment: assign({ count: ({ context }) => context.count + 1 }),
    },
    guards: {
      alwaysTrue: () => true,
      reachedLimit: ({ context }) => context.count >= LIMIT,
      belowLimit: ({ context }) => context.count < LIMIT,
    },
  },
);

let inspectedTransitions = 0;
const actorOptions = {};
if (verify) {
  actorOptions.inspect = (ev) => {
    // One '@xstate.microstep' per taken transition (the initial entry into
    // Inc is not a microstep event; it is part of the init snapshot).
    if (ev.type === '@xstate.microstep' && ev._transitions.length > 0) {
      inspectedTransitions += ev._transitions.length;
    }
  };
}

let tDone = null;
let uptimeAtDone = null;
// NB: XState 5 computes the initial snapshot -- including the entire chain of
// eventless microsteps of the initial macrostep -- inside createActor(), so the
// run timer must start before createActor(), not before start().
const tStart = process.hrtime.bigint();
const actor = createActor(machine, actorOptions);
actor.subscribe({
  complete: () => {
    tDone = process.hrtime.bigint();
    uptimeAtDone = process.uptime();
  },
  error: (err) => {
    console.error('counter.mjs: actor error', err);
    process.exit(1);
  },
});

actor.start(); // completion (Done) is observed here, synchronously
if (tDone === null) {
  tDone = process.hrtime.bigint();
  uptimeAtDone = process.uptime();
}

const snap = actor.getSnapshot();
if (snap.status !== 'done' || snap.value !== 'Done') {
  console.error(`counter.mjs: machine did not reach Done (status=${snap.status}, value=${JSON.stringify(snap.value)})`);
  process.exit(1);
}
const count = snap.context.count;
if (count !== LIMIT) {
  console.error(`counter.mjs: expected count ${LIMIT}, got ${count}`);
  process.exit(1);
}

// Exact transition count from the structure: Inc was entered `count` times
// (initial entry + (count-1) Check->Inc), each followed by Inc->Check (count
// transitions), plus (count-1) Check->Inc, plus one Check->Done = 2*count.
const transitions = 2 * count;
if (verify && inspectedTransitions !== transitions) {
  console.error(`counter.mjs: verify failed: inspected ${inspectedTransitions} transitions, computed ${transitions}`);
  process.exit(1);
}

function xstateVersion() {
  try {
    const url = new URL('./node_modules/xstate/package.json', import.meta.url);
    return JSON.parse(readFileSync(url, 'utf8')).version;
  } catch {
    return null;
  }
}

const seconds = Number(tDone - t0) / 1e9;
const runSeconds = Number(tDone - tStart) / 1e9;
const out = {
  engine: 'xstate',
  transitions,
  seconds: Number(seconds.toFixed(6)),
  transitionsPerSecond: Math.round(transitions / seconds),
  // extra detail (not part of the common format):
  xstateVersion: xstateVersion(),
  importSeconds: Number((Number(tImported - t0) / 1e9).toFixed(6)),
  runSeconds: Number(runSeconds.toFixed(6)),
  runTransitionsPerSecond: Math.round(transitions / runSeconds),
  // node's own process.uptime() at Done, i.e. including node bootstrap before t0
  processUptimeAtDoneSeconds: Number(uptimeAtDone.toFixed(6)),
};
if (verify) out.verifiedTransitions = inspectedTransitions;
console.log(JSON.stringify(out));
