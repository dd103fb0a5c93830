//! `axhost services`, `axhost call`, `axhost notify`: client-service commands for people.
//!
//! Contract (scripts and tests rely on it):
//! - `services [--once]` prints the catalog snapshot as one JSON line
//!   `{"fromSeq":N,"services":[{serviceId, clientId, principal, metadata}, ...]}`, then (without
//!   `--once`) each change as one JSON line `{"serverSeq":N,"action":{type, service|serviceId}}`
//!   until the host closes the connection (exit 1) or the command is interrupted.
//! - `call SERVICE METHOD JSON [--timeout-ms N]` prints the result as one JSON line; a JSON-RPC
//!   error goes to stderr as `axhost: error CODE: MESSAGE (data: ...)` with exit status 1.
//! - `notify SERVICE METHOD JSON` sends one `clientService/notify` and exits 0; nothing comes
//!   back, ever, so success means only "sent".
//! - SERVICE is a service id (`svc_...`), or else a label or protocol from the metadata of
//!   exactly one visible service.
//! - `--url`/`--token` default to `$AXHOST_URL`/`$AXHOST_TOKEN`; the URL may carry `?tkn=`.

use std::io::Write;

use axhost_io::client::{default_client_id, token_in_url, Client, CATALOG};
use serde_json::{json, Value};

/// Where and as whom to connect.
#[derive(clap::Args)]
pub struct Connect {
    /// Host WebSocket URL, e.g. ws://127.0.0.1:7331/axp (may carry ?tkn=TOKEN).
    #[arg(long, env = "AXHOST_URL")]
    url: String,
    /// Bearer token (sent in the Authorization header).
    #[arg(long, env = "AXHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Client id. Default: axhost-cli-<12 hex digits of the token's SHA-256>.
    #[arg(long)]
    client_id: Option<String>,
}

impl Connect {
    fn open(&self, subs: &[&str]) -> Result<(Client, Value), String> {
        let token = self.token.clone().or_else(|| token_in_url(&self.url));
        let client_id = self
            .client_id
            .clone()
            .unwrap_or_else(|| default_client_id("axhost-cli", token.as_deref()));
        let mut client =
            Client::connect(&self.url, self.token.as_deref()).map_err(|e| e.to_string())?;
        let init = client
            .initialize(&client_id, subs)
            .map_err(|e| format!("initialize: {e}"))?;
        Ok((client, init))
    }
}

fn parse_json(what: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not JSON: {e}"))
}

/// A service id as given, or the one visible service whose metadata label or protocol is `name`.
fn resolve(client: &mut Client, name: &str) -> Result<String, String> {
    if name.starts_with("svc_") {
        return Ok(name.to_owned());
    }
    let snapshot = client
        .subscribe(CATALOG)
        .map_err(|e| format!("subscribe: {e}"))?;
    let services = snapshot["state"]["services"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let matches: Vec<&str> = services
        .iter()
        .filter(|s| s["metadata"]["label"] == name || s["metadata"]["protocol"] == name)
        .filter_map(|s| s["serviceId"].as_str())
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(format!(
            "no visible service has id, label or protocol {name:?}"
        )),
        many => Err(format!(
            "{name:?} matches {} services ({}); name one by id",
            many.len(),
            many.join(", ")
        )),
    }
}

pub fn services(conn: &Connect, once: bool) -> Result<(), String> {
    let (mut client, init) = conn.open(&[CATALOG])?;
    let snapshot = init["snapshots"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["resource"] == CATALOG))
        .ok_or("the host sent no catalog snapshot")?;
    let mut out = std::io::stdout().lock();
    let first = json!({
        "fromSeq": snapshot["fromSeq"],
        "services": snapshot["state"]["services"],
    });
    if writeln!(out, "{first}").and_then(|()| out.flush()).is_err() {
        return Ok(()); // stdout closed: nobody is reading
    }
    if once {
        client.close();
        return Ok(());
    }
    loop {
        let frame = client
            .next_frame(std::time::Duration::from_secs(3600))
            .map_err(|e| format!("watching the catalog: {e}"))?;
        let Some(frame) = frame else { continue };
        let params = &frame["params"];
        if frame["method"] != "action" || params["channel"] != CATALOG {
            continue;
        }
        let line = json!({ "serverSeq": params["serverSeq"], "action": params["action"] });
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
    }
}

pub fn call(
    conn: &Connect,
    service: &str,
    method: &str,
    params: &str,
    timeout_ms: Option<u64>,
) -> Result<(), String> {
    let params = parse_json("JSON", params)?;
    let (mut client, _) = conn.open(&[])?;
    let service_id = resolve(&mut client, service)?;
    let result = client
        .call_service(&service_id, method, params, timeout_ms)
        .map_err(|e| e.to_string())?;
    client.close();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{result}");
    let _ = out.flush();
    Ok(())
}

pub fn notify(conn: &Connect, service: &str, method: &str, params: &str) -> Result<(), String> {
    let params = parse_json("JSON", params)?;
    let (mut client, _) = conn.open(&[])?;
    let service_id = resolve(&mut client, service)?;
    client
        .notify_service(&service_id, method, params)
        .map_err(|e| e.to_string())?;
    client.close();
    Ok(())
}
