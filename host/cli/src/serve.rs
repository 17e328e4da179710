//! `sm4c serve`: the checks before the start, SQLite mode, and what both modes share (the runtime,
//! the called functions, the metrics, the API, the listening line, the stop on a signal). Kafka mode
//! is in [`kafka`]; who may use the server and the limits in front of it are in [`crate::security`].

mod kafka;

use crate::args::ServeArgs;
use crate::security::{connections, door, timespan, Security};
use crate::{files, memory, report, traces, STACK};
use sm4c_invoke::grpc::{self, GrpcInvoker};
use sm4c_invoke::router::CallRouter;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let park_ms =
        sm4c_runtime::timespan::parse(&args.event_window).map_err(|e| anyhow::anyhow!("--event-window: {e}"))?;
    connections(&args)?;
    timespan(&args.request_timeout, "--request-timeout")?;
    timespan(&args.work_budget, "--work-budget")?;
    let mut errs = Vec::new();
    let mut docs = Vec::new();
    if let Some(dir) = &args.definitions {
        let paths = match files::json_files(dir) {
            Ok(p) => p,
            Err(e) => return Ok(report(&[e])),
        };
        for p in paths {
            match files::load_definition(&p, args.expression.limits()) {
                Ok(m) => {
                    errs.extend(grpc::check_definition(&p, &m));
                    docs.push((p, m.source.clone()))
                }
                Err(e) => errs.extend(e),
            }
        }
    }
    let mocks = match &args.mock {
        Some(p) => files::load_mocks(p, args.expression.limits())
            .map_err(|e| errs.extend(e))
            .unwrap_or_default(),
        None => HashMap::new(),
    };
    let mut calls = args.calls.config()?.map_err(|e| errs.extend(e)).unwrap_or_default();
    // Definitions registered over HTTP come from the API's callers: private and link-local
    // addresses are refused unless the configuration allows them ([calls]).
    calls.apply(true);
    if !errs.is_empty() {
        return Ok(report(&errs));
    }
    let security = match Security::of(&args, &calls.server) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // Before the runtime: the exporter's blocking HTTP client is built outside async code.
    let traces = traces::Traces::configure(args.otlp_endpoint.as_deref())?.map(Arc::new);
    memory::spawn(std::time::Duration::from_secs(5));
    let code = serve_on(args, docs, mocks, calls, park_ms, security, traces.clone());
    if let Some(t) = traces {
        t.shutdown();
    }
    code
}

fn serve_on(
    args: ServeArgs,
    docs: Vec<(PathBuf, serde_json::Value)>,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    calls: sm4c_invoke::config::CallConfig,
    park_ms: u64,
    security: Security,
    traces: Option<Arc<traces::Traces>>,
) -> anyhow::Result<ExitCode> {
    use sm4c_durable::store::SqliteStore;
    use sm4c_durable::{DurableHost, HostLimits};
    if let Some(bootstrap) = &args.kafka.kafka {
        return kafka::serve_kafka(&args, bootstrap, docs, mocks, calls, park_ms, security, traces);
    }
    let conns = connections(&args)?;
    let store = match SqliteStore::open(&args.db) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("sm4c: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let rt = serve_runtime()?;
    rt.block_on(async move {
        let metrics = metrics(traces);
        let host = served_functions(args.definitions.as_deref(), calls, mocks, &metrics);
        let limits = HostLimits {
            park_ms,
            max_parked: args.kafka.max_parked,
            max_parked_bytes: args.max_parked_bytes,
            expression: args.expression.limits(),
            max_redrives: args.max_redrives,
            ..HostLimits::default()
        };
        let batch_store = store.clone();
        let durable = match DurableHost::start(store, host, limits) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("sm4c: cannot start: {e}");
                return Ok(ExitCode::from(2));
            }
        };
        for (path, doc) in docs {
            if let Err(e) = durable.define(doc).await {
                eprintln!("{}: /: {e}", path.display());
                return Ok(ExitCode::from(2));
            }
        }
        // Batches left unfinished by the last run resume now.
        let batches = sm4c_host::batch::Batches::new(
            Arc::new(durable.clone()),
            batch_store,
            args.batch_rate,
            args.expression.limits(),
        );
        match batches.resume() {
            Ok(0) => {}
            Ok(n) => tracing::info!(batches = n, "resuming unfinished batches"),
            Err(e) => {
                eprintln!("sm4c: cannot read the batches: {e}");
                return Ok(ExitCode::from(2));
            }
        }
        let Some(listener) = listen(&args.listen).await else {
            return Ok(ExitCode::from(2));
        };
        tracing::info!(listen = %listener.local_addr()?, db = %args.db.display(), https = security.tls.is_some(), auth = security.auth.is_on(), "sm4c serving");
        report_listening(listener.local_addr()?, security.tls.is_some());
        let door = door(&args, security.auth.is_on(), listener.local_addr()?, None)?;
        let app = sm4c_api::door::layer(served_api(durable.clone(), metrics, security.auth, Some(batches)), door);
        let polls = durable.clone();
        let store_failure = Arc::new(std::sync::OnceLock::new());
        let failure = store_failure.clone();
        sm4c_api::tls::serve(listener, security.tls, conns, app, async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                why = polls.failed() => {
                    let _ = failure.set(why);
                }
            }
            // Long polls would hold the stop for up to a minute.
            polls.close_polls();
        })
        .await?;
        if let Some(why) = store_failure.get() {
            // Nothing decided since the failure was acted on; a restart recovers from the store.
            eprintln!("sm4c: cannot write to the store: {why}; stopping");
            return Ok(ExitCode::from(3));
        }
        durable.shutdown().await;
        tracing::info!("stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The runtime `sm4c serve` runs on, in both modes (instances run on threads with a large stack).
fn serve_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(STACK)
        .build()
}

/// The functions `sm4c serve` calls, in both modes: a jq mock where there is one, else the REST or
/// gRPC invoker (paths relative to the definitions folder), every call timed for the metrics.
fn served_functions(
    definitions: Option<&Path>,
    calls: sm4c_invoke::config::CallConfig,
    mocks: HashMap<String, sm4c_runtime::Expr>,
    metrics: &Arc<sm4c_api::metrics::Metrics>,
) -> Arc<sm4c_api::metrics::Metered> {
    let base = definitions.unwrap_or(Path::new("."));
    let http = Arc::new(sm4c_invoke::asl::HttpTask::new(&calls.asl));
    Arc::new(sm4c_api::metrics::Metered {
        inner: Arc::new(CallRouter {
            mocks,
            subflows: HashMap::new(),
            sent: None,
            rest: Some(Arc::new(sm4c_invoke::rest::RestInvoker::new(base, calls.rest))),
            grpc: Some(Arc::new(GrpcInvoker::new(base, calls.grpc))),
            asl_resources: calls.asl.resources,
            asl_at_most_once: calls.asl.at_most_once,
            http: Some(http),
        }),
        metrics: metrics.clone(),
    })
}

/// The line `sm4c serve` prints on stdout once it is bound, for a program that started it (with
/// `--listen 127.0.0.1:0`, a port the system picks) to read where it listens: the bound address, not
/// the one asked for. Nothing else of `sm4c serve` goes to stdout.
fn listening_line(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("sm4c: listening on {scheme}://{addr}")
}

/// Prints [`listening_line`] and flushes it (stdout is block-buffered when it is not a terminal).
fn report_listening(addr: std::net::SocketAddr, tls: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed stdout must not stop the server: the log line says the same.
    let _ = writeln!(out, "{}", listening_line(addr, tls));
    let _ = out.flush();
}

/// Binds the API's address; says why on stderr when it cannot.
async fn listen(addr: &str) -> Option<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("sm4c: cannot listen on {addr}: {e}");
            None
        }
    }
}

/// The HTTP API of `sm4c serve` over either host, with `/metrics` and, when configured, authentication.
fn served_api(
    backend: impl sm4c_host::service::Backend,
    metrics: Arc<sm4c_api::metrics::Metrics>,
    auth: sm4c_api::auth::Auth,
    batches: Option<Arc<sm4c_host::batch::Batches>>,
) -> axum::Router {
    let mut api = sm4c_api::router(backend);
    if let Some(b) = batches {
        api = api.layer(axum::Extension(b));
    }
    sm4c_api::auth::layer(api.merge(sm4c_api::metrics::route(metrics)), auth)
}

/// The metrics of `sm4c serve`, and the observer that feeds them and, when on, the traces.
fn metrics(traces: Option<Arc<traces::Traces>>) -> Arc<sm4c_api::metrics::Metrics> {
    let metrics = Arc::new(sm4c_api::metrics::Metrics::new());
    // One server per process: the observer is installed once.
    sm4c_host::metrics::observe(Box::new(traces::Observed {
        metrics: Box::new(sm4c_api::metrics::Observed(metrics.clone())),
        traces,
    }));
    metrics
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::listening_line;

    #[test]
    fn the_listening_line_names_the_bound_address_and_the_scheme() {
        let v4: std::net::SocketAddr = "127.0.0.1:40213".parse().unwrap();
        assert_eq!(listening_line(v4, false), "sm4c: listening on http://127.0.0.1:40213");
        assert_eq!(listening_line(v4, true), "sm4c: listening on https://127.0.0.1:40213");
        let v6: std::net::SocketAddr = "[::1]:8443".parse().unwrap();
        assert_eq!(listening_line(v6, true), "sm4c: listening on https://[::1]:8443");
    }
}
