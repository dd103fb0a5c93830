//! `axhost token add` run by several processes at once on one data directory: each run holds
//! the config lock around its read-modify-write, so no run loses another's principal.

mod common;

use std::process::{Command, Stdio};

use common::*;

#[test]
fn concurrent_token_adds_keep_every_principal() {
    const RUNS: usize = 12;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let dir_s = dir.to_str().expect("utf-8 path").to_owned();
    let children: Vec<_> = (0..RUNS)
        .map(|i| {
            Command::new(axhost_bin())
                .args(["token", "add", "--data-dir", &dir_s, "--role", "observer"])
                .args(["--id", &format!("p{i}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn axhost token add")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "run {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run_cli(&["token", "list", "--data-dir", &dir_s]);
    assert!(out.status.success());
    let listed = String::from_utf8_lossy(&out.stdout);
    for i in 0..RUNS {
        assert!(
            listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&format!("p{i}"))),
            "p{i} lost:\n{listed}"
        );
    }
}
