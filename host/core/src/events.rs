//! CloudEvents read through the SDK, for hosts that take them from HTTP or Kafka.

use serde_json::Value;

/// A CloudEvent read through the SDK, in the JSON form the engine takes; a JSON body sent in
/// binary mode becomes JSON `data`. Data nested deeper than [`sm4c_runtime::json::MAX_DEPTH`]
/// levels is refused, saying so.
pub fn event_json(event: &cloudevents::Event) -> Result<Value, String> {
    use cloudevents::AttributesReader;
    let mut value = serde_json::to_value(event).map_err(|e| e.to_string())?;
    if let Some(cloudevents::Data::Binary(bytes)) = event.data() {
        if event.datacontenttype().is_some_and(is_json_media_type) {
            let data: Value = serde_json::from_slice(bytes)
                .map_err(|e| format!("the event says its data is JSON but it is not: {e}"))?;
            if let Some(o) = value.as_object_mut() {
                o.remove("data_base64");
                o.insert("data".into(), data);
            }
        }
    }
    if let Some(data) = value.get("data") {
        sm4c_runtime::json::check_depth(data, "the event's data")?;
    }
    Ok(value)
}

/// True when `content_type` is a JSON media type, parsed (parameters such as `charset` allowed):
/// `application/json`, `application/*+json` (`application/cloudevents+json`, ...) and `text/json`.
/// Matching text would take `text/plain;a=+json` or `application/jsonp` for JSON.
pub fn is_json_media_type(content_type: &str) -> bool {
    let Ok(m) = content_type.trim().parse::<mime::Mime>() else {
        return false;
    };
    match m.type_() {
        mime::APPLICATION => m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON),
        mime::TEXT => m.subtype() == mime::JSON,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types_are_parsed_not_matched() {
        for t in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/cloudevents+json",
            "application/vnd.example+json;v=2",
            "text/json",
        ] {
            assert!(is_json_media_type(t), "{t} is JSON");
        }
        for t in [
            "text/plain;a=+json",
            "text/plain; charset=+json",
            "application/jsonp",
            "application/json-seq",
            "application/xml; note=application/json",
            "application/octet-stream",
            "json",
            "",
        ] {
            assert!(!is_json_media_type(t), "{t} is not JSON");
        }
    }

    #[test]
    fn binary_data_becomes_json_data_only_for_a_json_media_type() {
        use cloudevents::{EventBuilder, EventBuilderV10};
        let event = |t: &str| {
            EventBuilderV10::new()
                .id("e-1")
                .source("test")
                .ty("order.created")
                .data(t.to_owned(), br#"{"n": 1}"#.to_vec())
                .build()
                .expect("event")
        };
        let v = event_json(&event("application/cloudevents+json; charset=utf-8")).expect("json");
        assert_eq!(v["data"], serde_json::json!({"n": 1}), "{v}");
        let v = event_json(&event("text/plain;a=+json")).expect("kept as bytes");
        assert!(v.get("data").is_none_or(|d| d != &serde_json::json!({"n": 1})), "{v}");
        assert!(v.get("data_base64").is_some(), "{v}");
    }
}
