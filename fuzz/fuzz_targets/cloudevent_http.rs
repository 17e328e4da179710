//! CloudEvents from HTTP, as `POST /events` reads them (host/api `read_event`): the bytes are header lines
//! (`name: value`, one a line) then an empty line then the body; binary mode (`ce-*` headers) and structured
//! mode (`content-type: application/cloudevents+json`) both go through cloudevents-sdk's HTTP binding and
//! then `sm4c_host::events::event_json`. Either gives an event or an error, never a panic.
#![no_main]

use http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match split {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (&data[..0], data),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    if let Ok(event) = cloudevents::binding::http::to_event(&headers, body.to_vec()) {
        let _ = sm4c_host::events::event_json(&event);
    }
});
