// The inspector in a real browser: playwright-core drives Debian's Chromium (headless) against a real
// `sm4c serve` on a fresh SQLite file. scripts/test.sh runs it after the build, as its own step:
//
//   source scripts/setup.sh && setup_browser && node host/api/ui/test/inspector.cjs
//
// Environment: SM4C_BIN (default target/debug/sm4c), SM4C_CHROMIUM (default /usr/bin/chromium),
// SM4C_SCREENSHOT (where to write a PNG of an instance page; default target/inspector.png; the ASL
// execution's page, the schedules, a schedule's page and a batch's page go beside it, as -asl.png, -schedules.png,
// -schedule.png, -batch.png).
"use strict";

const { chromium } = require("playwright-core");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");

const root = path.resolve(__dirname, "../../../..");
const BIN = process.env.SM4C_BIN || path.join(root, "target/debug/sm4c");
const CHROMIUM = process.env.SM4C_CHROMIUM || "/usr/bin/chromium";
const SHOT = process.env.SM4C_SCREENSHOT || path.join(root, "target/inspector.png");
// Less than the page's 10 s re-read: what must arrive live arrives by server-sent events.
const LIVE = 5000;
const TOKEN = "inspector-test-token-0123456789";
const READ_TOKEN = "inspector-read-token-0123456789";

const order = JSON.parse(fs.readFileSync(path.join(__dirname, "order.json"), "utf8"));
// ASL: a Parallel (two branches) then a Map, drawn as nested blocks.
const fanout = JSON.parse(fs.readFileSync(path.join(__dirname, "fanout.asl.json"), "utf8"));
const greeter = {
  id: "greeter", name: "Greeter", version: "1",
  states: [{ name: "Greet", start: true, enterAction: { type: "injectData", expression: '${ "Hello " + .name }' },
    enterResultHandler: "${ .greeting = $value }" }],
};
const parent = {
  id: "parent", name: "Parent", version: "1",
  states: [{ name: "Call", start: true, enterAction: { type: "invokeSubflow", subflowName: "order", waitForCompletion: true,
    arguments: { orderId: "${ .orderId }" } }, enterResultHandler: "${ .child = $value }" }],
};

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on("error", reject);
  });
}

// SM4C_INSPECTOR_KAFKA=1 runs the same checks in Kafka mode: one tansu broker (SM4C_TANSU, which
// scripts/setup.sh provides) and one worker per server, on its own consumer group and topics.
const KAFKA = process.env.SM4C_INSPECTOR_KAFKA === "1";
let broker = null;
const servers = [];
async function startBroker() {
  const port = await freePort();
  const url = `tcp://127.0.0.1:${port}`;
  const child = spawn(process.env.SM4C_TANSU || "tansu", ["broker", "--listener-url", url, "--advertised-listener-url", url,
    "--storage-engine", "memory://tansu/"], { stdio: "ignore" });
  servers.push(child);
  const until = Date.now() + 20000;
  while (!(await new Promise(r => { const c = net.connect(port, "127.0.0.1", () => { c.end(); r(true); }); c.on("error", () => r(false)); }))) {
    if (Date.now() > until) throw new Error("tansu did not listen in 20 s");
    await new Promise(r => setTimeout(r, 100));
  }
  return `127.0.0.1:${port}`;
}

async function serve(dir, port, config) {
  const group = "g" + path.basename(dir).replace(/[^a-zA-Z0-9]/g, "");
  const args = KAFKA
    ? ["serve", "--kafka", broker, "--group", group, "--topic-prefix", group, "--partitions", "2",
      "--kafka-config", "session.timeout.ms=6000", "--listen", `127.0.0.1:${port}`]
    : ["serve", "--db", path.join(dir, "sm4c.db"), "--listen", `127.0.0.1:${port}`];
  if (config) {
    fs.writeFileSync(path.join(dir, "sm4c.toml"), config);
    args.push("--config", path.join(dir, "sm4c.toml"));
  }
  const log = fs.openSync(path.join(dir, "server.log"), "a");
  const child = spawn(BIN, args, { stdio: ["ignore", "ignore", log] });
  servers.push(child);
  const url = `http://127.0.0.1:${port}`;
  const until = Date.now() + (KAFKA ? 60000 : 20000);
  for (;;) {
    try {
      const res = await fetch(url + "/healthz");
      // A Kafka worker serves once it owns every partition (it is alone in its group).
      if (res.ok && (!KAFKA || (await res.json()).ownedPartitions === 2)) return { child, url, dir };
    } catch (_) { /* not yet */ }
    if (child.exitCode !== null) throw new Error("sm4c serve exited:\n" + fs.readFileSync(path.join(dir, "server.log"), "utf8"));
    if (Date.now() > until) throw new Error("sm4c serve did not answer /healthz (owning its partitions) in time");
    await new Promise(r => setTimeout(r, 50));
  }
}

function stop(s) {
  return new Promise(resolve => { s.child.once("exit", resolve); s.child.kill("SIGKILL"); });
}

async function call(s, method, p, body, headers = {}) {
  const res = await fetch(s.url + p, {
    method, headers: { "Content-Type": "application/json", ...headers }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}
const post = (s, p, body, headers) => call(s, "POST", p, body, headers);
const start = (s, definition, id, input) => post(s, "/instances", { definition, id, input });
const paid = (s, orderid) => post(s, "/events", { specversion: "1.0", id: "ev-" + orderid + Date.now(), type: "com.example.paid", source: "shop", orderid, data: { amount: 42 } },
  { "Content-Type": "application/cloudevents+json" });

let checks = 0;
function ok(cond, what) {
  if (!cond) throw new Error("FAILED: " + what);
  checks++;
  console.log("ok - " + what);
}

async function rowIds(page) {
  return page.$$eval("#instances tbody tr", rows => rows.map(r => r.dataset.id));
}

/** Waits until the API lists `n` instances (Kafka mode starts them asynchronously). */
async function settle(s, n, status) {
  const until = Date.now() + 20000;
  for (;;) {
    const q = status ? `?status=${status}` : "";
    if ((await call(s, "GET", "/instances" + q)).instances.length === n) return;
    if (Date.now() > until) throw new Error(`the server did not list ${n} instances in 20 s`);
    await new Promise(r => setTimeout(r, 100));
  }
}

/** Waits until instance `id` has `status` (Kafka mode starts it asynchronously). */
async function reach(s, id, status) {
  const until = Date.now() + 20000;
  for (;;) {
    const res = await fetch(`${s.url}/instances/${id}`);
    if (res.ok && (await res.json()).status === status) return;
    if (Date.now() > until) throw new Error(`${id} was not ${status} in 20 s`);
    await new Promise(r => setTimeout(r, 100));
  }
}

/**
 * The Schedules page. SQLite mode: the list with each schedule's next time, a schedule's page, and
 * its Trigger, Resume and Pause buttons, a refusal shown with its code. A host without schedules
 * (Kafka mode, until it has them) answers /schedules with 501: the page says so plainly.
 */
async function scheduleChecks(page, s) {
  const wait = { timeout: KAFKA ? 4 * LIVE : LIVE };
  await page.goto(s.url + "/ui#/instances");
  await page.waitForSelector("#instances tbody tr");
  await page.click('nav a[href="#/schedules"]');
  await page.waitForFunction(() => location.hash === "#/schedules" && document.querySelector("h1") && document.querySelector("h1").textContent === "Schedules");
  ok(await page.getAttribute('nav a[href="#/schedules"]', "aria-current") === "page", "the Schedules tab opens #/schedules and is marked current");
  const answer = await fetch(s.url + "/schedules");
  if (KAFKA && answer.status === 501) {
    await page.waitForSelector("#no-schedules");
    const said = await page.textContent("#no-schedules");
    ok(said.includes("This server has no schedules") && said.includes("without --kafka"), `Kafka mode: the Schedules page says this server has no schedules (${said})`);
    await page.goto(s.url + "/ui#/schedule/nightly");
    await page.waitForFunction(() => (document.querySelector("#no-schedules") || {}).textContent?.includes("This server has no schedules"));
    ok(await page.isHidden("#banner"), "Kafka mode: so does a schedule's page, with no error banner");
    await page.screenshot({ path: SHOT.replace(/\.png$/, "") + "-schedules.png", fullPage: true });
    return false;
  }
  ok(answer.ok, `the server answers GET /schedules (${answer.status})`);
  if (KAFKA) console.log("# Kafka mode answers /schedules: the schedule checks run as in SQLite mode");
  await page.waitForSelector("#view .empty");
  ok((await page.textContent("#view .empty")).includes("No schedule yet"), "with no schedule the page says how to create one");

  // A schedule every two seconds, created paused (so that its only run is the one the button
  // triggers), and a cron schedule in a time zone.
  await post(s, "/schedules", { id: "tick", definition: "greeter", input: { name: "Tick" }, every: "PT2S", paused: true, note: "every two seconds" });
  await post(s, "/schedules", { id: "gone", definition: "greeter", cron: "30 2 * * *", timezone: "America/New_York" });
  const gone = await call(s, "GET", "/schedules/gone");
  await page.goto(s.url + "/ui#/definitions");
  await page.goto(s.url + "/ui#/schedules");
  await page.waitForSelector('#schedules tr[data-id="tick"]');
  ok((await page.$$eval("#schedules tbody tr", rows => rows.map(r => r.dataset.id))).join() === "gone,tick", "the list shows both schedules");
  const row = '#schedules tr[data-id="tick"]';
  ok((await page.textContent(`${row} td:nth-child(3)`)).replace(/\s+/g, " ").trim() === "every PT2S in UTC", "the row says when it runs");
  ok((await page.getAttribute(`${row} .badge`, "data-status")) === "paused", "the row shows the state paused");
  const next = await page.getAttribute(`${row} td.next time`, "datetime");
  ok(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(next) && Date.parse(next) % 2000 === 0, `the row shows the next time, on an even second (${next})`);
  ok(await page.$eval(`${row} td.next`, (td, t) => td.querySelector("time").textContent === new Date(t).toLocaleString()
    && td.querySelector(".utc").textContent === t, next), "the next time is in the browser's locale and in RFC 3339 UTC");
  const goneRow = '#schedules tr[data-id="gone"]';
  ok((await page.getAttribute(`${goneRow} td.next time`, "datetime")) === gone.nextTimes[0]
    && (await page.textContent(`${goneRow} td:nth-child(3)`)).replace(/\s+/g, " ").trim() === "cron 30 2 * * * in America/New_York",
    `a cron schedule's row shows its expression, its time zone and the next time the API gives (${gone.nextTimes[0]})`);

  // A schedule's page: its next ten times, no run yet.
  await page.click(`${row} a[href="#/schedule/tick"]`);
  await page.waitForSelector("#sched-next li");
  const times = await page.$$eval("#sched-next li time", ts => ts.map(t => t.getAttribute("datetime")));
  ok(times.length === 10 && times.every((t, n) => n === 0 || Date.parse(t) - Date.parse(times[n - 1]) === 2000) && times[0] >= next,
    `the schedule's page shows its next ten times, two seconds apart (${times[0]} …)`);
  ok(await page.isVisible("#sched-recent-none") && await page.isVisible("#sched-resume") && !(await page.$("#sched-pause")),
    "a paused schedule has no run yet and offers Resume");

  // Trigger: one run, named <schedule>@<now>, linked to its instance page.
  await page.click("#sched-trigger");
  await page.waitForSelector("#sched-recent tbody tr", wait);
  const runs = await page.$$eval("#sched-recent tbody tr", rows => rows.map(r => r.dataset.instance));
  ok(runs.length === 1 && /^tick@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(runs[0]), `Trigger now starts one run, named after the schedule and a time (${runs.join()})`);
  ok((await page.textContent("#banner")).includes("Schedule tick is triggered"), "the page says the schedule was triggered");
  const link = `#sched-recent tr[data-instance="${runs[0]}"] a`;
  ok((await page.getAttribute(link, "href")) === "#/instance/" + encodeURIComponent(runs[0]), "the run links to its instance's page");
  ok((await call(s, "GET", "/schedules/tick")).recentRuns.map(r => r.instance).join() === runs[0], "the server holds the same run");
  await page.click(link);
  await page.waitForSelector('h1 .badge[data-status="completed"]', wait);
  ok((await page.textContent("h1")).startsWith(runs[0]) && (await page.textContent("#data")).includes("Hello Tick"),
    "the link opens the run's instance, which ran with the schedule's input");
  const nominal = runs[0].slice("tick@".length);
  ok((await page.textContent("#scheduled")).includes(nominal) &&
     (await page.getAttribute("#scheduled a", "href")) === "#/schedule/tick",
    "the instance's page names its schedule and nominal time, linked back to the schedule");
  await page.goBack();
  await page.waitForSelector(`#sched-recent tr[data-instance="${runs[0]}"] .badge[data-status="completed"]`, wait);
  ok(true, "the run's outcome shows as completed");

  // Resume: the state shows active, and the schedule's own runs appear live.
  await page.click("#sched-resume");
  await page.waitForSelector('h1 .badge[data-status="active"]', wait);
  ok(await page.isVisible("#sched-pause") && (await page.textContent("#banner")).includes("is resumed"), "Resume makes the schedule active and offers Pause");
  await page.waitForFunction(() => document.querySelectorAll("#sched-recent tbody tr").length >= 2, null, wait);
  ok(true, "a run the schedule starts by itself appears on the open page, live");
  // A refresh (a run's live update, the 10 s re-read) keeps the very buttons: one drawn again
  // under the pointer would lose the click.
  await page.evaluate(() => { window.pauseButton = document.querySelector("#sched-pause"); });
  await page.evaluate(() => current.refresh());
  ok(await page.evaluate(() => document.querySelector("#sched-pause") === window.pauseButton), "the buttons are the same elements after a refresh");
  await page.click("#sched-pause");
  await page.waitForSelector('h1 .badge[data-status="paused"]', wait);
  ok(await page.isVisible("#sched-resume") && (await call(s, "GET", "/schedules/tick")).state === "paused", "Pause pauses it: the page and the server say paused");
  await page.screenshot({ path: SHOT.replace(/\.png$/, "") + "-schedule.png", fullPage: true });
  await page.goto(s.url + "/ui#/schedules");
  await page.waitForSelector(`${row} .badge[data-status="paused"]`);
  ok(Number(await page.textContent(`${row} td.runs`)) >= 2, "the list counts its runs");
  await page.screenshot({ path: SHOT.replace(/\.png$/, "") + "-schedules.png", fullPage: true });

  // A refusal: the schedule went away while its page was open.
  await page.goto(s.url + "/ui#/schedule/gone");
  await page.waitForSelector("#sched-trigger");
  await call(s, "DELETE", "/schedules/gone");
  await page.click("#sched-trigger");
  await page.waitForSelector("#banner:not([hidden]):not(.info)");
  const refused = await page.textContent("#banner");
  ok(refused.includes("unknownSchedule") && refused.includes('no schedule "gone"'), `a refusal is shown with its code and message (${refused})`);
  ok(!(await page.isDisabled("#sched-trigger")), "the button can be used again after a refusal");
  return true;
}

/**
 * The Batches page. SQLite mode: "Act on all that match" carries the instances page's filters to a
 * new batch; a dry run lists what it would touch and changes nothing; Start runs it and opens its
 * page, which follows it to the end; a refusal names the field; Stop stops a running batch. The same
 * in Kafka mode, where each partition's owner runs its share.
 */
async function batchChecks(page, s) {
  await page.goto(s.url + "/ui#/batches");
  const answer = await fetch(s.url + "/batches");
  ok(answer.status === 200, `the server runs batches, in ${KAFKA ? "Kafka" : "SQLite"} mode too (GET /batches: ${answer.status})`);
  await page.waitForSelector("#batches-none");
  ok(true, "with no batch the page says so");
  for (const n of [1, 2, 3]) await start(s, "order", `bulk-${n}`, { orderId: `BULK${n}` });
  for (const n of [1, 2, 3]) await reach(s, `bulk-${n}`, "waiting");
  const others = async () => (await call(s, "GET", "/instances?limit=1000")).instances
    .filter(i => !i.id.startsWith("bulk-")).map(i => `${i.id}:${i.status}`).sort().join();
  const before = await others();
  // From the instances list, filtered, to a batch over the same instances.
  await page.goto(s.url + "/ui#/instances?definition=order&condition=" + encodeURIComponent('.orderId | startswith("BULK")'));
  await page.waitForFunction(() => document.querySelectorAll("#instances tbody tr").length === 3);
  await page.click("#act-on-these");
  await page.waitForSelector("#batch-form");
  ok((await page.inputValue("#b-definition")) === "order" && (await page.inputValue("#b-jq")) === '.orderId | startswith("BULK")',
    "Act on all that match opens a new batch with the list's filters");
  ok(await page.isDisabled("#b-start"), "Start waits for a dry run");
  await page.click("#b-dry");
  await page.waitForSelector("#b-matched");
  ok((await page.textContent("#b-matched")).includes("3 instance(s) would be touched by cancel")
    && (await page.$$("#b-instances tbody tr")).length === 3, "the dry run lists the three instances");
  ok((await call(s, "GET", "/instances/bulk-1")).status === "waiting", "a dry run changes nothing");
  await page.click("#b-start");
  await page.waitForSelector('h1 .badge[data-status="completed"]', { timeout: 20000 });
  ok((await page.textContent("#batch-done")) === "3" && (await page.textContent("#batch-failed")) === "0"
    && await page.isVisible("#batch-no-failures"), "Start runs the batch; its page follows it to the end: 3 done, none failed");
  ok((await Promise.all([1, 2, 3].map(n => call(s, "GET", `/instances/bulk-${n}`)))).every(i => i.status === "cancelled"),
    "the server cancelled the three");
  ok((await others()) === before, "and nothing else changed");
  await page.goto(s.url + "/ui#/batches");
  await page.waitForSelector('#batches tbody tr .badge[data-status="completed"]');
  ok(true, "the list shows the completed batch");
  // A refusal names the field.
  await page.fill("#b-jq", ".orderId ==");
  await page.click("#b-dry");
  await page.waitForSelector("#banner:not([hidden]):not(.info)");
  const refused = await page.textContent("#banner");
  ok(refused.includes("invalidBatch") && refused.includes("/where/jq"), `a refused batch shows the code and the field (${refused})`);
  // Stop: a batch at one instance a second, stopped from its page.
  for (const n of [4, 5, 6, 7]) await start(s, "order", `bulk-${n}`, { orderId: `BULK${n}` });
  for (const n of [4, 5, 6, 7]) await reach(s, `bulk-${n}`, "waiting");
  const slow = await post(s, "/batches", { operation: "cancel", where: { jq: '.orderId | startswith("BULK")', status: "waiting" }, rate: 1 });
  await page.goto(s.url + "/ui#/batch/" + encodeURIComponent(slow.id));
  await page.click("#batch-stop");
  await page.waitForSelector('h1 .badge[data-status="cancelled"]');
  const stopped = await call(s, "GET", "/batches/" + encodeURIComponent(slow.id));
  ok(stopped.phase === "cancelled" && stopped.done < 4, `Stop stops the batch before it reaches every instance (${stopped.done} of 4 done)`);
  await page.screenshot({ path: SHOT.replace(/\.png$/, "") + "-batch.png", fullPage: true });
}

async function main() {
  if (KAFKA) broker = await startBroker();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "sm4c-inspector-"));
  const port = await freePort();
  let s = await serve(tmp, port);
  for (const d of [order, greeter, parent, fanout]) await post(s, "/definitions", d);
  await start(s, "order", "o-1", { orderId: "A1" });
  await start(s, "order", "o-2", { orderId: "B2" });
  await start(s, "greeter", "g-1", { name: "Ada" });
  await settle(s, 2, "waiting");
  await settle(s, 1, "completed");

  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "sm4c-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1400, height: 1000 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const page = context.pages()[0] || await context.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(e.message));
  try {
    // The list and its filters.
    await page.goto(s.url + "/ui");
    await page.waitForSelector("#instances tbody tr");
    ok((await rowIds(page)).sort().join() === "g-1,o-1,o-2", "the list shows every instance");
    await page.waitForSelector("#live.on", { timeout: LIVE });
    await page.selectOption("#f-status", "waiting");
    await page.waitForFunction(() => location.hash.includes("status=waiting") && document.querySelectorAll("#instances tbody tr").length === 2);
    ok((await rowIds(page)).sort().join() === "o-1,o-2", "the status filter keeps the waiting instances");
    await page.selectOption("#f-status", "");
    await page.selectOption("#f-definition", "greeter");
    await page.waitForFunction(() => location.hash.includes("definition=greeter") && document.querySelectorAll("#instances tbody tr").length === 1);
    ok((await rowIds(page)).join() === "g-1", "the definition filter keeps the greeter instance");
    await page.fill("#f-state", "AwaitPayment");
    await page.press("#f-state", "Enter");
    await page.waitForSelector(".empty");
    ok((await page.textContent(".empty")).includes("No instance matches these filters"), "no instance matches greeter in AwaitPayment: a readable empty state");
    await page.goto(s.url + "/ui#/instances");
    await page.waitForSelector("#instances tbody tr");
    await page.fill("#f-condition", '.orderId == "B2"');
    await page.press("#f-condition", "Enter");
    await page.waitForFunction(() => location.hash.includes("condition=") && document.querySelectorAll("#instances tbody tr").length === 1);
    ok((await rowIds(page)).join() === "o-2", "a jq condition over the data finds o-2");
    await page.fill("#f-condition", ".orderId ==");
    await page.press("#f-condition", "Enter");
    await page.waitForSelector("#banner:not([hidden])");
    ok((await page.textContent("#banner")).includes("condition"), "a condition that does not compile is reported: " + await page.textContent("#banner"));
    await page.goto(s.url + "/ui#/instances?state=AwaitPayment&version=1");
    await page.waitForFunction(() => document.querySelectorAll("#instances tbody tr").length === 2);
    ok((await rowIds(page)).sort().join() === "o-1,o-2", "the state and version filters keep o-1 and o-2");

    // The keyboard alone reaches an instance from the list.
    await page.goto(s.url + "/ui#/instances");
    await page.waitForSelector("#instances tbody tr");
    let reached = false;
    for (let i = 0; i < 40 && !reached; i++) {
      await page.keyboard.press("Tab");
      reached = await page.evaluate(() => document.activeElement && document.activeElement.getAttribute("href") === "#/instance/o-1");
    }
    ok(reached, "Tab reaches the link to o-1");
    await page.keyboard.press("Enter");
    await page.waitForSelector("#diagram svg");
    ok(await page.evaluate(() => location.hash === "#/instance/o-1"), "Enter opens it");

    // A new instance appears in the list live.
    await page.goto(s.url + "/ui#/instances");
    await page.waitForSelector("#instances tbody tr");
    await page.waitForSelector("#live.on", { timeout: LIVE });
    await start(s, "order", "o-3", { orderId: "C3" });
    await page.waitForSelector('#instances tr[data-id="o-3"]', { timeout: LIVE });
    ok(true, "an instance started elsewhere appears in the list live");
    ok((await rowIds(page))[0] === "o-3", "the list shows the newest first");

    // An instance: its diagram's marks, what it waits on, its history.
    await page.click('a[href="#/instance/o-1"]');
    await page.waitForSelector("#diagram svg");
    const cls = async name => page.getAttribute(`#diagram g.state[data-state="${name}"]`, "class");
    ok((await cls("AwaitPayment")).split(" ").includes("current"), "the diagram marks the current state");
    ok((await cls("Received")).split(" ").includes("visited") && !(await cls("Received")).includes("current"), "the diagram marks a visited state");
    ok(!(await cls("Ship")).includes("visited"), "the diagram leaves a state not reached unmarked");
    ok((await page.getAttribute('#diagram g.edge[data-from="Received"][data-to="AwaitPayment"]', "class")).includes("fired"), "the diagram marks the transition taken");
    ok((await page.textContent('#waiting-events li[data-event="paid"]')).includes("com.example.paid"), "the waiting-on panel names the pending event");
    ok((await page.textContent('#waiting-events li[data-event="paid"] code.corr')) === "A1", "the waiting-on panel gives the correlation value the event must carry");
    const timer = await page.textContent("#waiting-timers li");
    ok(timer.includes("state timeout") && timer.includes("Expired"), "the waiting-on panel names the timer and where it leads");
    const c1 = await page.textContent("#waiting-timers .countdown");
    ok(/^(59m|1h 0m) \d+s$/.test(c1), `the timer counts down (${c1})`);
    await page.waitForFunction(c => document.querySelector("#waiting-timers .countdown").textContent !== c, c1, { timeout: 3000 });
    ok(true, "the countdown ticks");
    ok((await page.textContent("#timeline")).includes("/step"), "the history shows the data change of the first step");
    fs.mkdirSync(path.dirname(SHOT), { recursive: true });
    await page.screenshot({ path: SHOT, fullPage: true });
    console.log("# screenshot: " + SHOT);

    // An event sent elsewhere moves the instance on the open page, live.
    await paid(s, "A1");
    await page.waitForSelector('h1 .badge[data-status="completed"]', { timeout: LIVE });
    ok((await page.textContent("#current-state")) === "Done", "the sent event shows live: the instance is done");
    ok((await cls("Ship")).includes("visited"), "the diagram now marks Ship visited");
    const diff = await page.textContent('#timeline li[data-step="1"] .diff');
    ok(diff.includes("/payment") && diff.includes("/step") && diff.includes('"received" → "shipped"'), "the event's step shows its data change as a diff");
    ok((await page.textContent("#waiting")).includes("has ended"), "an ended instance waits on nothing");

    // Send an event from the page: explained first, then sent.
    await page.goto(s.url + "/ui#/instance/o-2");
    await page.waitForSelector('#waiting-events li[data-event="paid"] button');
    await page.click('#waiting-events li[data-event="paid"] button');
    await page.waitForSelector("#send-form");
    ok(await page.isDisabled("#send"), "an event cannot be sent before it is explained");
    ok((await page.inputValue("#e-type")) === "com.example.paid" && (await page.inputValue("#e-ext")).includes('"B2"'), "the send form is filled from what the instance waits on");
    await page.click("#explain");
    await page.waitForSelector("#reached");
    ok((await page.textContent("#reached")).includes("o-2"), "the explanation says the event would reach o-2");
    await page.click("#send");
    await page.waitForSelector("#delivered");
    ok((await page.textContent("#delivered")).includes("o-2"), "the page says where the event went");
    await page.click("#delivered a");
    await page.waitForSelector('h1 .badge[data-status="completed"]', { timeout: LIVE });
    ok(true, "the instance the page sent the event to has completed");

    // Start an instance from the page, then cancel it.
    await page.goto(s.url + "/ui#/start?definition=order");
    await page.waitForSelector("#start-form");
    await page.fill("#s-id", "o-4");
    await page.fill("#s-input", '{"orderId": "D4"}');
    await page.click('#start-form button[type="submit"]');
    await page.waitForFunction(() => location.hash === "#/instance/o-4");
    await page.waitForSelector('h1 .badge[data-status="waiting"]', { timeout: LIVE });
    ok(true, "an instance started from the page is shown, waiting");
    await page.click("#cancel");
    await page.waitForSelector("#cancel-yes");
    // A refresh (the live stream, the 10 s re-read) re-renders the page: the question must stay,
    // the very buttons (one drawn again under the pointer would lose the click).
    await page.evaluate(() => { window.askedYes = document.querySelector("#cancel-yes"); });
    await page.evaluate(() => current.refresh());
    ok(await page.isVisible("#cancel-yes"), "the cancel question stays on the page through a refresh");
    ok(await page.evaluate(() => document.querySelector("#cancel-yes") === window.askedYes),
      "the cancel question's buttons are the same elements after a refresh");
    await page.click("#cancel-yes");
    await page.waitForSelector('h1 .badge[data-status="cancelled"]', { timeout: LIVE });
    ok((await call(s, "GET", "/instances/o-4")).status === "cancelled", "cancel from the page cancels the instance");

    // The step debugger (both modes): a breakpoint set on the definition's page pauses an instance,
    // which shows where and its data, then steps and resumes.
    {
      await page.goto(s.url + "/ui#/definition/order/1");
      await page.waitForSelector("#breakpoints");
      await page.check('#breakpoints tr[data-state="Ship"] input[data-kind="enter"]');
      await page.waitForFunction(() => document.querySelector("#banner") && document.querySelector("#banner").textContent.includes("1 breakpoint set on order"));
      ok(JSON.stringify((await call(s, "GET", "/definitions/order/breakpoints")).breakpoints) === JSON.stringify([{ on: "enter", state: "Ship" }]),
        "a checkbox on the definition's page sets a breakpoint on entering Ship");
      await start(s, "order", "o-6", { orderId: "G7" });
      await page.goto(s.url + "/ui#/instance/o-6");
      await page.waitForSelector('h1 .badge[data-status="waiting"]', { timeout: LIVE });
      await paid(s, "G7");
      await page.waitForSelector('h1 .badge[data-status="paused"]', { timeout: LIVE });
      ok((await page.textContent("#paused-at")).includes("entering Ship"), "the paused instance says where it paused, live");
      ok((await page.textContent("#paused-data")).includes('"G7"'), "the paused instance shows its data");
      await page.click("#step");
      await page.waitForFunction(() => (document.querySelector("#paused-at") || {}).textContent?.includes("before the enter action of Ship"), null, { timeout: LIVE });
      ok(true, "Step goes on to the next point (Ship's enter action) and pauses there");
      await page.click("#resume");
      await page.waitForSelector('h1 .badge[data-status="completed"]', { timeout: LIVE });
      ok((await call(s, "GET", "/instances/o-6")).data.step === "shipped", "Resume lets the instance run to its end");
      await page.goto(s.url + "/ui#/definition/order/1");
      await page.waitForSelector("#bp-clear:not([disabled])");
      await page.click("#bp-clear");
      await page.waitForSelector("#bp-clear[disabled]");
      ok((await call(s, "GET", "/definitions/order/breakpoints")).breakpoints.length === 0, "Clear all breakpoints clears them");
    }

    // Parent and children.
    await start(s, "parent", "p-1", { orderId: "E5" });
    await page.goto(s.url + "/ui#/instance/p-1");
    await page.waitForSelector('#children a[href="#/instance/p-1%2F1.enter"]', { timeout: LIVE });
    await page.click('#children a');
    await page.waitForSelector("#parent a");
    ok((await page.textContent("#parent a")) === "p-1", "a child names its parent and the parent its child");

    // An ASL execution: its Parallel's branches and its Map's item processor are drawn inside their
    // states, with their own states, edges and marks.
    await start(s, "fanout", "f-1", { wait: 3600, ok: true, items: [1, 2] });
    await start(s, "fanout", "f-2", { wait: 1, ok: true, items: [1, 2] });
    await reach(s, "f-1", "waiting");
    await page.goto(s.url + "/ui#/instance/f-1");
    await page.waitForSelector('#diagram g.block[data-parent="Both"]', { timeout: LIVE });
    const nested = (parent, name) => `#diagram g.block[data-parent="${parent}"] g.state[data-state="${name}"]`;
    ok((await page.$$('#diagram g.block[data-parent="Both"]')).length === 2 && (await page.$$('#diagram g.block[data-parent="Each"]')).length === 1,
      "an ASL diagram draws a block per Parallel branch and one for the Map's item processor");
    let drawn = true;
    for (const [p, n] of [["Both", "Left"], ["Both", "LeftDone"], ["Both", "Right"], ["Both", "RightCheck"], ["Both", "RightDone"], ["Each", "Item"], ["Each", "ItemDone"]]) {
      drawn = drawn && (await page.$$(nested(p, n))).length === 1 && await page.isVisible(nested(p, n));
    }
    ok(drawn, "every state of the branches and of the item processor is drawn in its block");
    // (A straight edge's box has no height, so it counts as not visible: count them.)
    ok((await page.$$('#diagram g.block[data-parent="Both"] g.edge[data-from="Left"][data-to="LeftDone"] path')).length === 1
      && (await page.$$('#diagram g.block[data-parent="Both"] g.edge[data-from="RightCheck"][data-to="Right"] path')).length === 1
      && (await page.$$('#diagram g.block[data-parent="Each"] g.edge[data-from="Item"][data-to="ItemDone"] path')).length === 1, "the nested blocks draw their edges");
    const ncls = async (p, n) => (await page.getAttribute(nested(p, n), "class")).split(" ");
    ok((await ncls("Both", "Right")).includes("current") && (await cls("Both")).split(" ").includes("current"),
      "the waiting branch's state is current, inside the current Parallel");
    ok((await ncls("Both", "LeftDone")).includes("visited") && !(await ncls("Both", "LeftDone")).includes("current"), "a finished branch's states are visited");
    ok(!(await ncls("Each", "Item")).includes("visited"), "the item processor not reached yet is unmarked");
    const box = async sel => page.$eval(sel, e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });
    const [ol, ot, or, ob] = await box('#diagram g.state[data-state="Both"] rect');
    const [il, it, ir, ib] = await box('#diagram g.block[data-parent="Both"][data-block="2"] rect.frame');
    ok(il > ol && it > ot && ir < or && ib < ob, "a branch is drawn inside its Parallel state");
    await page.screenshot({ path: SHOT.replace(/\.png$/, "") + "-asl.png", fullPage: true });
    await reach(s, "f-2", "completed");
    await page.goto(s.url + "/ui#/instance/f-2");
    await page.waitForSelector(`${nested("Each", "ItemDone")}.visited`, { timeout: LIVE });
    ok((await ncls("Each", "ItemDone")).includes("visited") && (await ncls("Both", "RightDone")).includes("visited"),
      "a completed execution marks the states of its branches and iterations visited");
    ok((await page.getAttribute('#diagram g.block[data-parent="Each"] g.edge[data-from="Item"][data-to="ItemDone"]', "class")).includes("fired"),
      "and the transitions they took");

    // A definition: its diagram and JSON.
    await page.goto(s.url + "/ui#/definitions");
    await page.waitForSelector("#definitions");
    await page.click('#definitions a[href="#/definition/order/1"]');
    await page.waitForSelector('#diagram g.state[data-state="Expired"]');
    ok((await page.textContent("#definition-json")).includes('"AwaitPayment"'), "a definition shows its diagram and its JSON");
    await page.goto(s.url + "/ui#/definitions");
    await page.waitForSelector('#definitions a[href^="#/definition/fanout/"]');
    await page.click('#definitions a[href^="#/definition/fanout/"]');
    await page.waitForSelector('#diagram g.block[data-parent="Each"] g.state[data-state="ItemDone"]');
    ok((await page.$$("#diagram g.block g.state")).length === 7, "an ASL definition's page draws its nested states");

    // Live migration from an instance's page: the versions to move to, a dry run that says why it
    // cannot move without a map, then the plan with the map, then the move.
    {
      const shipment = (version, wait) => ({
        id: "shipment", name: "Shipment", version,
        events: [{ name: "picked", type: "com.example.picked", source: "depot" }],
        states: [{ name: wait, start: true, transitions: [{ nextState: "Gone", eventGroups: [{ events: ["picked"] }] }, { nextState: "Late", timeout: "PT1H" }] },
          { name: "Gone" }, { name: "Late" }],
      });
      await post(s, "/definitions", shipment("1", "AtDepot"));
      await post(s, "/definitions", shipment("2", "OnShelf"));
      await post(s, "/instances", { definition: "shipment", version: "1", id: "m-1", input: {} });
      await reach(s, "m-1", "waiting");
      await page.goto(s.url + "/ui#/instance/m-1");
      await page.waitForSelector("#migrate-box summary");
      await page.click("#migrate-box summary");
      await page.waitForSelector('#migrate-version option[value="2"]', { state: "attached" });
      ok(await page.isDisabled("#migrate-go"), "the move waits for its preview");
      await page.click("#migrate-preview");
      await page.waitForSelector("#migrate-refused");
      ok((await page.textContent("#migrate-refused")).includes("noCounterpart"), "the preview says the state has no counterpart: " + await page.textContent("#migrate-refused"));
      // A refresh keeps the form being filled in.
      await page.fill("#migrate-states", "AtDepot=OnShelf");
      await page.evaluate(() => current.refresh());
      ok((await page.inputValue("#migrate-states")) === "AtDepot=OnShelf", "the migration form keeps what was typed through a refresh");
      await page.click("#migrate-preview");
      await page.waitForSelector("#migrate-says");
      ok((await page.textContent("#migrate-says")).includes("to version 2 state OnShelf") && (await page.textContent("#migrate-plan")).includes("kept"),
        "the preview shows the plan, the timeout kept");
      ok((await call(s, "GET", "/instances/m-1")).version === "1", "a preview changes nothing");
      await page.click("#migrate-go");
      await page.waitForFunction(() => document.querySelector("#current-state") && document.querySelector("#current-state").textContent === "OnShelf", null, { timeout: LIVE });
      const moved = await call(s, "GET", "/instances/m-1");
      ok(moved.version === "2" && moved.state === "OnShelf", "Move moves the instance to version 2, state OnShelf");
      ok((await page.textContent("#timeline")).includes("moved from version 1 to 2"), "the history shows the move");
    }

    // Redrive from a failed instance's page: a preview of the data after the update (or why it
    // cannot go on), then the redrive; the instance completes and its history shows the change.
    {
      await post(s, "/definitions", {
        id: "checkout", name: "Checkout", version: "1",
        functions: [{ name: "charge", type: "expression", operation: 'if .card == null then error("no card") else {charged: .card} end' }],
        states: [{ name: "Charge", start: true,
          enterAction: { type: "invokeFunction", functionName: "charge", waitForCompletion: true, arguments: { card: "${ .card }" } },
          enterResultHandler: "${ .receipt = $value }" }],
      });
      await post(s, "/instances", { definition: "checkout", id: "r-1", input: { amount: 3 } });
      await reach(s, "r-1", "failed");
      await page.goto(s.url + "/ui#/instance/r-1");
      await page.waitForSelector("#redrive-box summary");
      await page.click("#redrive-box summary");
      ok(await page.isDisabled("#redrive-go"), "the redrive waits for its preview");
      await page.fill("#redrive-update", ".card = ");
      await page.click("#redrive-preview");
      await page.waitForSelector("#redrive-refused");
      ok((await page.textContent("#redrive-refused")).includes("invalidUpdate"), "a bad update is refused: " + await page.textContent("#redrive-refused"));
      ok(await page.isDisabled("#redrive-go"), "and cannot be redriven");
      await page.fill("#redrive-update", '.card = "4242"');
      await page.evaluate(() => current.refresh());
      ok((await page.inputValue("#redrive-update")) === '.card = "4242"', "the redrive form keeps what was typed through a refresh");
      await page.click("#redrive-preview");
      await page.waitForSelector("#redrive-data");
      ok(JSON.parse(await page.textContent("#redrive-data")).card === "4242", "the preview shows the data after the update");
      ok((await page.textContent("#redrive-diff")).includes("add /card"), "and what it changes");
      ok((await call(s, "GET", "/instances/r-1")).status === "failed", "a preview changes nothing");
      await page.click("#redrive-go");
      await reach(s, "r-1", "completed");
      const done = await call(s, "GET", "/instances/r-1");
      ok(done.data.receipt.charged === "4242", "Redrive sends the instance on with the update: " + JSON.stringify(done.data));
      await page.waitForFunction(() => document.querySelector("#timeline") && document.querySelector("#timeline").textContent.includes("redriven with update"), null, { timeout: LIVE });
      ok((await page.textContent("#timeline")).includes("add /card"), "the history shows the redrive and its data change");
      ok(!(await page.$("#redrive-box")), "a completed instance offers no redrive");
    }

    const schedules = await scheduleChecks(page, s);
    await batchChecks(page, s);

    // The server restarts: the page reconnects and is live again.
    await page.goto(s.url + "/ui#/instances");
    await page.waitForSelector("#live.on", { timeout: LIVE });
    await stop(s);
    await page.waitForSelector("#live.off", { timeout: LIVE });
    ok(true, "the page notices the server went away");
    // A page opened while the server is away cannot be shown; it is, once the server is back (it
    // stayed broken before: CI once opened the list just as the server was killed).
    await page.goto(s.url + "/ui#/definitions");
    await page.goto(s.url + "/ui#/instances");
    await page.waitForSelector("text=Could not show this page", { timeout: LIVE });
    s = await serve(tmp, port);
    await page.waitForSelector("#live.on", { timeout: 10000 });
    // The list's page, drawn (its rows: in Kafka mode a restarted worker lists its instances once it
    // has restored its partitions, and the page reads them again every 10 s).
    await page.waitForSelector("#filters", { timeout: LIVE });
    ok(!(await page.isVisible("text=Could not show this page")),
      "a page that could not be shown while the server was away is shown when it is back");
    await start(s, "order", "o-5", { orderId: "F6" });
    // A restarted Kafka worker takes the start once it has restored the partition (longer on a busy
    // machine); the live update follows.
    await page.waitForSelector('#instances tr[data-id="o-5"]', { timeout: KAFKA ? 4 * LIVE : LIVE });
    ok(true, "after the restart the page is live again");
    ok(errors.length === 0, "no script error on the page: " + errors.join("; "));

    // With tokens: the page loads, asks for one, and reads with it.
    const authDir = fs.mkdtempSync(path.join(os.tmpdir(), "sm4c-inspector-auth-"));
    // A Kafka worker with tokens also needs the peer token its group's workers share.
    const peer = KAFKA ? `peer_token = "inspector-peer-token-0123456789"\n` : "";
    const a = await serve(authDir, await freePort(), `[server]\ntokens = [ { role = "admin", token = "${TOKEN}" }, { role = "read", token = "${READ_TOKEN}" } ]\n${peer}`);
    await post(a, "/definitions", order, { Authorization: "Bearer " + TOKEN });
    await post(a, "/instances", { definition: "order", id: "secret-1", input: { orderId: "Z" } }, { Authorization: "Bearer " + TOKEN });
    await page.goto(a.url + "/ui");
    await page.waitForSelector("#banner:not([hidden])");
    ok((await page.textContent("#banner")).includes("Token"), "without a token the page says to enter one");
    ok((await page.$$("#instances tbody tr")).length === 0, "without a token no data is shown");
    await page.fill("#token", TOKEN);
    await page.press("#token", "Enter");
    await page.waitForSelector('#instances tr[data-id="secret-1"]');
    await page.waitForSelector("#live.on", { timeout: LIVE });
    ok(true, "with the token the list and the live stream work");
    await post(a, "/instances", { definition: "order", id: "secret-2", input: { orderId: "Y" } }, { Authorization: "Bearer " + TOKEN });
    await page.waitForSelector('#instances tr[data-id="secret-2"]', { timeout: LIVE });
    ok(true, "live updates come through with the token");

    // With tokens, the schedule's buttons send the page's token: an admin token pauses, a read
    // token is refused, and the page says so with the code.
    if (schedules) {
      const admin = { Authorization: "Bearer " + TOKEN };
      await post(a, "/schedules", { id: "guarded", definition: "order", every: "PT1H" }, admin);
      await page.goto(a.url + "/ui#/schedule/guarded");
      await page.click("#sched-pause");
      await page.waitForSelector('h1 .badge[data-status="paused"]');
      ok((await call(a, "GET", "/schedules/guarded", undefined, admin)).state === "paused", "with an admin token, Pause pauses the schedule");
      await page.goto(a.url + "/ui#/schedules");
      await page.fill("#token", READ_TOKEN);
      await page.press("#token", "Enter");
      await page.waitForSelector('#schedules tr[data-id="guarded"] .badge[data-status="paused"]');
      await page.click('#schedules a[href="#/schedule/guarded"]');
      await page.click("#sched-resume");
      await page.waitForSelector("#banner:not([hidden]):not(.info)");
      const said = await page.textContent("#banner");
      ok(said.startsWith("forbidden: ") && said.includes("does not allow it"), `with a read token, Resume is refused and the page says why (${said})`);
      ok((await call(a, "GET", "/schedules/guarded", undefined, admin)).state === "paused", "and the schedule stays paused");
    }
  } finally {
    await context.close();
    for (const c of servers) if (c.exitCode === null) c.kill("SIGKILL");
  }
  console.log(`inspector: ${checks} checks passed in a real browser${KAFKA ? " (Kafka mode)" : ""}`);
}

main().catch(e => {
  console.error(e && e.stack || e);
  for (const c of servers) if (c.exitCode === null) c.kill("SIGKILL");
  process.exit(1);
});
