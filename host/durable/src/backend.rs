//! The durable host behind the HTTP API.

use crate::host::DurableHost;
use serde_json::{json, Value};
use sm4c_host::service::{Answered, Backend, HostError, SentPage, Stored, Summary};
use sm4c_host::tasks::Answer;
use sm4c_host::BoxFuture;
use sm4c_runtime::{Entry, Machine};
use std::sync::Arc;
use std::time::Duration;

impl Backend for DurableHost {
    fn task_lists(&self) -> BoxFuture<'_, Result<Vec<Value>, HostError>> {
        Box::pin(DurableHost::task_lists(self))
    }
    fn poll(
        &self,
        list: String,
        worker: Option<String>,
        wait: Duration,
    ) -> BoxFuture<'_, Result<Option<Value>, HostError>> {
        Box::pin(async move { DurableHost::poll(self, &list, worker, wait).await })
    }
    fn answer(&self, token: String, answer: Answer) -> BoxFuture<'_, Result<Answered, HostError>> {
        Box::pin(async move { DurableHost::answer(self, &token, answer).await })
    }
    fn define(&self, doc: Value) -> BoxFuture<'_, Result<(Arc<Machine>, bool), HostError>> {
        Box::pin(DurableHost::define(self, doc))
    }
    fn machines(&self) -> Vec<Arc<Machine>> {
        self.registry().all()
    }
    fn latest(&self, id: &str) -> Option<Arc<Machine>> {
        self.registry().get(id, None)
    }
    fn migrate(
        &self,
        id: String,
        version: String,
        states: std::collections::BTreeMap<String, String>,
        dry_run: bool,
    ) -> BoxFuture<'_, Result<sm4c_runtime::engine::migrate::MigrationPlan, HostError>> {
        Box::pin(async move { DurableHost::migrate(self, &id, &version, states, dry_run).await })
    }
    fn redrive(&self, id: String, update: Option<String>, dry_run: bool) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move { DurableHost::redrive(self, &id, update, dry_run).await })
    }
    fn default_version(&self, id: &str) -> Option<String> {
        self.registry().default_version(id).map(str::to_string)
    }
    fn set_default_version(&self, id: String, version: Option<String>) -> BoxFuture<'_, Result<(), HostError>> {
        let r = DurableHost::set_default_version(self, &id, version.as_deref());
        Box::pin(async move { r })
    }
    fn start_instance(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        Box::pin(async move { DurableHost::start_instance(self, &definition, version.as_deref(), id, input).await })
    }
    fn start_traced(
        &self,
        definition: String,
        version: Option<String>,
        id: Option<String>,
        input: Value,
        origin: Option<String>,
    ) -> BoxFuture<'_, Result<(String, bool), HostError>> {
        Box::pin(
            async move { DurableHost::start_traced(self, &definition, version.as_deref(), id, input, origin).await },
        )
    }
    fn instance(&self, id: &str) -> Result<Option<Stored>, HostError> {
        Ok(self.store().instance(id)?)
    }
    fn list(
        &self,
        status: Option<&str>,
        definition: Option<&str>,
        after: i64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Summary>, HostError>> {
        let r = self
            .store()
            .list(status, definition, after, limit)
            .map_err(HostError::from);
        Box::pin(async move { r })
    }
    fn history(&self, id: &str, after: i64, limit: usize) -> BoxFuture<'_, Result<Vec<(i64, Entry)>, HostError>> {
        let r = self.store().history(id, after, limit).map_err(HostError::from);
        Box::pin(async move { r })
    }
    fn cancel(&self, id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move { DurableHost::cancel(self, &id).await })
    }
    fn breakpoints(&self) -> Result<Vec<(String, Vec<sm4c_runtime::Breakpoint>)>, HostError> {
        Ok(DurableHost::breakpoints(self))
    }
    fn set_breakpoints(
        &self,
        definition: String,
        breakpoints: Vec<sm4c_runtime::Breakpoint>,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        let r = DurableHost::set_breakpoints(self, &definition, breakpoints);
        Box::pin(async move { r })
    }
    fn resume(&self, id: String, step: bool) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move { DurableHost::resume(self, &id, step).await })
    }
    fn schedules(&self, op: sm4c_host::service::ScheduleOp) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move { DurableHost::schedules(self, op).await })
    }
    fn deliver(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        Box::pin(async move {
            let d = DurableHost::deliver(self, event).await?;
            Ok(serde_json::to_value(d).unwrap_or(Value::Null))
        })
    }
    fn sent(&self, after: &str, limit: usize) -> BoxFuture<'_, Result<SentPage, HostError>> {
        let r = after
            .parse::<i64>()
            .or_else(|_| {
                if after.is_empty() {
                    Ok(0)
                } else {
                    Err(HostError::InvalidCursor(after.to_string()))
                }
            })
            .and_then(|after| {
                let rows = self.store().outbox(after, limit)?;
                let next = rows.last().map(|r| r.0.to_string());
                let events = rows
                    .into_iter()
                    .map(|(s, i, e)| match e {
                        Ok(e) => json!({"seq": s, "instance": i, "event": e}),
                        Err(why) => json!({"seq": s, "instance": i, "event": null, "error": {
                            "type": "corruptRecord",
                            "message": format!("the store's outbox record {s} cannot be read back: {why}"),
                            "details": {"record": "outbox"}}}),
                    })
                    .collect();
                Ok((events, next))
            });
        Box::pin(async move { r })
    }
    fn explain(&self, event: Value) -> BoxFuture<'_, Result<Value, HostError>> {
        let r = (|| {
            let machines = self.registry().all();
            let defs: Vec<(String, String)> = machines
                .iter()
                .filter(|m| {
                    m.events
                        .iter()
                        .any(|d| sm4c_runtime::engine::event::kind_matches(d, &event))
                })
                .map(|m| (m.id.clone(), m.version.clone()))
                .collect();
            let mut snaps = Vec::new();
            for id in self.store().active(&defs)? {
                if let Some(s) = self.store().instance(&id)? {
                    snaps.push(s.snapshot);
                }
            }
            Ok(sm4c_host::explain::explain(&machines, snaps.iter(), &event))
        })();
        Box::pin(async move { r })
    }
}
