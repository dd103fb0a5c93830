//! `axhost-git-service` against the real host: a repository made with the `git` CLI, the
//! sidecar started with a token from `axhost token add`, discovery through the catalog, then
//! `getRefs`, batched `getObjects` (checked byte for byte against `git cat-file`), the size
//! bounds, `refsChanged` to a listener service after a new commit, and the process contract
//! (SIGTERM, bounded reconnects, refused token).
//!
//! The caller side uses `axhost_io::client::Client`, the same client the sidecar uses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use axhost_io::client::{Client, ClientError, CATALOG};
use base64::Engine as _;
use common::*;
use serde_json::{json, Value};

const SIDECAR: &str = env!("CARGO_BIN_EXE_axhost-git-service");
const TRUST: &str = "[[trust_group]]\nprincipals = [\"git\", \"editor\"]\n";

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn git_bytes(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}");
    out.stdout
}

/// Incompressible bytes from a fixed-seed generator.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A repository with two commits on `main`, a `feature` branch, an annotated and a lightweight
/// tag, a text file, a nested binary file and three large blobs.
fn make_repo(root: &Path) -> PathBuf {
    let dir = root.join("repo");
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("hello.txt"), "hello, world\n").expect("write");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("sub/data.bin"), [0u8, 1, 2, 255, 254, 10, 13]).expect("write");
    git(&dir, &["add", "."]);
    git(&dir, &["commit", "-q", "-m", "first"]);
    git(&dir, &["tag", "-a", "v1", "-m", "version one"]);
    git(&dir, &["tag", "light"]);
    git(&dir, &["checkout", "-q", "-b", "feature"]);
    std::fs::write(dir.join("feature.txt"), "feature\n").expect("write");
    git(&dir, &["add", "."]);
    git(&dir, &["commit", "-q", "-m", "feature work"]);
    git(&dir, &["checkout", "-q", "main"]);
    // Large blobs: two of 500 KiB (one fits a result, two do not) and one of 1 MiB (never fits).
    std::fs::write(dir.join("big1.bin"), noise(500 * 1024, 1)).expect("write");
    std::fs::write(dir.join("big2.bin"), noise(500 * 1024, 2)).expect("write");
    std::fs::write(dir.join("huge.bin"), noise(1024 * 1024, 3)).expect("write");
    git(&dir, &["add", "."]);
    git(&dir, &["commit", "-q", "-m", "big blobs"]);
    dir
}

struct Setup {
    host: HostProcess,
    _tmp: tempfile::TempDir,
    repo: PathBuf,
    sidecar: Proc,
    service_id: String,
    editor: Client,
}

fn url(h: &HostProcess) -> String {
    format!("ws://127.0.0.1:{}/axp", h.port)
}

fn setup(poll_ms: &str) -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = make_repo(tmp.path());
    let host = HostBuilder::new()
        .principal("git", "contributor", None)
        .principal("editor", "contributor", None)
        .config_after_principals(TRUST)
        .start();
    let mut editor = Client::connect(&url(&host), Some(host.token_of("editor"))).expect("connect");
    let init = editor
        .initialize("editor-app", &[CATALOG])
        .expect("initialize");
    assert_eq!(init["snapshots"][0]["state"]["services"], json!([]));

    let repo_arg = format!("demo={}", repo.display());
    let mut sidecar = Proc::spawn(
        SIDECAR,
        &[
            "--repo",
            &repo_arg,
            "--label",
            "Demo repos",
            "--poll-ms",
            poll_ms,
        ],
        &[
            ("AXHOST_URL", &url(&host)),
            ("AXHOST_TOKEN", host.token_of("git")),
        ],
    );
    let line = sidecar.wait_line(Duration::from_secs(20), |l| l.starts_with("registered "));
    let service_id = line.trim_start_matches("registered ").to_owned();

    // The editor discovers it through the catalog.
    let added = loop {
        let f = editor
            .next_frame(FRAME_TIMEOUT)
            .expect("catalog")
            .expect("a catalog change in time");
        if f["method"] == "action"
            && f["params"]["action"]["type"] == "x-clientServices/serviceAdded"
        {
            break f["params"]["action"]["service"].clone();
        }
    };
    assert_eq!(added["serviceId"], service_id);
    assert_eq!(added["principal"], "git");
    let meta = &added["metadata"];
    assert_eq!(meta["protocol"], "git-object-reader");
    assert_eq!(meta["version"], 1);
    assert_eq!(meta["label"], "Demo repos");
    assert_eq!(meta["repos"], json!(["demo"]));
    Setup {
        host,
        _tmp: tmp,
        repo,
        sidecar,
        service_id,
        editor,
    }
}

fn b64(s: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s.as_str().expect("base64 string"))
        .expect("valid base64")
}

#[test]
fn get_refs_and_batched_get_objects_match_git() {
    let mut s = setup("1000");
    let svc = s.service_id.clone();
    let repo = s.repo.clone();

    // getRefs: every ref with its target, annotated tags peeled, HEAD symbolic.
    let refs = s
        .editor
        .call_service(&svc, "getRefs", json!({"repo": "demo"}), Some(10_000))
        .expect("getRefs");
    let mut want = Vec::new();
    for line in git(
        &repo,
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname) %(objecttype)",
        ],
    )
    .lines()
    {
        let mut parts = line.split(' ');
        let (name, oid, kind) = (
            parts.next().expect("name"),
            parts.next().expect("oid"),
            parts.next().expect("type"),
        );
        let mut e = json!({"name": name, "target": oid});
        if kind == "tag" {
            e["peeled"] = json!(git(&repo, &["rev-parse", &format!("{name}^{{}}")]));
        }
        want.push(e);
    }
    want.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    assert_eq!(refs["refs"], json!(want), "{refs}");
    let names: Vec<&str> = want.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "refs/heads/feature",
            "refs/heads/main",
            "refs/tags/light",
            "refs/tags/v1"
        ]
    );
    assert_eq!(
        refs["head"],
        json!({"name": "HEAD", "symref": "refs/heads/main", "target": git(&repo, &["rev-parse", "HEAD"])})
    );

    // A prefix narrows the list.
    let tags = s
        .editor
        .call_service(
            &svc,
            "getRefs",
            json!({"repo": "demo", "prefix": "refs/tags/"}),
            None,
        )
        .expect("getRefs with a prefix");
    assert_eq!(tags["refs"], json!(want[2..]), "{tags}");

    // getObjects: blob, tree, commit, tag and a missing id, in one call, in order.
    let blob = git(&repo, &["rev-parse", "HEAD:hello.txt"]);
    let bin = git(&repo, &["rev-parse", "HEAD:sub/data.bin"]);
    let tree = git(&repo, &["rev-parse", "HEAD^{tree}"]);
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let tag = git(&repo, &["rev-parse", "v1"]);
    let missing = "0123456789abcdef0123456789abcdef01234567";
    let oids = [&blob, &bin, &tree, &commit, &tag, missing];
    let r = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": oids}),
            None,
        )
        .expect("getObjects");
    assert!(r.get("truncated").is_none(), "{r}");
    let objects = r["objects"].as_array().expect("objects");
    assert_eq!(objects.len(), oids.len());
    for (o, oid) in objects.iter().zip(oids) {
        assert_eq!(o["oid"], *oid);
        if oid == missing {
            assert_eq!(*o, json!({"oid": missing, "missing": true}));
            continue;
        }
        let kind = git(&repo, &["cat-file", "-t", oid]);
        let size: u64 = git(&repo, &["cat-file", "-s", oid]).parse().expect("size");
        let content = git_bytes(&repo, &["cat-file", &kind, oid]);
        assert_eq!(o["kind"], kind, "{o}");
        assert_eq!(o["size"], size, "{o}");
        assert_eq!(b64(&o["content"]), content, "content of {kind} {oid}");
    }
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(kinds, ["blob", "blob", "tree", "commit", "tag"]);

    // Bounds: two 500 KiB blobs do not fit one result; the first comes back, the rest is left
    // for another call. A 1 MiB blob never fits and is read in chunks instead.
    let big1 = git(&repo, &["rev-parse", "HEAD:big1.bin"]);
    let big2 = git(&repo, &["rev-parse", "HEAD:big2.bin"]);
    let huge = git(&repo, &["rev-parse", "HEAD:huge.bin"]);
    let r = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": [&blob, &big1, &big2, &blob]}),
            None,
        )
        .expect("getObjects big");
    assert_eq!(r["truncated"], true);
    let objects = r["objects"].as_array().expect("objects");
    assert_eq!(objects.len(), 2, "blob and big1 fit, big2 does not");
    assert_eq!(b64(&objects[1]["content"]), noise(500 * 1024, 1));
    let r = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": [&big2, &blob]}),
            None,
        )
        .expect("the rest");
    assert!(r.get("truncated").is_none());
    assert_eq!(b64(&r["objects"][0]["content"]), noise(500 * 1024, 2));
    let r = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": [&huge, &blob]}),
            None,
        )
        .expect("huge");
    assert_eq!(
        r["objects"][0],
        json!({"oid": huge, "kind": "blob", "size": 1024 * 1024, "tooLarge": true})
    );
    assert_eq!(r["objects"][1]["oid"], blob);
    let mut whole = Vec::new();
    while whole.len() < 1024 * 1024 {
        let c = s
            .editor
            .call_service(
                &svc,
                "getObjectChunk",
                json!({"repo": "demo", "oid": huge, "offset": whole.len()}),
                None,
            )
            .expect("chunk");
        assert_eq!(c["size"], 1024 * 1024);
        assert_eq!(c["offset"], whole.len());
        let bytes = b64(&c["content"]);
        assert!(!bytes.is_empty());
        whole.extend(bytes);
    }
    assert_eq!(whole, noise(1024 * 1024, 3));

    // Errors: unknown repo, too many oids, a malformed oid, an unknown method.
    let e = s
        .editor
        .call_service(&svc, "getRefs", json!({"repo": "nope"}), None)
        .expect_err("unknown repo");
    let e = e.rpc().expect("JSON-RPC error").clone();
    assert_eq!(e.code, -32602);
    assert_eq!(e.data, Some(json!({"repo": "nope", "repos": ["demo"]})));
    let many: Vec<&str> = (0..257).map(|_| blob.as_str()).collect();
    let e = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": many}),
            None,
        )
        .expect_err("too many");
    assert_eq!(e.rpc().map(|e| e.code), Some(-32602), "{e}");
    let e = s
        .editor
        .call_service(
            &svc,
            "getObjects",
            json!({"repo": "demo", "oids": ["HEAD"]}),
            None,
        )
        .expect_err("not hex");
    assert_eq!(e.rpc().map(|e| e.code), Some(-32602), "{e}");
    let e = s
        .editor
        .call_service(&svc, "push", json!({}), None)
        .expect_err("unknown method");
    assert_eq!(e.rpc().map(|e| e.code), Some(-32601), "{e}");

    // SIGTERM: the sidecar unregisters and exits 0; the catalog says so.
    let status = s.sidecar.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}\n{}", s.sidecar.stderr());
    let removed = wait_for(&mut s.editor, |f| {
        f["method"] == "action"
            && f["params"]["action"]["type"] == "x-clientServices/serviceRemoved"
    });
    assert_eq!(removed["params"]["action"]["serviceId"], svc);
    drop(s.host);
}

/// The next frame at `c` for which `pred` holds (others are dropped).
fn wait_for(c: &mut Client, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + FRAME_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.next_frame(left) {
            Ok(Some(f)) if pred(&f) => return f,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("nothing matching within {FRAME_TIMEOUT:?}"),
            Err(e) => panic!("connection failed: {e}"),
        }
    }
}

#[test]
fn refs_changed_reaches_a_listener_service_after_a_new_commit() {
    let mut s = setup("100");
    let svc = s.service_id.clone();
    let repo = s.repo.clone();
    let listener = s
        .editor
        .register_service(&json!({"protocol": "git-refs-listener"}), None)
        .expect("register listener");

    // A listener that is not the subscriber's own is refused.
    let mut other =
        Client::connect(&url(&s.host), Some(s.host.token_of("editor"))).expect("connect");
    other.initialize("editor-other", &[]).expect("initialize");
    let e = other
        .call_service(
            &svc,
            "subscribe",
            json!({"repo": "demo", "listenerServiceId": listener}),
            None,
        )
        .expect_err("foreign listener");
    assert_eq!(e.rpc().map(|e| e.code), Some(-32602), "{e}");

    let sub = s
        .editor
        .call_service(
            &svc,
            "subscribe",
            json!({"repo": "demo", "listenerServiceId": listener}),
            None,
        )
        .expect("subscribe");
    let head = git(&repo, &["rev-parse", "HEAD"]);
    assert_eq!(sub["head"]["target"], head, "{sub}");
    assert_eq!(sub["listenerServiceId"], listener);

    // A new commit: one refsChanged notification at the listener, from the sidecar.
    std::fs::write(repo.join("hello.txt"), "changed\n").expect("write");
    git(&repo, &["commit", "-q", "-am", "change"]);
    let new_head = git(&repo, &["rev-parse", "HEAD"]);
    let started = Instant::now();
    let n = wait_for(&mut s.editor, |f| {
        f["method"] == "clientService/notification"
    });
    let p = &n["params"];
    assert_eq!(p["serviceId"], listener);
    assert_eq!(p["method"], "refsChanged");
    assert!(
        p["senderClientId"]
            .as_str()
            .is_some_and(|c| c.starts_with("git-service-")),
        "{p}"
    );
    assert_eq!(p["params"]["repo"], "demo");
    assert_eq!(p["params"]["head"]["target"], new_head);
    let main = p["params"]["refs"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "refs/heads/main"))
        .cloned()
        .expect("main in refs");
    assert_eq!(main["target"], new_head);
    eprintln!("refsChanged after {:?}", started.elapsed());

    // A new branch is a change too; unchanged refs send nothing.
    git(&repo, &["branch", "topic"]);
    let n = wait_for(&mut s.editor, |f| {
        f["method"] == "clientService/notification"
    });
    assert!(n["params"]["params"]["refs"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["name"] == "refs/heads/topic")));
    assert!(matches!(
        s.editor.next_frame(Duration::from_millis(400)),
        Ok(None)
    ));

    // Unsubscribed: commits no longer reach it.
    let r = s
        .editor
        .call_service(
            &svc,
            "unsubscribe",
            json!({"repo": "demo", "listenerServiceId": listener}),
            None,
        )
        .expect("unsubscribe");
    assert_eq!(r, json!({"removed": true}));
    git(&repo, &["commit", "-q", "--allow-empty", "-m", "quiet"]);
    assert!(matches!(
        s.editor.next_frame(Duration::from_millis(500)),
        Ok(None)
    ));

    // Subscribing by notification works too (no answer, ever), and a listener whose service
    // goes away is dropped: after unregistering it, the sidecar keeps serving normally.
    s.editor
        .notify_service(
            &svc,
            "subscribe",
            json!({"repo": "demo", "listenerServiceId": listener}),
        )
        .expect("notify");
    // Make sure the sidecar handled the notification before changing refs.
    let _ = s
        .editor
        .call_service(&svc, "getRefs", json!({"repo": "demo"}), None)
        .expect("getRefs");
    git(&repo, &["branch", "topic2"]);
    let n = wait_for(&mut s.editor, |f| {
        f["method"] == "clientService/notification"
    });
    assert_eq!(n["params"]["method"], "refsChanged");
    s.editor.unregister_service(&listener).expect("unregister");
    git(&repo, &["branch", "topic3"]);
    std::thread::sleep(Duration::from_millis(300));
    let r = s
        .editor
        .call_service(&svc, "getRefs", json!({"repo": "demo"}), None)
        .expect("still serving");
    assert!(r["refs"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["name"] == "refs/heads/topic3")));
    assert!(
        !s.sidecar.stderr().contains("panicked"),
        "{}",
        s.sidecar.stderr()
    );
}

#[test]
fn the_sidecar_gives_up_after_bounded_reconnects_and_refuses_a_bad_token() {
    // Nobody listens on this port: the first try and two reconnection attempts (after 0.2 s and
    // 0.4 s), then exit 1.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = make_small_repo(tmp.path());
    let repo_arg = format!("r={}", repo.display());
    let started = Instant::now();
    let mut p = Proc::spawn(
        SIDECAR,
        &[
            "--url",
            &format!("ws://127.0.0.1:{port}/axp"),
            "--token",
            "x",
            "--repo",
            &repo_arg,
            "--reconnect-attempts",
            "2",
        ],
        &[],
    );
    let status = p.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "{}", p.stderr());
    assert!(
        p.stderr()
            .contains("giving up after 2 reconnection attempts"),
        "{}",
        p.stderr()
    );
    assert!(started.elapsed() >= Duration::from_millis(500));

    // A refused token is final: no retries.
    let host = HostProcess::start();
    let mut p = Proc::spawn(
        SIDECAR,
        &[
            "--url",
            &url(&host),
            "--token",
            "axh_wrong",
            "--repo",
            &repo_arg,
        ],
        &[],
    );
    let status = p.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(1));
    assert!(p.stderr().contains("401"), "{}", p.stderr());

    // A path that is no repository is refused before connecting.
    let bad = format!("r={}", tmp.path().join("nope").display());
    let mut p = Proc::spawn(SIDECAR, &["--url", &url(&host), "--repo", &bad], &[]);
    assert!(!p.wait_exit(Duration::from_secs(10)).success());
}

fn make_small_repo(root: &Path) -> PathBuf {
    let dir = root.join("small");
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "-q", "-b", "main"]);
    git(&dir, &["commit", "-q", "--allow-empty", "-m", "empty"]);
    dir
}

#[test]
fn a_host_restart_is_survived_with_a_new_registration() {
    // The host comes back on the same address: the sidecar reconnects and registers anew.
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = make_small_repo(tmp.path());
    let mut host = HostBuilder::new()
        .principal("git", "contributor", None)
        .start();
    let port = host.port;
    let token = host.token_of("git").to_owned();
    let repo_arg = format!("r={}", repo.display());
    let mut p = Proc::spawn(
        SIDECAR,
        &["--url", &url(&host), "--token", &token, "--repo", &repo_arg],
        &[],
    );
    let first = p.wait_line(Duration::from_secs(20), |l| l.starts_with("registered "));
    host.stop();
    // Same data directory, same port, new process.
    let data_dir = host.data_dir.clone();
    let mut again = Proc::spawn(
        axhost_bin(),
        &[
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            data_dir.to_str().expect("utf-8"),
        ],
        &[],
    );
    again.wait_line(Duration::from_secs(20), |l| l.contains("ws://"));
    let second = p.wait_line(Duration::from_secs(20), |l| l.starts_with("registered "));
    assert_ne!(first, second, "a reconnect registers a new service id");
    let mut c =
        Client::connect(&format!("ws://127.0.0.1:{port}/axp"), Some(&token)).expect("connect");
    c.initialize("checker", &[]).expect("initialize");
    let id = second.trim_start_matches("registered ");
    let refs = c
        .call_service(id, "getRefs", json!({"repo": "r"}), None)
        .expect("getRefs");
    assert_eq!(refs["head"]["symref"], "refs/heads/main");
    let stale = first.trim_start_matches("registered ");
    let e = c.call_service(stale, "getRefs", json!({"repo": "r"}), None);
    assert!(
        matches!(&e, Err(ClientError::Rpc(r)) if r.code == -32008),
        "{e:?}"
    );
    assert!(p.signal_and_wait("TERM").success());
    assert!(again.signal_and_wait("TERM").success());
}
