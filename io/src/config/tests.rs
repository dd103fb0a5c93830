use super::format::RawLimits;
use super::*;
use crate::credentials::{digest, to_hex};

const DIGEST_A: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

fn full_text() -> String {
    format!(
        r#"
listen = "0.0.0.0:9000"
allowed_origins = ["https://x.example", "http://localhost:3000"]

[limits]
subscriptions_per_conn_max = 16
handshake_timeout_ms = 2500

[[principal]]
id = "alice"
role = "maintainer"
sessions = "*"
token_sha256 = "{DIGEST_A}"

[[principal]]
id = "bob"
role = "observer"
sessions = ["ahp-session:/s1", "axp-session:/s2", "s3"]
token_sha256 = "{}"

[[trust_group]]
principals = ["alice", "bob"]
"#,
        to_hex(&digest("bob-token"))
    )
}

fn err_of(text: &str) -> String {
    parse(text).expect_err("must be refused").to_string()
}

#[test]
fn a_full_file_parses() {
    let c = parse(&full_text()).expect("valid");
    assert_eq!(c.listen, Some("0.0.0.0:9000".parse().expect("addr")));
    assert_eq!(
        c.allowed_origins,
        Some(vec![
            "https://x.example".to_owned(),
            "http://localhost:3000".to_owned()
        ])
    );
    assert_eq!(c.limits.subscriptions_per_conn_max, 16);
    assert_eq!(c.limits.handshake_timeout_ms, 2500);
    assert_eq!(c.limits.connections_max, Limits::default().connections_max);
    assert_eq!(c.principals.len(), 2);
    assert_eq!(c.principals[0].id, "alice");
    assert_eq!(c.principals[0].role, Role::Maintainer);
    assert_eq!(c.principals[0].sessions, SessionScope::All);
    assert_eq!(c.principals[0].token_sha256, digest("abc"));
    assert_eq!(c.principals[1].role, Role::Observer);
    let want: BTreeSet<String> = ["s1", "s2", "s3"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(c.principals[1].sessions, SessionScope::Only(want));
    assert_eq!(
        c.trust_groups,
        vec![vec!["alice".to_owned(), "bob".to_owned()]]
    );
}

#[test]
fn an_empty_file_is_the_default() {
    assert_eq!(parse("").expect("empty"), HostFileConfig::default());
}

#[test]
fn a_missing_file_is_the_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(load(dir.path()).expect("load"), HostFileConfig::default());
}

#[test]
fn save_and_load_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = parse(&full_text()).expect("valid");
    save(dir.path(), &c).expect("save");
    assert_eq!(load(dir.path()).expect("load"), c);
    let text = fs::read_to_string(config_path(dir.path())).expect("read");
    // Only non-default limits are written.
    assert!(text.contains("subscriptions_per_conn_max = 16"), "{text}");
    assert!(!text.contains("connections_max"), "{text}");
    // Scopes are written as URIs.
    assert!(text.contains("ahp-session:/s2"), "{text}");
    // Saving again over an existing file works and leaves no temporary behind.
    save(dir.path(), &HostFileConfig::default()).expect("save default");
    assert_eq!(load(dir.path()).expect("load"), HostFileConfig::default());
    let names: Vec<_> = fs::read_dir(dir.path())
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(CONFIG_FILE)]);
}

#[cfg(unix)]
#[test]
fn saved_file_is_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    save(dir.path(), &parse(&full_text()).expect("valid")).expect("save");
    let mode = fs::metadata(config_path(dir.path()))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn save_refuses_what_would_not_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = parse(&full_text()).expect("valid");
    c.principals[1].id = "alice".into();
    let e = save(dir.path(), &c).expect_err("duplicate id");
    assert!(e.to_string().contains("defined twice"), "{e}");
    let mut c = parse(&full_text()).expect("valid");
    c.limits.message_bytes_max = 1;
    assert!(save(dir.path(), &c).is_err());
    assert!(!config_path(dir.path()).exists());
}

#[test]
fn unknown_keys_are_refused_with_their_position() {
    let e = err_of("listen = \"127.0.0.1:1\"\nlisten_port = 3\n");
    assert!(e.contains("line 2") && e.contains("listen_port"), "{e}");
    let e = err_of("[limits]\nconnections = 3\n");
    assert!(e.contains("connections"), "{e}");
    let text = format!(
        "[[principal]]\nid = \"a\"\nrole = \"observer\"\nsessions = \"*\"\n\
         token_sha256 = \"{DIGEST_A}\"\ntoken = \"supersecret-token-value-123\"\n"
    );
    let e = err_of(&text);
    assert!(e.contains("token"), "{e}");
    assert!(
        !e.contains("supersecret"),
        "the offending line must not be echoed: {e}"
    );
}

#[test]
fn bad_values_are_refused() {
    let principal = |id: &str, role: &str, sessions: &str, digest: &str| {
        format!(
            "[[principal]]\nid = \"{id}\"\nrole = \"{role}\"\nsessions = {sessions}\n\
             token_sha256 = \"{digest}\"\n"
        )
    };
    let e = err_of(&principal("a b", "observer", "\"*\"", DIGEST_A));
    assert!(e.contains("principal #1"), "{e}");
    let e = err_of(&principal("a", "admin", "\"*\"", DIGEST_A));
    assert!(e.contains("role \"admin\""), "{e}");
    let e = err_of(&principal("a", "observer", "\"all\"", DIGEST_A));
    assert!(e.contains("sessions must be"), "{e}");
    let e = err_of(&principal("a", "observer", "[\"ahp-chat:/x\"]", DIGEST_A));
    assert!(e.contains("not a session URI"), "{e}");
    let e = err_of(&principal("a", "observer", "[1]", DIGEST_A));
    assert!(e.contains("sessions must be"), "{e}");
    let e = err_of(&principal("a", "observer", "\"*\"", "abc"));
    assert!(e.contains("64 hex digits"), "{e}");
    let two = principal("a", "observer", "\"*\"", DIGEST_A)
        + &principal("a", "observer", "\"*\"", &to_hex(&digest("other")));
    assert!(err_of(&two).contains("defined twice"));
    let same = principal("a", "observer", "\"*\"", DIGEST_A)
        + &principal("b", "observer", "\"*\"", DIGEST_A);
    assert!(err_of(&same).contains("same token"));
    assert!(err_of("listen = \"localhost:80\"").contains("IP:PORT"));
    assert!(err_of("allowed_origins = [\"https://x/\"]").contains("ends with '/'"));
    assert!(err_of("[limits]\nmessage_bytes_max = 10\n").contains("[limits]"));
    assert!(err_of("[limits]\nconnections_max = -1\n").contains("connections_max"));
    let group = principal("a", "observer", "\"*\"", DIGEST_A)
        + "[[trust_group]]\nprincipals = [\"a\", \"zed\"]\n";
    assert!(err_of(&group).contains("\"zed\""));
    assert!(err_of("[[trust_group]]\nprincipals = []\n").contains("no principals"));
    assert!(err_of("not toml at all").contains("line 1"));
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(config_path(dir.path()), "bogus = 1\n").expect("write");
    let e = load(dir.path()).expect_err("invalid");
    assert!(matches!(e, ConfigError::Parse { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with(&config_path(dir.path()).display().to_string()),
        "{e}"
    );
}

#[test]
fn every_limit_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (limits, driver_limits) = RawLimits::bumped();
    assert_eq!(limits.validate(), Ok(()));
    assert_eq!(driver_limits.validate(&limits), Ok(()));
    let c = HostFileConfig {
        limits,
        driver_limits,
        ..HostFileConfig::default()
    };
    save(dir.path(), &c).expect("save");
    assert_eq!(load(dir.path()).expect("load"), c);
}

#[test]
fn sessions_arguments_parse() {
    assert_eq!(parse_sessions_arg("*"), Ok(SessionScope::All));
    let ids: BTreeSet<String> = ["s1", "s2"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        parse_sessions_arg("ahp-session:/s1, axp-session:/s2,s1"),
        Ok(SessionScope::Only(ids))
    );
    assert_eq!(
        parse_sessions_arg(""),
        Ok(SessionScope::Only(BTreeSet::new()))
    );
    assert!(parse_sessions_arg("ahp-chat:/x").is_err());
}

#[test]
fn scopes_display_as_uris() {
    assert_eq!(scope_display(&SessionScope::All), "*");
    assert_eq!(
        scope_display(&SessionScope::Only(BTreeSet::new())),
        "(none)"
    );
    let ids: BTreeSet<String> = ["a", "b"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        scope_display(&SessionScope::Only(ids)),
        "ahp-session:/a,ahp-session:/b"
    );
}

/// A `[tuning]` key in µs: `default` when absent, 0 turns it off and round-trips through
/// `save`, `max` is accepted and one more is refused with a message naming the line.
fn check_tuning_key(
    key: &str,
    effective: fn(&HostFileConfig) -> u64,
    stored: fn(&Tuning) -> Option<u64>,
    default: u64,
    max: u64,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(CONFIG_FILE);
    assert_eq!(effective(&HostFileConfig::default()), default, "{key}");
    fs::write(&file, format!("[tuning]\n{key} = 0\n")).expect("write");
    let c = load(dir.path()).expect("load");
    assert_eq!(effective(&c), 0, "{key}: 0 turns it off");
    save(dir.path(), &c).expect("save");
    assert_eq!(
        stored(&load(dir.path()).expect("reload").tuning),
        Some(0),
        "{key}"
    );
    fs::write(&file, format!("[tuning]\n{key} = {max}\n")).expect("write");
    assert_eq!(
        effective(&load(dir.path()).expect("at the bound")),
        max,
        "{key}"
    );
    fs::write(&file, format!("[tuning]\n{key} = {}\n", max + 1)).expect("write");
    let e = load(dir.path()).expect_err("over the bound").to_string();
    assert!(e.contains(&format!("{key} = {}", max + 1)), "{e}");
}

#[test]
fn busy_poll_defaults_to_50_us_is_bounded_and_round_trips() {
    check_tuning_key(
        "busy_poll_us",
        HostFileConfig::busy_poll,
        |t| t.busy_poll_us,
        BUSY_POLL_US_DEFAULT,
        BUSY_POLL_US_MAX,
    );
}

#[test]
fn writer_spin_defaults_to_200_us_is_bounded_and_round_trips() {
    check_tuning_key(
        "writer_spin_us",
        HostFileConfig::writer_spin,
        |t| t.writer_spin_us,
        WRITER_SPIN_US_DEFAULT,
        WRITER_SPIN_US_MAX,
    );
    // Only under [tuning]: it never was a top-level key.
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(dir.path().join(CONFIG_FILE), "writer_spin_us = 10\n").expect("write");
    assert!(load(dir.path()).is_err());
}

#[test]
fn coalesce_defaults_to_20_us_is_bounded_and_round_trips() {
    check_tuning_key(
        "coalesce_us",
        HostFileConfig::coalesce,
        |t| t.coalesce_us,
        COALESCE_US_DEFAULT,
        COALESCE_US_MAX,
    );
}

#[test]
fn tuning_keys_at_the_top_level_are_still_read_and_saved_under_tuning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = "busy_poll_us = 0\ncoalesce_us = 30\n";
    let raw: RawConfig = toml::from_str(old).expect("toml");
    assert_eq!(raw.misplaced_tuning_keys(), ["busy_poll_us", "coalesce_us"]);
    fs::write(dir.path().join(CONFIG_FILE), old).expect("write");
    let c = load(dir.path()).expect("an older build's file still loads");
    assert_eq!((c.busy_poll(), c.coalesce()), (0, 30));
    save(dir.path(), &c).expect("save");
    let text = fs::read_to_string(config_path(dir.path())).expect("read");
    let tuning = text.find("[tuning]").expect("saved under [tuning]");
    assert!(
        text.find("busy_poll_us").is_some_and(|at| at > tuning),
        "{text}"
    );
    assert!(
        text.find("coalesce_us").is_some_and(|at| at > tuning),
        "{text}"
    );
    let raw: RawConfig = toml::from_str(&text).expect("toml");
    assert!(raw.misplaced_tuning_keys().is_empty(), "{text}");
    assert_eq!(load(dir.path()).expect("reload"), c);
    // The old place is checked like the new one, and both at once is ambiguous.
    let e = err_of("coalesce_us = 201\n");
    assert!(e.contains("coalesce_us = 201"), "{e}");
    let e = err_of("busy_poll_us = 10\n[tuning]\nbusy_poll_us = 20\n");
    assert!(e.contains("both") && e.contains("busy_poll_us"), "{e}");
    let e = err_of("[tuning]\nspin_us = 3\n");
    assert!(e.contains("spin_us"), "{e}");
}

#[test]
fn driver_limits_live_in_limits_and_are_checked() {
    let c =
        parse("[limits]\npre_auth_sockets_max = 8\npartial_message_bytes_total_max = 33554432\n")
            .expect("valid");
    assert_eq!(c.driver_limits.pre_auth_sockets_max, 8);
    // At least the largest message (a blob upload, up to frame_bytes_max).
    assert_eq!(c.driver_limits.partial_message_bytes_total_max, 32 << 20);
    assert_eq!(c.limits, Limits::default());
    assert_eq!(
        parse("").expect("empty").driver_limits,
        DriverLimits::default()
    );
    let e = err_of("[limits]\npre_auth_sockets_max = 0\n");
    assert!(
        e.contains("[limits]") && e.contains("pre_auth_sockets_max"),
        "{e}"
    );
    let e = err_of("[limits]\npartial_message_bytes_total_max = 1000\n");
    assert!(e.contains("partial_message_bytes_total_max"), "{e}");
}

#[test]
fn keepalive_defaults_to_30_s_and_zero_turns_it_off() {
    let mut c = HostFileConfig::default();
    assert_eq!(c.keepalive(), Some(KEEPALIVE_MS_DEFAULT));
    c.keepalive_ms = Some(0);
    assert_eq!(c.keepalive(), None);
    c.keepalive_ms = Some(250);
    assert_eq!(c.keepalive(), Some(250));
}

#[test]
fn repository_defaults_to_default_and_round_trips() {
    let c = parse("").expect("empty");
    assert_eq!(c.repository, None);
    assert_eq!(c.repository(), REPOSITORY_DEFAULT);
    assert_eq!(REPOSITORY_DEFAULT, "default");

    let c = parse("repository = \"acme/widgets-2.0_x\"\n").expect("valid");
    assert_eq!(c.repository.as_deref(), Some("acme/widgets-2.0_x"));
    assert_eq!(c.repository(), "acme/widgets-2.0_x");

    // Saving keeps it (`token add` and `revoke` rewrite the file through `save`), at the top
    // level and before any table.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut full = parse(&full_text()).expect("valid");
    full.repository = Some("acme/widgets".into());
    save(dir.path(), &full).expect("save");
    assert_eq!(load(dir.path()).expect("load"), full);
    let text = fs::read_to_string(config_path(dir.path())).expect("read");
    let at = text.find("repository = \"acme/widgets\"").expect("written");
    assert!(at < text.find('[').expect("a table"), "{text}");

    // Absent stays absent: the default is not written into the file.
    save(dir.path(), &HostFileConfig::default()).expect("save default");
    let text = fs::read_to_string(config_path(dir.path())).expect("read");
    assert!(!text.contains("repository"), "{text}");
}

#[test]
fn repository_names_are_checked() {
    let longest = format!("a{}", "b".repeat(REPOSITORY_LEN_MAX - 1));
    for good in ["a", "0", "A.b_c-d/e", "acme/widgets", longest.as_str()] {
        assert!(valid_repository(good), "{good:?}");
        let c = parse(&format!("repository = \"{good}\"\n")).expect(good);
        assert_eq!(c.repository(), good);
    }
    let too_long = format!("{longest}c");
    for bad in [
        "",
        too_long.as_str(),
        "/acme",
        ".hidden",
        "-x",
        "_x",
        "a b",
        "a\\tb",
        "caf\u{e9}",
        "a\"b",
        "a:b",
        "a\\\\b",
    ] {
        assert!(!valid_repository(bad), "{bad:?}");
        let e = err_of(&format!("repository = \"{}\"\n", bad.replace('"', "\\\"")));
        assert!(e.contains("repository ="), "{bad:?}: {e}");
        assert!(e.contains("1-128 characters"), "{bad:?}: {e}");
    }
    // Not a string at all: a shape error naming the key.
    let e = err_of("repository = 3\n");
    assert!(e.contains("repository"), "{e}");
}

#[test]
fn save_refuses_an_invalid_repository() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = HostFileConfig {
        repository: Some("no spaces".into()),
        ..HostFileConfig::default()
    };
    let e = save(dir.path(), &c).expect_err("invalid name");
    assert!(e.to_string().contains("repository"), "{e}");
    assert!(!config_path(dir.path()).exists());
}
