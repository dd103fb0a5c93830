//! Drift tests: the host's real frames, and the requests these tests send, validated against
//! the JSON Schemas in `schema/`. The validator covers the keywords those files use.

use serde_json::{json, Value};

use super::Harness;
use crate::Principal;

const CATALOG: &str = "x-client-services://";

/// The schema files, compiled in (the core reads no files, not even in tests).
fn load(name: &str) -> Value {
    let text = match name {
        "axp-initialize-meta" => include_str!("../../../schema/axp-initialize-meta.schema.json"),
        "client-services/register-service.params" => {
            include_str!("../../../schema/client-services/register-service.params.schema.json")
        }
        "client-services/register-service.result" => {
            include_str!("../../../schema/client-services/register-service.result.schema.json")
        }
        "client-services/update-service.params" => {
            include_str!("../../../schema/client-services/update-service.params.schema.json")
        }
        "client-services/unregister-service.params" => {
            include_str!("../../../schema/client-services/unregister-service.params.schema.json")
        }
        "client-services/empty.result" => {
            include_str!("../../../schema/client-services/empty.result.schema.json")
        }
        "client-services/notify.params" => {
            include_str!("../../../schema/client-services/notify.params.schema.json")
        }
        "client-services/notification.params" => {
            include_str!("../../../schema/client-services/notification.params.schema.json")
        }
        "client-services/request.params" => {
            include_str!("../../../schema/client-services/request.params.schema.json")
        }
        "client-services/handle-request.params" => {
            include_str!("../../../schema/client-services/handle-request.params.schema.json")
        }
        "client-services/cancel-request.params" => {
            include_str!("../../../schema/client-services/cancel-request.params.schema.json")
        }
        "client-services/catalog.state" => {
            include_str!("../../../schema/client-services/catalog.state.schema.json")
        }
        "client-services/service-added.action" => {
            include_str!("../../../schema/client-services/service-added.action.schema.json")
        }
        "client-services/service-updated.action" => {
            include_str!("../../../schema/client-services/service-updated.action.schema.json")
        }
        "client-services/service-removed.action" => {
            include_str!("../../../schema/client-services/service-removed.action.schema.json")
        }
        "client-services/initialize-meta" => {
            include_str!("../../../schema/client-services/initialize-meta.schema.json")
        }
        "axp/blob-get.params" => include_str!("../../../schema/axp/blob-get.params.schema.json"),
        "axp/blob-get.result" => include_str!("../../../schema/axp/blob-get.result.schema.json"),
        "axp/blob-put.params" => include_str!("../../../schema/axp/blob-put.params.schema.json"),
        "axp/blob-put.result" => include_str!("../../../schema/axp/blob-put.result.schema.json"),
        "axp/claim.params" => include_str!("../../../schema/axp/claim.params.schema.json"),
        "axp/claim.result" => include_str!("../../../schema/axp/claim.result.schema.json"),
        "axp/close.params" => include_str!("../../../schema/axp/close.params.schema.json"),
        "axp/close.result" => include_str!("../../../schema/axp/close.result.schema.json"),
        "axp/comment-added.action" => {
            include_str!("../../../schema/axp/comment-added.action.schema.json")
        }
        "axp/comment.params" => include_str!("../../../schema/axp/comment.params.schema.json"),
        "axp/comment.result" => include_str!("../../../schema/axp/comment.result.schema.json"),
        "axp/dispatch.params" => include_str!("../../../schema/axp/dispatch.params.schema.json"),
        "axp/dispatch.result" => include_str!("../../../schema/axp/dispatch.result.schema.json"),
        "axp/emit.params" => include_str!("../../../schema/axp/emit.params.schema.json"),
        "axp/emit.result" => include_str!("../../../schema/axp/emit.result.schema.json"),
        "axp/exchange.state" => include_str!("../../../schema/axp/exchange.state.schema.json"),
        "axp/executor-changed.action" => {
            include_str!("../../../schema/axp/executor-changed.action.schema.json")
        }
        "axp/executors.state" => include_str!("../../../schema/axp/executors.state.schema.json"),
        "axp/export.params" => include_str!("../../../schema/axp/export.params.schema.json"),
        "axp/export.result" => include_str!("../../../schema/axp/export.result.schema.json"),
        "axp/grant-changed.action" => {
            include_str!("../../../schema/axp/grant-changed.action.schema.json")
        }
        "axp/grant.params" => include_str!("../../../schema/axp/grant.params.schema.json"),
        "axp/grant.result" => include_str!("../../../schema/axp/grant.result.schema.json"),
        "axp/lease-changed.action" => {
            include_str!("../../../schema/axp/lease-changed.action.schema.json")
        }
        "axp/register.params" => include_str!("../../../schema/axp/register.params.schema.json"),
        "axp/register.result" => include_str!("../../../schema/axp/register.result.schema.json"),
        "axp/release.params" => include_str!("../../../schema/axp/release.params.schema.json"),
        "axp/release.result" => include_str!("../../../schema/axp/release.result.schema.json"),
        "axp/renew.params" => include_str!("../../../schema/axp/renew.params.schema.json"),
        "axp/renew.result" => include_str!("../../../schema/axp/renew.result.schema.json"),
        "axp/reserve.params" => include_str!("../../../schema/axp/reserve.params.schema.json"),
        "axp/reserve.result" => include_str!("../../../schema/axp/reserve.result.schema.json"),
        "axp/reserved.action" => include_str!("../../../schema/axp/reserved.action.schema.json"),
        "axp/revoke.params" => include_str!("../../../schema/axp/revoke.params.schema.json"),
        "axp/revoke.result" => include_str!("../../../schema/axp/revoke.result.schema.json"),
        "axp/settle.params" => include_str!("../../../schema/axp/settle.params.schema.json"),
        "axp/settle.result" => include_str!("../../../schema/axp/settle.result.schema.json"),
        "axp/settled.action" => include_str!("../../../schema/axp/settled.action.schema.json"),
        "axp/checkpoint.params" => {
            include_str!("../../../schema/axp/checkpoint.params.schema.json")
        }
        "axp/checkpoint.result" => {
            include_str!("../../../schema/axp/checkpoint.result.schema.json")
        }
        "axp/checkpoint-changed.action" => {
            include_str!("../../../schema/axp/checkpoint-changed.action.schema.json")
        }
        "axp/compact.params" => include_str!("../../../schema/axp/compact.params.schema.json"),
        "axp/compact.result" => include_str!("../../../schema/axp/compact.result.schema.json"),
        "axp/compaction-proposed.action" => {
            include_str!("../../../schema/axp/compaction-proposed.action.schema.json")
        }
        "axp/accept-compaction.params" => {
            include_str!("../../../schema/axp/accept-compaction.params.schema.json")
        }
        "axp/accept-compaction.result" => {
            include_str!("../../../schema/axp/accept-compaction.result.schema.json")
        }
        "axp/context-changed.action" => {
            include_str!("../../../schema/axp/context-changed.action.schema.json")
        }
        "axp/context.params" => include_str!("../../../schema/axp/context.params.schema.json"),
        "axp/context.result" => include_str!("../../../schema/axp/context.result.schema.json"),
        "axp/review.params" => include_str!("../../../schema/axp/review.params.schema.json"),
        "axp/review.result" => include_str!("../../../schema/axp/review.result.schema.json"),
        "axp/approve-review.params" => {
            include_str!("../../../schema/axp/approve-review.params.schema.json")
        }
        "axp/approve-review.result" => {
            include_str!("../../../schema/axp/approve-review.result.schema.json")
        }
        "axp/review-changed.action" => {
            include_str!("../../../schema/axp/review-changed.action.schema.json")
        }
        "axp/verify.params" => include_str!("../../../schema/axp/verify.params.schema.json"),
        "axp/verify.result" => include_str!("../../../schema/axp/verify.result.schema.json"),
        "axp/verification-changed.action" => {
            include_str!("../../../schema/axp/verification-changed.action.schema.json")
        }
        "axp/memory-propose.params" => {
            include_str!("../../../schema/axp/memory-propose.params.schema.json")
        }
        "axp/memory-propose.result" => {
            include_str!("../../../schema/axp/memory-propose.result.schema.json")
        }
        "axp/memory-review.params" => {
            include_str!("../../../schema/axp/memory-review.params.schema.json")
        }
        "axp/memory-review.result" => {
            include_str!("../../../schema/axp/memory-review.result.schema.json")
        }
        "axp/memory-search.params" => {
            include_str!("../../../schema/axp/memory-search.params.schema.json")
        }
        "axp/memory-search.result" => {
            include_str!("../../../schema/axp/memory-search.result.schema.json")
        }
        "axp/memory-changed.action" => {
            include_str!("../../../schema/axp/memory-changed.action.schema.json")
        }
        "axp/memory.state" => include_str!("../../../schema/axp/memory.state.schema.json"),
        other => panic!("no schema named {other}"),
    };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("schema uses unsupported type {other}"),
    }
}

/// Validates `v` against `schema`; `Err` names the path that broke.
fn validate(schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let known = [
        "$schema",
        "$id",
        "title",
        "description",
        "type",
        "const",
        "enum",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "uniqueItems",
        "pattern",
    ];
    for key in schema
        .as_object()
        .map(|o| o.keys().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        assert!(
            known.contains(&key.as_str()),
            "validator does not support keyword {key}"
        );
    }
    match &schema["type"] {
        Value::String(t) if !type_matches(t, v) => {
            return Err(format!("{path}: expected {t}, got {v}"))
        }
        Value::Array(ts) if !ts.iter().any(|t| type_matches(t.as_str().unwrap_or(""), v)) => {
            return Err(format!("{path}: expected one of {ts:?}, got {v}"))
        }
        _ => {}
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            return Err(format!("{path}: expected {c}, got {v}"));
        }
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        if !e.contains(v) {
            return Err(format!("{path}: {v} not in {e:?}"));
        }
    }
    if let (Some(s), Some(max)) = (v.as_str(), schema.get("maxLength").and_then(Value::as_u64)) {
        if s.len() as u64 > max {
            return Err(format!("{path}: longer than {max}"));
        }
    }
    if let (Some(s), Some(min)) = (v.as_str(), schema.get("minLength").and_then(Value::as_u64)) {
        if (s.len() as u64) < min {
            return Err(format!("{path}: shorter than {min}"));
        }
    }
    if let (Some(n), Some(min)) = (v.as_f64(), schema.get("minimum").and_then(Value::as_f64)) {
        if n < min {
            return Err(format!("{path}: below {min}"));
        }
    }
    if let (Some(n), Some(max)) = (v.as_f64(), schema.get("maximum").and_then(Value::as_f64)) {
        if n > max {
            return Err(format!("{path}: above {max}"));
        }
    }
    if let Some(obj) = v.as_object() {
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap_or_default();
            if !obj.contains_key(r) {
                return Err(format!("{path}: missing {r}"));
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(s, x, &format!("{path}.{k}"))?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => return Err(format!("{path}: unexpected key {k}")),
                    Some(s @ Value::Object(_)) => validate(s, x, &format!("{path}.{k}"))?,
                    _ => {}
                },
            }
        }
    }
    if let Some(items) = v.as_array() {
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > max {
                return Err(format!("{path}: more than {max} items"));
            }
        }
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < min {
                return Err(format!("{path}: fewer than {min} items"));
            }
        }
        if schema.get("uniqueItems") == Some(&Value::Bool(true)) {
            for (i, x) in items.iter().enumerate() {
                if items[..i].contains(x) {
                    return Err(format!("{path}[{i}]: repeats an earlier item"));
                }
            }
        }
        if let Some(s) = schema.get("items") {
            for (i, x) in items.iter().enumerate() {
                validate(s, x, &format!("{path}[{i}]"))?;
            }
        }
    }
    Ok(())
}

pub(super) fn check(name: &str, v: &Value) {
    if let Err(e) = validate(&load(name), v, name) {
        panic!("{e}\nvalue: {v}");
    }
}

#[test]
fn the_validator_catches_drift() {
    let schema = load("client-services/service-removed.action");
    assert!(validate(
        &schema,
        &json!({"type":"x-clientServices/serviceRemoved","serviceId":"s"}),
        ""
    )
    .is_ok());
    assert!(validate(
        &schema,
        &json!({"type":"x-clientServices/serviceRemoved"}),
        ""
    )
    .is_err());
    assert!(validate(
        &schema,
        &json!({"type":"x-clientServices/serviceRemoved","serviceId":"s","x":1}),
        ""
    )
    .is_err());
    assert!(validate(&schema, &json!({"type":"other","serviceId":"s"}), "").is_err());
}

#[test]
fn host_frames_match_the_client_services_schemas() {
    let mut h = Harness::new();
    let init = h.init(1, Principal::maintainer("m"), "owner", &[CATALOG]);
    check(
        "client-services/initialize-meta",
        &init["_meta"]["x-client-services"],
    );
    check("axp-initialize-meta", &init["_meta"]["org.axp.exchange"]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);

    let register = json!({"channel": CATALOG, "metadata": {"protocol": "git-object-reader", "version": 1}, "audience": null});
    check("client-services/register-service.params", &register);
    let out = h.send(
        1,
        &json!({"jsonrpc":"2.0","id":1,"method":"client/registerService","params":register}),
    );
    let result = out
        .iter()
        .find(|(_, v)| v["id"] == 1)
        .map(|(_, v)| v["result"].clone())
        .expect("result");
    check("client-services/register-service.result", &result);
    let added = out
        .iter()
        .find(|(_, v)| v["method"] == "action")
        .map(|(_, v)| v["params"]["action"].clone())
        .expect("added");
    check("client-services/service-added.action", &added);
    let id = result["serviceId"].as_str().expect("id").to_owned();

    let sub = h.request(2, 2, "subscribe", json!({"channel": CATALOG}));
    check(
        "client-services/catalog.state",
        &sub["result"]["snapshot"]["state"],
    );

    let update = json!({"channel": CATALOG, "serviceId": id, "metadata": {"v": 2}});
    check("client-services/update-service.params", &update);
    let out = h.send(
        1,
        &json!({"jsonrpc":"2.0","id":3,"method":"client/updateService","params":update}),
    );
    for (_, v) in &out {
        if v["method"] == "action" {
            check(
                "client-services/service-updated.action",
                &v["params"]["action"],
            );
        } else {
            check("client-services/empty.result", &v["result"]);
        }
    }

    let notify = json!({"channel": CATALOG, "serviceId": id, "method": "refsChanged", "params": {"repo": "r"}});
    check("client-services/notify.params", &notify);
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","method":"clientService/notify","params":notify}),
    );
    check("client-services/notification.params", &out[0].1["params"]);

    let request = json!({"channel": CATALOG, "serviceId": id, "method": "getRefs", "params": {"repo": "r"}, "timeoutMs": 1000});
    check("client-services/request.params", &request);
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","id":"r1","method":"clientService/request","params":request}),
    );
    check("client-services/handle-request.params", &out[0].1["params"]);
    let cancel = json!({"channel": CATALOG, "id": "r1"});
    check("client-services/cancel-request.params", &cancel);
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":cancel}),
    );
    let forwarded = out
        .iter()
        .find(|(c, _)| *c == 1)
        .map(|(_, v)| v["params"].clone())
        .expect("forwarded cancel");
    check("client-services/cancel-request.params", &forwarded);

    let unregister = json!({"channel": CATALOG, "serviceId": id});
    check("client-services/unregister-service.params", &unregister);
    let out = h.send(
        1,
        &json!({"jsonrpc":"2.0","id":4,"method":"client/unregisterService","params":unregister}),
    );
    for (_, v) in &out {
        if v["method"] == "action" {
            check(
                "client-services/service-removed.action",
                &v["params"]["action"],
            );
        } else {
            check("client-services/empty.result", &v["result"]);
        }
    }
}
