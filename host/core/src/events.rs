//! CloudEvents read through the SDK, for hosts that take them from HTTP or Kafka.

use serde_json::Value;

/// A CloudEvent read through the SDK, in the JSON form the engine takes; a JSON body sent in
/// binary mode becomes JSON `data`. Data nested deeper than [`sm4c_runtime::json::MAX_DEPTH`]
/// levels is refused, saying so.
pub fn event_json(event: &cloudevents::Event) -> Result<Value, String> {
    use cloudevents::AttributesReader;
    let mut value = serde_json::to_value(event).map_err(|e| e.to_string())?;
    if let Some(cloudevents::Data::Binary(bytes)) = event.data() {
        let json_type = event
            .datacontenttype()
            .is_some_and(|t| t.starts_with("application/json") || t.contains("+json") || t.starts_with("text/json"));
        if json_type {
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
