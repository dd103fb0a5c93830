//! axhost-io: everything that touches the outside world.

pub mod client;
pub mod config;
pub mod credentials;
pub mod datadir;
pub mod server;
pub mod sqlite;
pub mod writer;

pub use config::{ConfigError, HostFileConfig, PrincipalEntry};
pub use credentials::Credentials;
pub use sqlite::{OpenError, SqliteReader, SqliteStore, SqliteWriter};
