//! The model's side of the handshake and the catalog: who is ready, which services exist and
//! who may see them, as `initialize`, `reconnect` and the registry requests succeed.

use super::*;

impl ServiceModel {
    /// Registrations, updates, unregistrations and handshakes that succeeded.
    pub(super) fn on_request(
        &mut self,
        conn: ConnId,
        method: &str,
        params: Option<&str>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let succeeded = || match &fx.direct {
            Some(Ok(r)) => Some(r.clone()),
            _ => None,
        };
        match method {
            "initialize" | "reconnect" => {
                if succeeded().is_some() {
                    if let Some(p) = self.peers.get_mut(&conn) {
                        p.ready = true;
                    }
                }
                Ok(())
            }
            "client/registerService" => {
                let Some(result) = succeeded() else {
                    return Ok(());
                };
                let id = serde_json::from_str::<Value>(&result)
                    .ok()
                    .and_then(|v| {
                        v.get("serviceId")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .ok_or_else(|| format!("registerService result without serviceId: {result}"))?;
                if !self.ever.insert(id.clone()) {
                    return Err(format!("service id {id} handed out twice"));
                }
                let p: Value = params
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or_default();
                let principal = self.peer(conn)?.principal.clone();
                self.services.insert(
                    id,
                    Service {
                        owner: conn,
                        principal,
                        audience: audience(p.get("audience")),
                    },
                );
                self.count("services registered");
                Ok(())
            }
            "client/updateService" | "client/unregisterService" => {
                if succeeded().is_none() {
                    return Ok(());
                }
                let p: Value = params
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or_default();
                let sid = p
                    .get("serviceId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let Some(s) = self.services.get_mut(sid) else {
                    return Err(format!(
                        "{method} of {sid} succeeded, but no such service exists"
                    ));
                };
                if s.owner != conn {
                    return Err(format!(
                        "{method} of {sid} by {conn:?} succeeded, but {:?} owns it",
                        s.owner
                    ));
                }
                if method == "client/unregisterService" {
                    self.services.remove(sid);
                    fx.removed.insert(sid.to_owned());
                } else if let Some(a) = p.get("audience") {
                    s.audience = audience(Some(a));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// `audience` from register or update params: absent or null is none.
fn audience(v: Option<&Value>) -> Option<BTreeSet<String>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect()
    })
}
