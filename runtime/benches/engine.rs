//! Engine throughput on the counter loop, in SM4C and in ASL, with the same number of transitions.
//! SM4C (`counter_loop`): two states per iteration, an injectData enter action with a result handler,
//! and two condition transitions. ASL (`asl_counter_loop`): a Pass that adds 1 with `States.MathAdd`
//! and a Choice that loops back. Reports transitions per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use sm4c_runtime::{load, no_files, Input, Instance, LoadOptions, Machine, Options, Status, Timed};
use std::sync::Arc;

fn counter() -> Value {
    serde_json::from_str(include_str!("../../bench/counter/counter.json")).expect("counter.json")
}

fn asl_counter() -> Value {
    serde_json::from_str(include_str!("../../bench/counter/counter.asl.json")).expect("counter.asl.json")
}

/// Runs the loop `name` with and without the journal: `iterations` iterations of two transitions
/// each (Inc -> Check -> Inc); the last one goes to Done.
fn group(c: &mut Criterion, name: &str, definition: &Value, iterations: u64) {
    let machine: Arc<Machine> = Arc::new(load(definition, &mut no_files, LoadOptions::default()).expect("valid"));
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(2 * iterations));
    for (variant, options) in [
        ("journal", Options::default()),
        (
            "no_journal",
            Options {
                journal: false,
                ..Options::default()
            },
        ),
    ] {
        group.bench_function(variant, |b| {
            b.iter(|| {
                let mut i = Instance::new(machine.clone(), "bench", options);
                i.handle(Timed {
                    at: 0,
                    input: Input::Start {
                        data: json!({"count": 0, "limit": iterations}),
                        scheduled: None,
                    },
                });
                assert_eq!(i.status(), Status::Completed);
                i
            })
        });
    }
    group.finish();
}

fn bench(c: &mut Criterion) {
    let iterations = 10_000u64;
    group(c, "counter_loop", &counter(), iterations);
    group(c, "asl_counter_loop", &asl_counter(), iterations);
}

criterion_group!(benches, bench);
criterion_main!(benches);
