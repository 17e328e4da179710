//! `sm4c test`: runs the tests of `*.test.json` and `*.test.yaml` files (given inputs, mocks and
//! events, what an instance does: its status, the states it enters, its data, the events it
//! sends, its error, the calls it makes), in parallel, and reports each test, the coverage of each
//! definition, and optionally JSON and JUnit XML. `sm4c test-state` ([`state`]) runs one state.

pub mod coverage;
pub mod expect;
pub mod file;
pub mod host;
pub mod junit;
pub mod state;

use crate::files::FileError;
use expect::Failure;
use serde_json::{json, Value};
use sm4c_runtime::{Limits, Options};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// The arguments of `sm4c test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Test files, or folders searched (recursively) for `*.test.json`, `*.test.yaml` and
    /// `*.test.yml` files; default: the current folder.
    paths: Vec<PathBuf>,
    /// Run only the tests whose name contains TEXT.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Print the results and the coverage as one JSON document on stdout, instead of text.
    #[arg(long)]
    json: bool,
    /// Write a JUnit XML report to FILE.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Exit 1 when the transition coverage of any definition is below PCT percent.
    #[arg(long, value_name = "PCT", value_parser = percent)]
    min_coverage: Option<f64>,
    /// Tests run at the same time (default: the number of cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    jobs: Option<u16>,
}

fn percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 100"))
    }
}

/// The result of one test.
pub struct TestResult {
    /// The test file, as found.
    pub file: String,
    /// The test's name.
    pub name: String,
    /// True when every expectation held.
    pub passed: bool,
    /// Every difference.
    pub failures: Vec<Failure>,
    /// How long it took, in milliseconds (wall clock, for the report only).
    pub ms: u64,
    /// How the instance ended, when it did not complete.
    pub note: Option<String>,
    /// What it reached of its definition.
    pub reached: coverage::Reached,
    /// What its subflows reached of theirs, by definition id.
    pub children: Vec<(String, coverage::Reached)>,
}

/// The test files under `paths`: files as given, folders searched recursively (hidden folders,
/// `target` and `node_modules` skipped), in name order.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, FileError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_file() {
            out.push(p.clone());
            continue;
        }
        if !p.is_dir() {
            return Err(crate::files::ferr(p, "/", "no such file or folder"));
        }
        let walk = walkdir::WalkDir::new(p)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| {
                e.depth() == 0
                    || !e.file_type().is_dir()
                    || !e
                        .file_name()
                        .to_str()
                        .is_some_and(|n| n.starts_with('.') || n == "target" || n == "node_modules")
            });
        for e in walk {
            let e = e.map_err(|e| crate::files::ferr(p, "/", format!("cannot read folder: {e}")))?;
            let name = e.file_name().to_string_lossy();
            if e.file_type().is_file()
                && [".test.json", ".test.yaml", ".test.yml"]
                    .iter()
                    .any(|s| name.ends_with(s))
            {
                out.push(e.into_path());
            }
        }
    }
    Ok(out)
}

/// `sm4c test`.
pub fn run(args: TestArgs) -> ExitCode {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.paths.clone()
    };
    let found = match discover(&paths) {
        Ok(f) => f,
        Err(e) => return crate::report(&[e]),
    };
    if found.is_empty() {
        eprintln!(
            "sm4c: no test files (*.test.json, *.test.yaml) in {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(2);
    }
    let mut errs = Vec::new();
    let mut loaded = Vec::new();
    for p in &found {
        match file::load(p, Limits::default()) {
            Ok(f) => loaded.push(f),
            Err(e) => errs.extend(e),
        }
    }
    if !errs.is_empty() {
        return crate::report(&errs);
    }
    let jobs: Vec<(usize, usize)> = loaded
        .iter()
        .enumerate()
        .flat_map(|(f, file)| {
            file.tests
                .iter()
                .enumerate()
                .filter(|(_, t)| args.filter.as_ref().is_none_or(|text| t.name.contains(text.as_str())))
                .map(move |(t, _)| (f, t))
        })
        .collect();
    if jobs.is_empty() {
        eprintln!(
            "sm4c: no test name contains {:?}",
            args.filter.as_deref().unwrap_or_default()
        );
        return ExitCode::from(2);
    }
    let workers = args
        .jobs
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(jobs.len());
    let results = run_all(&loaded, &jobs, workers, !args.json);
    let mut defs: Defs = BTreeMap::new();
    let mut warnings = BTreeSet::new();
    for (&(f, t), r) in jobs.iter().zip(&results) {
        let m = &loaded[f].machine;
        let shown = loaded[f].definition_path.display().to_string();
        warnings.extend(merge(&mut defs, m, shown, &r.reached));
        let test = &loaded[f].tests[t];
        for (id, reached) in &r.children {
            if let Some(sub) = test.subflows.get(id) {
                let shown = match &test.subflows_dir {
                    Some(d) => format!("a subflow in {}", d.display()),
                    None => "a subflow".into(),
                };
                warnings.extend(merge(&mut defs, sub, shown, reached));
            }
        }
    }
    for w in &warnings {
        eprintln!("{w}");
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    let mut below = Vec::new();
    for (id, (_, items, reached)) in &defs {
        let [_, (_, t), _] = coverage::counts(items, reached);
        if let Some(min) = args.min_coverage {
            if t.percent() < min {
                below.push(format!(
                    "sm4c: the transition coverage of {id:?} is {:.1}% ({}/{}), below --min-coverage {min}",
                    t.percent(),
                    t.covered,
                    t.total
                ));
            }
        }
    }
    if args.json {
        let doc = json_report(&results, &defs);
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_coverage(&defs);
        println!("\n{} passed, {failed} failed", results.len() - failed);
    }
    if let Some(path) = &args.junit {
        if let Err(e) = std::fs::write(path, junit::report(&results)) {
            eprintln!("sm4c: --junit {}: cannot write: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    for b in &below {
        eprintln!("{b}");
    }
    if failed > 0 || !below.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs the tests `jobs` names on `workers` threads; prints each result (when `print`) in the
/// order of `jobs`, as soon as those before it are done.
fn run_all(loaded: &[file::TestFile], jobs: &[(usize, usize)], workers: usize, print: bool) -> Vec<TestResult> {
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, TestResult)>();
    let mut done: Vec<Option<TestResult>> = (0..jobs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        for w in 0..workers {
            let (tx, next) = (tx.clone(), &next);
            let spawned = std::thread::Builder::new()
                .name(format!("sm4c-test-{w}"))
                .stack_size(crate::STACK)
                .spawn_scoped(s, move || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(f, t)) = jobs.get(i) else { break };
                    if tx.send((i, one(&loaded[f], t))).is_err() {
                        break;
                    }
                });
            if let Err(e) = spawned {
                eprintln!("sm4c: cannot start a thread for tests ({e}); running on fewer");
            }
        }
        drop(tx);
        let mut printed = 0;
        let mut last_file: Option<usize> = None;
        let stdout = std::io::stdout();
        for (i, r) in rx {
            done[i] = Some(r);
            while printed < jobs.len() {
                let Some(r) = &done[printed] else { break };
                if print {
                    let mut out = stdout.lock();
                    let f = jobs[printed].0;
                    if last_file != Some(f) {
                        let _ = writeln!(out, "{}", r.file);
                        last_file = Some(f);
                    }
                    let _ = writeln!(out, "{}", line(r));
                }
                printed += 1;
            }
        }
    });
    // A thread that could not start leaves its share to the others; one that died leaves gaps.
    done.into_iter()
        .zip(jobs)
        .map(|(r, &(f, t))| {
            r.unwrap_or_else(|| TestResult {
                file: loaded[f].path.display().to_string(),
                name: loaded[f].tests[t].name.clone(),
                passed: false,
                failures: Vec::new(),
                ms: 0,
                note: Some("the test did not run: its thread stopped".into()),
                reached: Default::default(),
                children: Vec::new(),
            })
        })
        .collect()
}

/// A test's lines: `✓ name (N ms)`, or `✗ name (N ms)` with each difference below it.
fn line(r: &TestResult) -> String {
    let mut s = format!("  {} {} ({} ms)", if r.passed { "✓" } else { "✗" }, r.name, r.ms);
    if !r.passed {
        for f in &r.failures {
            for (i, l) in expect::render(f).lines().enumerate() {
                s.push_str(if i == 0 { "\n      " } else { "\n        " });
                s.push_str(l);
            }
        }
        if let Some(n) = &r.note {
            s.push_str(&format!("\n      ({n})"));
        }
    }
    s
}

/// Runs test `t` of `file`.
fn one(file: &file::TestFile, t: usize) -> TestResult {
    let test = &file.tests[t];
    let started = Instant::now();
    let ran = host::run(host::Setup {
        machine: file.machine.clone(),
        input: test.input.clone(),
        mocks: test.mocks.clone(),
        events: test.events.clone(),
        subflows: &test.subflows,
        virtual_time: test.virtual_time,
        scheduled: test.scheduled.clone(),
        max_transitions: Options::default().max_transitions,
    });
    let ms = started.elapsed().as_millis() as u64;
    let (failures, note, reached, children) = match ran {
        Ok(ran) => {
            let mut failures = ran.problems.clone();
            failures.extend(expect::check(&test.expect, &ran.actual));
            let reached = coverage::Reached {
                states: ran
                    .actual
                    .states
                    .iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect::<BTreeSet<_>>(),
                pointers: ran.covered,
            };
            (failures, ran.note, reached, ran.children)
        }
        Err(e) => (
            vec![Failure {
                path: "/".into(),
                expected: json!("the test runs"),
                actual: Some(json!(e)),
            }],
            None,
            Default::default(),
            Vec::new(),
        ),
    };
    TestResult {
        file: file.path.display().to_string(),
        name: test.name.clone(),
        passed: failures.is_empty(),
        failures,
        ms,
        note,
        reached,
        children,
    }
}

/// Each definition's coverage, by id: where it is (as the report shows it), what it has to cover
/// and what the tests reached.
type Defs = BTreeMap<String, (String, coverage::Items, coverage::Reached)>;

/// Adds what a run reached of `m` to its definition's coverage.
/// Returns a warning when another definition with the same id, and other states, transitions or
/// actions, was counted before: then the counts mix the two.
fn merge(defs: &mut Defs, m: &sm4c_runtime::Machine, shown: String, reached: &coverage::Reached) -> Option<String> {
    let mut warning = None;
    let entry = match defs.entry(m.id.clone()) {
        std::collections::btree_map::Entry::Vacant(v) => v.insert((shown, coverage::items(m), Default::default())),
        std::collections::btree_map::Entry::Occupied(o) => {
            let entry = o.into_mut();
            if entry.0 != shown && entry.1 != coverage::items(m) {
                warning = Some(format!(
                    "sm4c: warning: {} and {shown} are different definitions with the same id {:?}: their coverage is counted together, against the first",
                    entry.0, m.id
                ));
            }
            entry
        }
    };
    entry.2.states.extend(reached.states.iter().cloned());
    entry.2.pointers.extend(reached.pointers.iter().cloned());
    warning
}

fn print_coverage(defs: &Defs) {
    for (id, (path, items, reached)) in defs {
        println!("\ncoverage of {id} ({path}):");
        for (kind, c) in coverage::counts(items, reached) {
            println!("  {kind:<12} {}/{} ({:.1}%)", c.covered, c.total, c.percent());
            for m in &c.missed {
                if m.key == m.label {
                    println!("    missed: {}", m.key);
                } else {
                    println!("    missed: {}  {}", m.key, m.label);
                }
            }
        }
    }
}

fn json_report(results: &[TestResult], defs: &Defs) -> Value {
    let tests: Vec<Value> = results
        .iter()
        .map(|r| {
            json!({
                "file": r.file,
                "name": r.name,
                "passed": r.passed,
                "failures": r.failures.iter().map(|f| json!({
                    "path": f.path,
                    "expected": f.expected,
                    "actual": f.actual.clone().unwrap_or(Value::Null),
                })).collect::<Vec<_>>(),
                "ms": r.ms,
            })
        })
        .collect();
    let failed = results.iter().filter(|r| !r.passed).count();
    let mut cov = serde_json::Map::new();
    for (id, (_, items, reached)) in defs {
        let mut o = serde_json::Map::new();
        for (kind, c) in coverage::counts(items, reached) {
            o.insert(kind.into(), c.to_json());
        }
        cov.insert(id.clone(), Value::Object(o));
    }
    json!({
        "tests": tests,
        "passed": results.len() - failed,
        "failed": failed,
        "coverage": cov,
    })
}

/// The pointers of the transitions `result` (a `sm4c test --json` document) lists as missed for
/// definition `id`, for `sm4c graph --coverage`.
pub fn missed_transitions(result: &Path, id: &str) -> Result<BTreeSet<String>, FileError> {
    let doc = crate::files::read_json(result)?;
    let Some(cov) = doc.get("coverage").and_then(Value::as_object) else {
        return Err(crate::files::ferr(
            result,
            "/coverage",
            "missing: not the output of `sm4c test --json`",
        ));
    };
    let at = format!("/coverage/{}/transitions/missed", file::esc(id));
    let Some(def) = cov.get(id) else {
        let known: Vec<&String> = cov.keys().collect();
        return Err(crate::files::ferr(
            result,
            format!("/coverage/{}", file::esc(id)),
            format!("no coverage of definition {id:?} (it has {known:?}): run its tests with --json"),
        ));
    };
    match def.pointer("/transitions/missed").and_then(Value::as_array) {
        Some(list) => Ok(list.iter().filter_map(Value::as_str).map(str::to_string).collect()),
        None => Err(crate::files::ferr(result, at, "missing: a list of JSON pointers")),
    }
}
