//! The data directory (database, owner lock, config) and the logic behind `axhost token ...`.
//!
//! Everything the host keeps lives in one directory so that an operator can back it up, move
//! it, or point a test at a fresh temporary one. It holds session content and credential
//! digests, so it is created owner-only (0700) and its files are 0600.
//!
//! The `token` functions edit `axhost.toml` while the host may be running. The host reads the
//! config only at start, so a change takes effect on the next `axhost serve` (principals are
//! immutable for a host's lifetime, as in the AXP host).

use std::env;
use std::fs;
use std::io;
#[cfg(unix)]
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use axhost_core::{valid_id, Role, SessionScope};

use crate::config::{self, scope_display, ConfigError, PrincipalEntry};
use crate::credentials::{digest, generate_token};

/// The SQLite database inside the data directory.
pub const DB_FILE: &str = "axhost.db";

/// The host configuration file inside the data directory.
pub const CONFIG_FILE: &str = "axhost.toml";

/// The lock file beside the config: held (`flock`, exclusive) around every read-modify-write of
/// the config, so concurrent `axhost token add|revoke` runs cannot lose each other's changes.
pub const CONFIG_LOCK_FILE: &str = "axhost.toml.lock";

/// The principal id [`bootstrap`] creates.
pub const BOOTSTRAP_ID: &str = "admin";

/// The database path in `dir`.
pub fn db_path(dir: &Path) -> PathBuf {
    dir.join(DB_FILE)
}

/// Creates `dir` (and missing parents) with mode 0700.
///
/// An existing directory keeps its mode: the operator may have pointed `--data-dir` at a
/// directory shared for a reason, and silently changing it (say, `--data-dir /tmp` run as root)
/// would do harm. The files inside are 0600 regardless. A directory others can read is logged
/// as a warning.
pub fn ensure_data_dir(dir: &Path) -> io::Result<()> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            #[cfg(unix)]
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
                    "data directory is accessible to other users; 0700 is recommended"
                );
            }
            Ok(())
        }
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut builder = fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            builder.mode(0o700);
            builder.create(dir)
        }
        Err(e) => Err(e),
    }
}

/// Where data lives when `--data-dir` is not given: `$AXHOST_DATA_DIR`, else
/// `$XDG_DATA_HOME/axhost`, else `$HOME/.local/share/axhost`, else `./axhost-data`.
/// Empty variables count as unset, and XDG_DATA_HOME must be absolute (as the XDG spec says).
pub fn default_data_dir() -> PathBuf {
    data_dir_from(|name| env::var_os(name))
}

/// [`default_data_dir`] with the environment passed in, so tests need not mutate it.
fn data_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("AXHOST_DATA_DIR") {
        return dir;
    }
    if let Some(xdg) = set("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
        return xdg.join("axhost");
    }
    if let Some(home) = set("HOME") {
        return home.join(".local").join("share").join("axhost");
    }
    PathBuf::from("axhost-data")
}

/// Makes a fresh data directory usable: when the config has no principal, adds a maintainer
/// `admin` who sees every session, saves the config, and returns its token so the caller can
/// print the connection URL once. Returns `None` when principals already exist.
pub fn bootstrap(dir: &Path) -> Result<Option<String>, ConfigError> {
    ensure_dir(dir)?;
    let _lock = lock_config(dir)?;
    let mut cfg = config::load(dir)?;
    if !cfg.principals.is_empty() {
        return Ok(None);
    }
    let token = generate_token();
    cfg.principals.push(PrincipalEntry {
        id: BOOTSTRAP_ID.to_owned(),
        role: Role::Maintainer,
        sessions: SessionScope::All,
        token_sha256: digest(&token),
    });
    config::save(dir, &cfg)?;
    tracing::info!(
        principal = BOOTSTRAP_ID,
        "created the first maintainer credential"
    );
    Ok(Some(token))
}

/// Adds principal `id` with a new token and returns the token; only its digest is saved.
/// Refuses an id that already exists (revoke it first), so a token is never replaced silently.
pub fn token_add(
    dir: &Path,
    id: &str,
    role: Role,
    sessions: SessionScope,
) -> Result<String, ConfigError> {
    ensure_dir(dir)?;
    let path = config::config_path(dir);
    if !valid_id(id) {
        return Err(ConfigError::Invalid {
            path,
            message: format!(
                "id {id:?} must be 1-128 characters of A-Z a-z 0-9 . _ - starting with a letter \
                 or digit"
            ),
        });
    }
    let _lock = lock_config(dir)?;
    let mut cfg = config::load(dir)?;
    if cfg.principals.iter().any(|p| p.id == id) {
        return Err(ConfigError::PrincipalExists {
            path,
            id: id.to_owned(),
        });
    }
    let token = generate_token();
    cfg.principals.push(PrincipalEntry {
        id: id.to_owned(),
        role,
        sessions,
        token_sha256: digest(&token),
    });
    config::save(dir, &cfg)?;
    tracing::info!(principal = id, role = %role, "added a credential");
    Ok(token)
}

/// Every principal as `(id, role, scope)`, in file order; the scope as [`scope_display`]
/// renders it. Digests are not listed.
pub fn token_list(dir: &Path) -> Result<Vec<(String, Role, String)>, ConfigError> {
    let cfg = config::load(dir)?;
    Ok(cfg
        .principals
        .into_iter()
        .map(|p| (p.id, p.role, scope_display(&p.sessions)))
        .collect())
}

/// Removes principal `id`, and its membership of every trust group (a group left empty goes
/// too). An unknown id is an error, so a typo does not look like a successful revocation.
pub fn token_revoke(dir: &Path, id: &str) -> Result<(), ConfigError> {
    // Nothing to revoke without a config; taking the lock would create a file for nothing.
    if !config::config_path(dir).exists() {
        return Err(ConfigError::UnknownPrincipal {
            path: config::config_path(dir),
            id: id.to_owned(),
        });
    }
    let _lock = lock_config(dir)?;
    let mut cfg = config::load(dir)?;
    let before = cfg.principals.len();
    cfg.principals.retain(|p| p.id != id);
    if cfg.principals.len() == before {
        return Err(ConfigError::UnknownPrincipal {
            path: config::config_path(dir),
            id: id.to_owned(),
        });
    }
    for group in &mut cfg.trust_groups {
        group.retain(|member| member != id);
    }
    cfg.trust_groups.retain(|g| !g.is_empty());
    config::save(dir, &cfg)?;
    tracing::info!(principal = id, "revoked a credential");
    Ok(())
}

/// Takes the exclusive config lock, waiting for another holder; released when the returned
/// file is dropped (or the process dies, so a crash leaves no stale lock).
fn lock_config(dir: &Path) -> Result<fs::File, ConfigError> {
    let path = dir.join(CONFIG_LOCK_FILE);
    let io_err = |action: &'static str| {
        let path = path.clone();
        move |source| ConfigError::Io {
            path,
            action,
            source,
        }
    };
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .open(&path)
        .map_err(io_err("opening the config lock"))?;
    file.lock().map_err(io_err("locking the config"))?;
    Ok(file)
}

fn ensure_dir(dir: &Path) -> Result<(), ConfigError> {
    ensure_data_dir(dir).map_err(|source| ConfigError::Io {
        path: dir.to_owned(),
        action: "creating the data directory",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::Credentials;
    use std::collections::BTreeSet;
    use std::ffi::OsString;

    fn only(ids: &[&str]) -> SessionScope {
        SessionScope::Only(ids.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>())
    }

    #[cfg(unix)]
    #[test]
    fn a_new_data_dir_is_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a").join("b");
        ensure_data_dir(&dir).expect("create");
        let mode = fs::metadata(&dir).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        ensure_data_dir(&dir).expect("existing is fine");
        let file = tmp.path().join("file");
        fs::write(&file, "x").expect("write");
        assert!(ensure_data_dir(&file).is_err());
    }

    #[test]
    fn default_dir_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(*v))
            }
        };
        assert_eq!(
            data_dir_from(env(&[("AXHOST_DATA_DIR", "/d"), ("HOME", "/h")])),
            PathBuf::from("/d")
        );
        assert_eq!(
            data_dir_from(env(&[("XDG_DATA_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/axhost")
        );
        assert_eq!(
            data_dir_from(env(&[
                ("AXHOST_DATA_DIR", ""),
                ("XDG_DATA_HOME", "rel"),
                ("HOME", "/h")
            ])),
            PathBuf::from("/h/.local/share/axhost")
        );
        assert_eq!(data_dir_from(env(&[])), PathBuf::from("axhost-data"));
    }

    #[test]
    fn bootstrap_creates_one_maintainer_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let token = bootstrap(&dir)
            .expect("bootstrap")
            .expect("a token the first time");
        assert_eq!(bootstrap(&dir).expect("again"), None);
        let cfg = config::load(&dir).expect("load");
        assert_eq!(cfg.principals.len(), 1);
        let p = Credentials::new(&cfg.principals)
            .authenticate(&token)
            .expect("token works");
        assert_eq!((p.id.as_str(), p.role), (BOOTSTRAP_ID, Role::Maintainer));
        assert_eq!(p.sessions, SessionScope::All);
        let text = fs::read_to_string(config::config_path(&dir)).expect("read");
        assert!(
            !text.contains(&token),
            "the token itself must never be stored"
        );
    }

    #[test]
    fn bootstrap_keeps_other_settings() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::write(
            config::config_path(tmp.path()),
            "listen = \"127.0.0.1:0\"\n",
        )
        .expect("write");
        assert!(bootstrap(tmp.path()).expect("bootstrap").is_some());
        let cfg = config::load(tmp.path()).expect("load");
        assert_eq!(cfg.listen, Some("127.0.0.1:0".parse().expect("addr")));
    }

    #[test]
    fn tokens_are_added_listed_and_revoked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let alice = token_add(dir, "alice", Role::Contributor, only(&["s1", "s2"])).expect("add");
        let bob = token_add(dir, "bob", Role::Observer, SessionScope::All).expect("add");
        assert_ne!(alice, bob);
        let e = token_add(dir, "alice", Role::Observer, SessionScope::All).expect_err("dup");
        assert!(matches!(e, ConfigError::PrincipalExists { .. }), "{e:?}");
        assert!(token_add(dir, "no spaces", Role::Observer, SessionScope::All).is_err());
        assert_eq!(
            token_list(dir).expect("list"),
            vec![
                (
                    "alice".to_owned(),
                    Role::Contributor,
                    "ahp-session:/s1,ahp-session:/s2".into()
                ),
                ("bob".to_owned(), Role::Observer, "*".into()),
            ]
        );
        let creds = Credentials::new(&config::load(dir).expect("load").principals);
        assert_eq!(
            creds.authenticate(&alice).map(|p| p.id.clone()),
            Some("alice".into())
        );

        token_revoke(dir, "alice").expect("revoke");
        let e = token_revoke(dir, "alice").expect_err("already gone");
        assert!(matches!(e, ConfigError::UnknownPrincipal { .. }), "{e:?}");
        assert!(e.to_string().contains("no principal \"alice\""), "{e}");
        let creds = Credentials::new(&config::load(dir).expect("load").principals);
        assert!(creds.authenticate(&alice).is_none());
        assert!(creds.authenticate(&bob).is_some());
        // Revoked ids can be issued again, with a new token.
        let again = token_add(dir, "alice", Role::Maintainer, SessionScope::All).expect("re-add");
        assert_ne!(again, alice);
    }

    #[test]
    fn revoking_removes_trust_group_membership() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        token_add(dir, "a", Role::Maintainer, SessionScope::All).expect("add");
        token_add(dir, "b", Role::Maintainer, SessionScope::All).expect("add");
        let mut cfg = config::load(dir).expect("load");
        cfg.trust_groups = vec![vec!["a".into(), "b".into()], vec!["b".into()]];
        config::save(dir, &cfg).expect("save");
        token_revoke(dir, "b").expect("revoke");
        assert_eq!(
            config::load(dir).expect("load").trust_groups,
            vec![vec!["a".to_owned()]]
        );
    }

    #[test]
    fn concurrent_adds_and_revokes_lose_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_owned();
        token_add(&dir, "doomed", Role::Observer, SessionScope::All).expect("add");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    if t == 0 {
                        token_revoke(&dir, "doomed").expect("revoke");
                    }
                    for i in 0..6 {
                        let id = format!("p{t}-{i}");
                        token_add(&dir, &id, Role::Observer, SessionScope::All).expect("add");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let ids: BTreeSet<String> = token_list(&dir)
            .expect("list")
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        let want: BTreeSet<String> = (0..8)
            .flat_map(|t| (0..6).map(move |i| format!("p{t}-{i}")))
            .collect();
        assert_eq!(ids, want, "every add kept and the revoke too");
    }

    #[test]
    fn an_empty_list_needs_no_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(token_list(tmp.path()).expect("list").is_empty());
        assert!(token_revoke(tmp.path(), "x").is_err());
    }
}
