//! The definitions written for the SM4C reference implementation run unmodified: they validate, match
//! the JSON Schema, and give the outputs the reference implementation gives.
//!
//! They live in `../shared/reference/sm4c`, beside the repository, and are not copied into it, so
//! this is not part of `cargo test`: `scripts/test.sh` runs it as its own step (`cargo test -p sm4c
//! --test reference`) when `../shared` is there, and says plainly that it skipped it when not.

#[path = "it/support/run.rs"]
mod run;

use run::{parse, sm4c, tmp, write, write_events};
use serde_json::{json, Value};
use sm4c_runtime::{load, no_files, LoadOptions};
use std::path::{Path, PathBuf};

fn folder() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/sm4c");
    assert!(
        dir.is_dir(),
        "{} is missing: the reference definitions sit in ../shared beside the repository",
        dir.display()
    );
    dir
}

fn reference(file: &str) -> String {
    folder().join(file).to_str().expect("utf-8 path").to_string()
}

fn credit_check(decision: Option<&str>, extra: &[&str]) -> (i32, String, String) {
    let d = tmp();
    let mock = write(
        d.path(),
        "mock.json",
        &json!({"creditCheckFunction": "{ submitted: true }"}),
    );
    let events: Vec<Value> = decision
        .map(|dec| {
            json!({"specversion":"1.0","id":"e1","source":"creditCheckSource","type":"creditCheckCompleteType",
                   "customerid":"c-1","data":{"decision": dec}})
        })
        .into_iter()
        .collect();
    let ev = write_events(d.path(), "events.ndjson", &events);
    let input = write(d.path(), "input.json", &json!({"customer": {"id": "c-1"}}));
    let def = reference("customercreditcheck.json");
    let mut args = vec!["run", &def, "--input", &input, "--mock", &mock, "--events", &ev];
    args.extend_from_slice(extra);
    sm4c(&args)
}

#[test]
fn reference_helloworld() {
    let (code, out, err) = sm4c(&["run", &reference("helloworld.json")]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out), json!({"result": "Hello World!"}));
    assert_eq!(err, "");
}

#[test]
fn reference_credit_check_approved() {
    let (code, out, err) = credit_check(Some("Approved"), &[]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["status"], "approved", "{v}");
    assert_eq!(v["creditCheck"], json!({"decision": "Approved"}));
}

#[test]
fn reference_credit_check_denied() {
    let (code, out, err) = credit_check(Some("Denied"), &[]);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(parse(&out)["status"], "denied");
}

#[test]
fn reference_credit_check_times_out_without_event() {
    let (code, out, err) = credit_check(None, &["--virtual-time", "-v"]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert!(v.get("status").is_none(), "{v}");
    assert!(v.get("creditCheck").is_none(), "{v}");
    assert!(err.contains("CreditCheckTimedOut"), "stderr:\n{err}");
    assert!(!err.contains("EvaluateDecision"), "stderr:\n{err}");
}

fn travel(events: &[Value]) -> (i32, String, String) {
    let d = tmp();
    let mock = write(
        d.path(),
        "mock.json",
        &json!({
            "callFlightReservationMicroservice": "{ requested: true }",
            "callFlightReservationUndoMicroservice": "{ undone: true }",
            "callHotelReservationMicroservice": "{ requested: true }",
            "callAutoReservationMicroservice": "{ requested: true }",
            "reportErrors": "null"
        }),
    );
    let ev = write_events(d.path(), "events.ndjson", events);
    let input = write(d.path(), "input.json", &json!({"flightDetails": {"to": "AMS"}}));
    sm4c(&[
        "run",
        &reference("travelbookingsaga.json"),
        "--input",
        &input,
        "--mock",
        &mock,
        "--events",
        &ev,
        "-v",
    ])
}

fn reservation(id: &str, ty: &str, data: Value) -> Value {
    json!({"specversion":"1.0","id":id,"source":"reservationSystem","type":ty,"data":data})
}

#[test]
fn reference_travel_saga_books_everything() {
    let (code, out, err) = travel(&[
        reservation("f1", "FlightBooked", json!({"flight": "TP662"})),
        reservation("h1", "HotelBooked", json!({"hotel": "Canal House"})),
        reservation("a1", "AutoBooked", json!({"car": "Polo"})),
    ]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["bookedFlight"], json!({"flight": "TP662"}), "{v}");
    assert_eq!(v["bookedHotel"], json!({"hotel": "Canal House"}), "{v}");
    assert_eq!(v["bookedAuto"], json!({"car": "Polo"}), "{v}");
    assert!(v.get("error").is_none(), "{v}");
    assert!(err.contains("\"Done\""), "stderr:\n{err}");
}

#[test]
fn reference_travel_saga_hotel_failure_compensates() {
    let (code, out, err) = travel(&[
        reservation("f1", "FlightBooked", json!({"flight": "TP662"})),
        reservation("h1", "HotelBookingFailed", json!({"reason": "full"})),
    ]);
    assert_eq!(code, 0, "stderr:\n{err}");
    let v = parse(&out);
    assert_eq!(v["error"], json!({"reason": "full"}), "{v}");
    assert!(v.get("bookedHotel").is_none(), "{v}");
    for state in ["UndoFlightReservation", "ReportError", "Done"] {
        assert!(
            err.contains(&format!("enter state \"{state}\"")),
            "no {state} in stderr:\n{err}"
        );
    }
}

#[test]
fn reference_definitions_validate() {
    let files: Vec<String> = [
        "helloworld.json",
        "customercreditcheck.json",
        "travelbookingsaga.json",
        "greeting.json",
    ]
    .iter()
    .map(|f| reference(f))
    .collect();
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let (code, out, err) = sm4c(&args);
    assert_eq!(code, 0, "stderr:\n{err}");
    assert_eq!(out, "");
    assert_eq!(err, "");
}

#[test]
fn reference_definitions_match_the_json_schema_and_load() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas/sm4c.schema.json"))
            .expect("schemas/sm4c.schema.json"),
    )
    .expect("the schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let mut n = 0;
    for e in std::fs::read_dir(folder()).expect("reference folder").flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        n += 1;
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", p.display());
        assert!(
            load(&doc, &mut no_files, LoadOptions::default()).is_ok(),
            "validator refuses {}",
            p.display()
        );
    }
    assert!(n >= 4, "only {n} reference definitions");
}
