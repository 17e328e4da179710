//! An application that embeds sm4c with only the in-memory host: one function written in Rust,
//! one instance run to its end. CI builds this example with a target folder of its own and no
//! cmake on the PATH, which shows that embedding the in-memory host needs no librdkafka, SQLite,
//! tonic or axum (`scripts/check-deps.sh`).
//!
//! Run it: `cargo run -p sm4c-host --example embed`.

use serde_json::{json, Value};
use sm4c_host::{BoxFuture, Clock, Config, FunctionCall, Functions, InMemoryHost};
use sm4c_runtime::{load, no_files, ErrorInfo, ErrorKind, LoadOptions, Status};
use std::process::ExitCode;
use std::sync::Arc;

/// The application's functions.
struct Shop;

impl Functions for Shop {
    fn invoke(&self, call: FunctionCall) -> BoxFuture<'static, Result<Value, ErrorInfo>> {
        let result = match call.function.as_str() {
            "price" => {
                let qty = call.arguments["qty"].as_f64().unwrap_or(0.0);
                Ok(json!(qty * 2.5))
            }
            other => Err(ErrorInfo::new(ErrorKind::FunctionError, format!("no function {other}"))),
        };
        Box::pin(async move { result })
    }
}

fn main() -> ExitCode {
    let definition = json!({
        "id": "quote", "name": "Quote", "version": "1.0",
        "functions": [{"name": "price", "operation": "shop#price"}],
        "states": [
            {"name": "Price", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "price",
                             "arguments": {"qty": "${ .qty }"}, "waitForCompletion": true},
             "enterResultHandler": "${ .total = $value }",
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    });
    let machine = match load(&definition, &mut no_files, LoadOptions::default()) {
        Ok(m) => Arc::new(m),
        Err(errors) => {
            for e in errors {
                eprintln!("definition: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = rt.block_on(async {
        let host = InMemoryHost::new(
            Arc::new(Shop),
            Config {
                clock: Clock::Virtual { start: 0 },
                ..Config::default()
            },
        );
        let id = host.start(machine, json!({"qty": 4})).await;
        host.outcome(&id).await
    });
    println!("{}", outcome.data);
    if outcome.status == Status::Completed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
