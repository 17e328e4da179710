//! `sm4c serve --kafka`: the worker of a consumer group, its librdkafka settings and the URL it
//! advertises to the others.

use super::{listen, metrics, report_listening, serve_runtime, served_functions, shutdown_signal};
use crate::args::ServeArgs;
use crate::forward;
use crate::security::{connections, door, Security};
use crate::traces;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[allow(clippy::too_many_arguments)]
pub fn serve_kafka(
    args: &ServeArgs,
    bootstrap: &str,
    docs: Vec<(PathBuf, serde_json::Value)>,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    calls: sm4c_invoke::config::CallConfig,
    park_ms: u64,
    security: Security,
    traces: Option<Arc<traces::Traces>>,
) -> anyhow::Result<ExitCode> {
    let mut config = sm4c_kafka::KafkaConfig::new(bootstrap);
    config.group = args.kafka.group.clone();
    config.prefix = args.kafka.topic_prefix.clone();
    config.events_topics = args.kafka.events_topics.clone();
    config.exactly_once = args.kafka.delivery == "exactly-once";
    config.partitions = args.kafka.partitions;
    config.event_window_ms = park_ms as i64;
    config.max_parked = args.kafka.max_parked;
    config.max_redrives = args.max_redrives;
    config.cached_instances = args.kafka.cached_instances;
    config.group_instance_id = args.kafka.group_instance_id.clone();
    config.batch_rate = args.batch_rate;
    config.retention_ms = match sm4c_runtime::timespan::parse(&args.kafka.retention) {
        Ok(ms) => ms as i64,
        Err(e) => {
            eprintln!("sm4c: --retention {:?}: {e}", args.kafka.retention);
            return Ok(ExitCode::from(2));
        }
    };
    config.expression = args.expression.limits();
    let conns = connections(args)?;
    match kafka_settings(&args.kafka.kafka_config, &args.kafka.kafka_config_env, |v| {
        std::env::var(v).ok()
    }) {
        Ok(settings) => config.settings.extend(settings),
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    }
    let stores = match &args.kafka.state_dir {
        Some(dir) => sm4c_durable::local::SqliteStores::open(dir),
        None => sm4c_durable::local::SqliteStores::temporary(),
    };
    let stores: Arc<dyn sm4c_host::local::LocalStores> = match stores {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("sm4c: --state-dir: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let rt = serve_runtime()?;
    rt.block_on(async move {
        let metrics = metrics(traces);
        let host = served_functions(args.definitions.as_deref(), calls, mocks, &metrics);
        let docs: Vec<serde_json::Value> = docs.into_iter().map(|(_, d)| d).collect();
        tracing::info!(state = %stores.describe(), "local stores of the owned partitions");
        let kafka = match sm4c_kafka::KafkaHost::start_with_stores(config, docs, host, Some(stores)).await {
            Ok(k) => k,
            Err(e) => {
                eprintln!("sm4c: cannot start on Kafka: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        let Some(listener) = listen(&args.listen).await else {
            return Ok(ExitCode::from(2));
        };
        let url = match &args.kafka.advertise {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => advertised(listener.local_addr()?, security.tls.is_some()),
        };
        kafka.advertise(url.clone());
        tracing::info!(listen = %listener.local_addr()?, advertise = %url, kafka = bootstrap, group = %args.kafka.group, https = security.tls.is_some(), auth = security.auth.is_on(), "sm4c serving on Kafka");
        report_listening(listener.local_addr()?, security.tls.is_some());
        let peers = match forward::Peers::new(security.tls_roots.as_deref()) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                eprintln!("sm4c: the client for the other workers: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        let api =
            sm4c_api::router_with(kafka.clone(), peers, security.peering).merge(sm4c_api::metrics::route(metrics));
        let door = door(args, security.auth.is_on(), listener.local_addr()?, Some(&url))?;
        let app = sm4c_api::door::layer(sm4c_api::auth::layer(api, security.auth), door);
        sm4c_api::tls::serve(listener, security.tls, conns, app, shutdown_signal()).await?;
        kafka.shutdown().await;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The librdkafka settings of `--kafka-config KEY=VALUE` and `--kafka-config-env KEY=VARIABLE`
/// (the value of the variable, read with `env`). Errors never quote a value: it may be a secret.
fn kafka_settings(
    given: &[String],
    from_env: &[String],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for kv in given {
        let Some((k, v)) = kv.split_once('=') else {
            let key = kv.split(':').next().unwrap_or_default();
            return Err(format!("--kafka-config {key:?}…: expected KEY=VALUE"));
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
    }
    for kv in from_env {
        let Some((k, var)) = kv
            .split_once('=')
            .filter(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
        else {
            return Err(format!(
                "--kafka-config-env {kv:?}: expected KEY=VARIABLE, e.g. sasl.password=KAFKA_PASSWORD"
            ));
        };
        let (k, var) = (k.trim(), var.trim());
        let Some(v) = env(var) else {
            return Err(format!(
                "--kafka-config-env {k}={var}: the environment variable {var} is not set"
            ));
        };
        // A setting given both ways takes the variable's value.
        out.retain(|(have, _)| have != k);
        out.push((k.to_string(), v));
    }
    Ok(out)
}

/// The URL of a worker's HTTP API listening at `addr`: a wildcard address becomes this machine's
/// host name (`/proc/sys/kernel/hostname`, else `HOSTNAME`, else `localhost`).
fn advertised(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into())
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("{scheme}://{host}:{}", addr.port())
}

#[cfg(test)]
mod tests {
    use super::kafka_settings;

    #[test]
    fn kafka_settings_come_from_the_flags_and_the_environment() {
        let env = |v: &str| (v == "KAFKA_PASSWORD").then(|| "s3cret=with=equals".to_string());
        let given = [
            "security.protocol=SASL_SSL".to_string(),
            "sasl.password=on-the-command-line".into(),
        ];
        let from_env = ["sasl.password=KAFKA_PASSWORD".to_string()];
        let got = kafka_settings(&given, &from_env, env).expect("settings");
        assert_eq!(
            got,
            vec![
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.password".to_string(), "s3cret=with=equals".to_string()),
            ],
            "the variable's value wins over the flag's"
        );
        let e = kafka_settings(&[], &["sasl.password=NOT_SET".into()], env).expect_err("unset");
        assert!(e.contains("NOT_SET is not set") && e.contains("sasl.password"), "{e}");
        for bad in ["sasl.password", "=VAR", "sasl.password="] {
            let e = kafka_settings(&[], &[bad.into()], env).expect_err(bad);
            assert!(e.contains("expected KEY=VARIABLE"), "{e}");
        }
        // A malformed --kafka-config does not quote what may be a secret.
        let e = kafka_settings(&["sasl.password:hunter2".into()], &[], env).expect_err("no =");
        assert!(!e.contains("hunter2") && e.contains("expected KEY=VALUE"), "{e}");
    }
}
