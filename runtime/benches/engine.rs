//! Engine throughput on the counter loop: two states per iteration, an injectData enter action with
//! a result handler, and two condition transitions. Reports transitions per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use sm4c_runtime::{load, no_files, Input, Instance, LoadOptions, Options, Status, Timed};
use std::sync::Arc;

fn counter() -> Value {
    serde_json::from_str(include_str!("../../bench/counter/counter.json")).expect("counter.json")
}

fn bench(c: &mut Criterion) {
    let machine = Arc::new(load(&counter(), &mut no_files, LoadOptions::default()).expect("valid"));
    let iterations = 10_000u64;
    let mut group = c.benchmark_group("counter_loop");
    // Each iteration is two transitions (Inc -> Check -> Inc); the last one goes to Done.
    group.throughput(Throughput::Elements(2 * iterations));
    for (name, options) in [
        ("journal", Options::default()),
        (
            "no_journal",
            Options {
                journal: false,
                ..Options::default()
            },
        ),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut i = Instance::new(machine.clone(), "bench", options);
                i.handle(Timed {
                    at: 0,
                    input: Input::Start {
                        data: json!({"count": 0, "limit": iterations}),
                    },
                });
                assert_eq!(i.status(), Status::Completed);
                i
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
