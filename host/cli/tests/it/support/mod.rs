//! What the CLI tests share.

pub mod ansi;
pub mod proc;
pub mod run;
pub mod server;

// Shared with tests/kafka.rs, its own test binary, which reads them from tests/support/ through
// `#[path]`: they stay there until the Kafka tests join this binary.
#[path = "../../support/inventory.rs"]
pub mod inventory;
#[path = "../../support/otlp.rs"]
pub mod otlp;
