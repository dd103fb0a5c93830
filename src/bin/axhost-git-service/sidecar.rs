//! The service: one registration, its methods, listeners and the refs poller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axhost_io::client::{
    frame_kind, Client, ClientError, FrameKind, CATALOG, SERVICE_ADDED, SERVICE_REMOVED,
    SERVICE_UPDATED,
};
use serde_json::{json, Value};

use crate::repo::{
    MethodError, RefState, Repo, INVALID_PARAMS, MAX_CHUNK_BYTES, MAX_CONTENT_BYTES, MAX_OIDS,
};

/// The application methods of the `git-object-reader` protocol.
pub const METHODS: &[&str] = &[
    "getRefs",
    "getObjects",
    "getObjectChunk",
    "subscribe",
    "unsubscribe",
];
/// Listeners across all repositories.
const MAX_LISTENERS: usize = 1024;
/// Longest wait for one frame, so a stop request is seen quickly.
const TICK: Duration = Duration::from_millis(200);
/// An application error code: too many listeners.
const TOO_MANY_LISTENERS: i64 = -32000;

/// How one connection ended.
pub enum Ended {
    /// Asked to stop (SIGTERM/SIGINT): exit.
    Stopped,
}

/// What the sidecar keeps across reconnects: repositories and listeners.
pub struct Sidecar {
    pub repos: BTreeMap<String, Repo>,
    pub label: String,
    pub client_id: String,
    pub poll: Duration,
    /// repo → listener service ids.
    listeners: BTreeMap<String, BTreeSet<String>>,
    /// repo → where its refs pointed when its listeners were last told.
    last_refs: BTreeMap<String, RefState>,
    /// Services this connection can see: id → owner clientId (from the catalog).
    catalog: BTreeMap<String, String>,
}

impl Sidecar {
    pub fn new(
        repos: BTreeMap<String, Repo>,
        label: String,
        client_id: String,
        poll: Duration,
    ) -> Sidecar {
        Sidecar {
            repos,
            label,
            client_id,
            poll,
            listeners: BTreeMap::new(),
            last_refs: BTreeMap::new(),
            catalog: BTreeMap::new(),
        }
    }

    /// The registration's metadata.
    pub fn metadata(&self) -> Value {
        json!({
            "protocol": "git-object-reader",
            "version": 1,
            "label": self.label,
            "repos": self.repos.keys().collect::<Vec<_>>(),
            "methods": METHODS,
            "limits": {
                "maxOids": MAX_OIDS,
                "maxContentBytes": MAX_CONTENT_BYTES,
                "maxChunkBytes": MAX_CHUNK_BYTES,
            },
        })
    }

    /// Initializes `client`, registers, then serves until the connection fails (`Err`) or a
    /// stop is requested. `registered` is called once the service exists.
    pub fn serve(
        &mut self,
        client: &mut Client,
        stop: &AtomicBool,
        registered: &mut dyn FnMut(&str),
    ) -> Result<Ended, ClientError> {
        let init = client.initialize(&self.client_id, &[CATALOG])?;
        self.catalog.clear();
        if let Some(services) = init["snapshots"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["resource"] == CATALOG))
            .and_then(|s| s["state"]["services"].as_array())
        {
            for s in services {
                self.see(s);
            }
        }
        // Listeners whose service vanished while we were away are gone for good.
        let catalog = &self.catalog;
        for set in self.listeners.values_mut() {
            set.retain(|l| catalog.contains_key(l));
        }
        self.listeners.retain(|_, s| !s.is_empty());
        let metadata = self.metadata();
        let service_id = client.register_service(&metadata, None)?;
        registered(&service_id);
        let mut next_poll = Instant::now() + self.poll;
        loop {
            if stop.load(Ordering::Relaxed) {
                let _ = client.unregister_service(&service_id);
                return Ok(Ended::Stopped);
            }
            let wait = next_poll
                .saturating_duration_since(Instant::now())
                .min(TICK);
            if let Some(frame) = client.next_frame(wait)? {
                self.handle(client, &frame)?;
            }
            if Instant::now() >= next_poll {
                self.poll_all(client)?;
                next_poll = Instant::now() + self.poll;
            }
        }
    }

    fn see(&mut self, service: &Value) {
        if let (Some(id), Some(client)) =
            (service["serviceId"].as_str(), service["clientId"].as_str())
        {
            self.catalog.insert(id.to_owned(), client.to_owned());
        }
    }

    fn forget(&mut self, service_id: &str) {
        self.catalog.remove(service_id);
        for set in self.listeners.values_mut() {
            set.remove(service_id);
        }
        self.listeners.retain(|_, s| !s.is_empty());
    }

    fn handle(&mut self, client: &mut Client, frame: &Value) -> Result<(), ClientError> {
        match frame_kind(frame) {
            FrameKind::Request {
                id,
                method: "clientService/handleRequest",
                params,
            } => {
                let sender = params["senderClientId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let method = params["method"].as_str().unwrap_or_default().to_owned();
                match self.call(client, &method, &params["params"], &sender) {
                    Ok(result) => client.respond(id, result),
                    Err(e) => client.respond_error(id, e.code, &e.message, e.data),
                }
            }
            FrameKind::Request { id, .. } => {
                client.respond_error(id, -32601, "Method not found", None)
            }
            FrameKind::Notification {
                method: "clientService/notification",
                params,
            } => {
                let sender = params["senderClientId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let method = params["method"].as_str().unwrap_or_default().to_owned();
                // Notifications get no answer, whatever happens.
                if let Err(e) = self.call(client, &method, &params["params"], &sender) {
                    eprintln!(
                        "axhost-git-service: notification {method} ignored: {}",
                        e.message
                    );
                }
                Ok(())
            }
            FrameKind::Notification {
                method: "action",
                params,
            } if params["channel"] == CATALOG => {
                let action = &params["action"];
                match action["type"].as_str() {
                    Some(SERVICE_ADDED | SERVICE_UPDATED) => self.see(&action["service"]),
                    Some(SERVICE_REMOVED) => {
                        if let Some(id) = action["serviceId"].as_str() {
                            self.forget(id);
                        }
                    }
                    _ => {}
                }
                Ok(())
            }
            // `$/cancelRequest`: requests are answered one at a time, in order, so by the time a
            // cancel is read its request is already answered; the host drops the late answer.
            _ => Ok(()),
        }
    }

    fn repo(&self, params: &Value) -> Result<(&str, &Repo), MethodError> {
        let name = params["repo"]
            .as_str()
            .ok_or_else(|| MethodError::invalid("repo (a string) is required", None))?;
        self.repos
            .get_key_value(name)
            .map(|(k, r)| (k.as_str(), r))
            .ok_or_else(|| {
                MethodError::invalid(
                    "unknown repo",
                    Some(json!({ "repo": name, "repos": self.repos.keys().collect::<Vec<_>>() })),
                )
            })
    }

    /// One application method, from a request or a notification.
    fn call(
        &mut self,
        client: &mut Client,
        method: &str,
        params: &Value,
        sender: &str,
    ) -> Result<Value, MethodError> {
        match method {
            "getRefs" => {
                let prefix = match &params["prefix"] {
                    Value::Null => None,
                    Value::String(p) => Some(p.as_str()),
                    _ => return Err(MethodError::invalid("prefix must be a string", None)),
                };
                self.repo(params)?.1.refs(prefix)
            }
            "getObjects" => {
                let (_, repo) = self.repo(params)?;
                let oids = params["oids"]
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|o| o.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| {
                        MethodError::invalid("oids must be an array of strings", None)
                    })?;
                repo.objects(&oids)
            }
            "getObjectChunk" => {
                let (_, repo) = self.repo(params)?;
                let oid = params["oid"]
                    .as_str()
                    .ok_or_else(|| MethodError::invalid("oid (a string) is required", None))?;
                let offset = params["offset"].as_u64().unwrap_or(0);
                repo.chunk(oid, offset, params["length"].as_u64())
            }
            "subscribe" => self.subscribe(client, params, sender),
            "unsubscribe" => {
                let (name, _) = self.repo(params)?;
                let name = name.to_owned();
                let listener = listener_of(params)?;
                let removed = self
                    .listeners
                    .get_mut(&name)
                    .is_some_and(|s| s.remove(&listener));
                self.listeners.retain(|_, s| !s.is_empty());
                Ok(json!({ "removed": removed }))
            }
            _ => Err(MethodError {
                code: -32601,
                message: "Method not found".into(),
                data: Some(json!({ "methods": METHODS })),
            }),
        }
    }

    /// `subscribe {repo, listenerServiceId}`: the listener must be a service this sidecar can see
    /// that belongs to the subscriber's clientId. Answers with the current refs, after which each
    /// change arrives as `refsChanged`.
    fn subscribe(
        &mut self,
        client: &mut Client,
        params: &Value,
        sender: &str,
    ) -> Result<Value, MethodError> {
        let (name, _) = self.repo(params)?;
        let name = name.to_owned();
        let listener = listener_of(params)?;
        if self.catalog.get(&listener).map(String::as_str) != Some(sender) {
            return Err(MethodError::invalid(
                "listenerServiceId must name a service of the subscribing client that this \
                 service can see",
                Some(json!({ "listenerServiceId": listener })),
            ));
        }
        let total: usize = self.listeners.values().map(BTreeSet::len).sum();
        if total >= MAX_LISTENERS {
            return Err(MethodError {
                code: TOO_MANY_LISTENERS,
                message: "too many listeners".into(),
                data: Some(json!({ "maxListeners": MAX_LISTENERS })),
            });
        }
        // Bring existing listeners up to date first, so the new one's baseline is theirs too.
        self.poll_repo(client, &name).map_err(|e| MethodError {
            code: -32603,
            message: format!("notifying listeners: {e}"),
            data: None,
        })?;
        let repo = self.repo(params)?.1;
        let state = repo.ref_state(None)?;
        let refs = repo.refs_json(&state);
        self.last_refs.insert(name.clone(), state);
        self.listeners
            .entry(name.clone())
            .or_default()
            .insert(listener.clone());
        Ok(
            json!({ "repo": name, "listenerServiceId": listener, "refs": refs["refs"], "head": refs["head"] }),
        )
    }

    fn poll_all(&mut self, client: &mut Client) -> Result<(), ClientError> {
        let names: Vec<String> = self.listeners.keys().cloned().collect();
        for name in names {
            self.poll_repo(client, &name)?;
        }
        Ok(())
    }

    /// Sends `refsChanged {repo, refs, head}` to the repo's listeners if its refs changed since
    /// they were last told.
    fn poll_repo(&mut self, client: &mut Client, name: &str) -> Result<(), ClientError> {
        let Some(listeners) = self.listeners.get(name).filter(|s| !s.is_empty()) else {
            self.last_refs.remove(name);
            return Ok(());
        };
        let Some(repo) = self.repos.get(name) else {
            return Ok(());
        };
        let now = match repo.ref_state(None) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("axhost-git-service: {name}: {}", e.message);
                return Ok(());
            }
        };
        if self.last_refs.get(name) == Some(&now) {
            return Ok(());
        }
        let refs = repo.refs_json(&now);
        let params = json!({ "repo": name, "refs": refs["refs"], "head": refs["head"] });
        for l in listeners {
            client.notify_service(l, "refsChanged", params.clone())?;
        }
        self.last_refs.insert(name.to_owned(), now);
        Ok(())
    }
}

fn listener_of(params: &Value) -> Result<String, MethodError> {
    params["listenerServiceId"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| MethodError {
            code: INVALID_PARAMS,
            message: "listenerServiceId (a string) is required".into(),
            data: None,
        })
}
