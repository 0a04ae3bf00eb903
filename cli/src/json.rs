//! The JSON form of resources, used by the `cairn` data commands: lossless in
//! both directions (`cairn read -o json | cairn write --file -` writes back
//! exactly what was read).
//!
//! ```json
//! {
//!   "id": {
//!     "uid": "01HV6Q7ZJ5K8Y3T2W9XG4M1N0P",
//!     "name": "web",
//!     "type": {"group": "catalog", "group_version": "v2", "kind": "Service"},
//!     "tenancy": {"partition": "default", "namespace": "default"}
//!   },
//!   "owner": {"uid": "...", "name": "...", "type": {...}, "tenancy": {...}},
//!   "version": "12",
//!   "generation": "01HV...",
//!   "metadata": {"team": "a"},
//!   "status": {
//!     "consul.io/controller": {
//!       "observed_generation": "01HV...",
//!       "conditions": [{"type": "Accepted", "state": "TRUE", "reason": "Ok",
//!                       "message": "", "resource": {"type": {...}, "tenancy": {...},
//!                       "name": "web", "section": ""}}],
//!       "updated_at": "2024-03-01T10:00:00Z"
//!     }
//!   },
//!   "data": {"type_url": "type.googleapis.com/catalog.v2.Service", "json": {"port": 80}}
//! }
//! ```
//!
//! - `data` has two forms. `{"type_url": U, "json": V}` stores the compact
//!   serialisation of `V` (UTF-8 JSON text) as the `Any`'s bytes;
//!   `{"type_url": U, "base64": B}` stores the bytes `B` decodes to (for
//!   protobuf-encoded payloads). On output, the `json` form is used exactly
//!   when the bytes are JSON text that re-serialises to the same bytes, so
//!   the round trip is lossless; everything else is shown as `base64`.
//! - Absent fields, `null` and empty strings are all "empty"; empty fields
//!   are left out on output (`id` and `version` are always shown).
//! - `state` is `UNKNOWN`, `TRUE` or `FALSE` (a number is kept as a number).
//! - `updated_at` is RFC 3339 in UTC (`Z`); a timestamp outside years
//!   0000–9999 is shown as `{"seconds": S, "nanos": N}`, which is also
//!   accepted on input.
//! - Unknown keys are rejected, with the path of the offending field.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::{condition, Condition, Id, Reference, Resource, Status, Tenancy, Type};
use serde_json::{json, Map, Value};

use cairn_client::ClientError;

/// A JSON document that does not describe a resource; `path` is dotted
/// (`status.x.conditions[0].state`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct JsonError {
    pub path: String,
    pub reason: String,
}

impl From<JsonError> for ClientError {
    fn from(e: JsonError) -> ClientError {
        ClientError::InvalidArgument {
            field: e.path,
            reason: e.reason,
        }
    }
}

fn err(path: &str, reason: impl Into<String>) -> JsonError {
    JsonError {
        path: if path.is_empty() {
            "resource".into()
        } else {
            path.to_string()
        },
        reason: reason.into(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

// ---------------------------------------------------------------- output ----

/// The JSON form of a resource.
pub fn resource_to_json(r: &Resource) -> Value {
    let mut m = Map::new();
    m.insert(
        "id".into(),
        id_to_json(r.id.as_ref().unwrap_or(&Id::default())),
    );
    if let Some(owner) = &r.owner {
        m.insert("owner".into(), id_to_json(owner));
    }
    m.insert("version".into(), Value::String(r.version.clone()));
    if !r.generation.is_empty() {
        m.insert("generation".into(), Value::String(r.generation.clone()));
    }
    if r.lease != 0 {
        m.insert("lease".into(), Value::from(r.lease));
    }
    if !r.metadata.is_empty() {
        let metadata: Map<String, Value> = r
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        m.insert("metadata".into(), Value::Object(metadata));
    }
    if !r.status.is_empty() {
        let status: Map<String, Value> = r
            .status
            .iter()
            .map(|(k, s)| (k.clone(), status_to_json(s)))
            .collect();
        m.insert("status".into(), Value::Object(status));
    }
    if let Some(data) = &r.data {
        m.insert("data".into(), data_to_json(data));
    }
    Value::Object(m)
}

/// The JSON form of an id.
pub fn id_to_json(id: &Id) -> Value {
    let mut m = Map::new();
    m.insert("uid".into(), Value::String(id.uid.clone()));
    m.insert("name".into(), Value::String(id.name.clone()));
    m.insert(
        "type".into(),
        type_to_json(id.r#type.as_ref().unwrap_or(&Type::default())),
    );
    m.insert(
        "tenancy".into(),
        tenancy_to_json(id.tenancy.as_ref().unwrap_or(&Tenancy::default())),
    );
    Value::Object(m)
}

fn type_to_json(t: &Type) -> Value {
    json!({"group": t.group, "group_version": t.group_version, "kind": t.kind})
}

fn tenancy_to_json(t: &Tenancy) -> Value {
    json!({"partition": t.partition, "namespace": t.namespace})
}

fn status_to_json(s: &Status) -> Value {
    let mut m = Map::new();
    if !s.observed_generation.is_empty() {
        m.insert(
            "observed_generation".into(),
            Value::String(s.observed_generation.clone()),
        );
    }
    if !s.conditions.is_empty() {
        m.insert(
            "conditions".into(),
            Value::Array(s.conditions.iter().map(condition_to_json).collect()),
        );
    }
    if let Some(t) = &s.updated_at {
        m.insert("updated_at".into(), timestamp_to_json(t));
    }
    Value::Object(m)
}

fn condition_to_json(c: &Condition) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), Value::String(c.r#type.clone()));
    let state = match condition::State::try_from(c.state) {
        Ok(condition::State::Unknown) => Value::String("UNKNOWN".into()),
        Ok(condition::State::True) => Value::String("TRUE".into()),
        Ok(condition::State::False) => Value::String("FALSE".into()),
        Err(_) => Value::from(c.state),
    };
    m.insert("state".into(), state);
    if !c.reason.is_empty() {
        m.insert("reason".into(), Value::String(c.reason.clone()));
    }
    if !c.message.is_empty() {
        m.insert("message".into(), Value::String(c.message.clone()));
    }
    if let Some(r) = &c.resource {
        let mut rm = Map::new();
        rm.insert(
            "type".into(),
            type_to_json(r.r#type.as_ref().unwrap_or(&Type::default())),
        );
        rm.insert(
            "tenancy".into(),
            tenancy_to_json(r.tenancy.as_ref().unwrap_or(&Tenancy::default())),
        );
        rm.insert("name".into(), Value::String(r.name.clone()));
        if !r.section.is_empty() {
            rm.insert("section".into(), Value::String(r.section.clone()));
        }
        m.insert("resource".into(), Value::Object(rm));
    }
    Value::Object(m)
}

/// The JSON form of a data payload: `json` when lossless, else `base64`.
pub fn data_to_json(data: &Any) -> Value {
    match payload_as_json(&data.value) {
        Some(v) => json!({"type_url": data.type_url, "json": v}),
        None => json!({"type_url": data.type_url, "base64": BASE64.encode(&data.value)}),
    }
}

/// The payload as JSON if it is JSON text in exactly the compact form this
/// module writes (so re-writing it gives the same bytes).
pub fn payload_as_json(bytes: &[u8]) -> Option<Value> {
    if bytes.is_empty() {
        return None;
    }
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let again = serde_json::to_vec(&value).ok()?;
    (again == bytes).then_some(value)
}

// ----------------------------------------------------------------- input ----

/// Reads a resource from its JSON form.
pub fn resource_from_json(v: &Value) -> Result<Resource, JsonError> {
    let o = Obj::new(v, "")?;
    o.only(&[
        "id",
        "owner",
        "version",
        "generation",
        "metadata",
        "status",
        "data",
        "lease",
    ])?;
    let id = match o.get("id") {
        Some(v) => id_from_json(v, "id")?,
        None => return Err(err("id", "is required")),
    };
    let owner = o
        .get("owner")
        .map(|v| id_from_json(v, "owner"))
        .transpose()?;
    let mut metadata = BTreeMap::new();
    if let Some(m) = o.object("metadata")? {
        for (k, v) in m.map {
            let path = join("metadata", k);
            let s = v.as_str().ok_or_else(|| err(&path, "must be a string"))?;
            metadata.insert(k.clone(), s.to_string());
        }
    }
    let mut status = BTreeMap::new();
    if let Some(m) = o.object("status")? {
        for (k, v) in m.map {
            status.insert(k.clone(), status_from_json(v, &join("status", k))?);
        }
    }
    let data = o
        .get("data")
        .map(|v| data_from_json(v, "data"))
        .transpose()?;
    Ok(Resource {
        id: Some(id),
        owner: owner.map(Box::new),
        version: o.string("version")?,
        generation: o.string("generation")?,
        metadata,
        status,
        data,
        lease: match o.get("lease") {
            None => 0,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| err("lease", "must be a lease id (a whole number)"))?,
        },
    })
}

/// Reads an id from its JSON form.
pub fn id_from_json(v: &Value, path: &str) -> Result<Id, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["uid", "name", "type", "tenancy"])?;
    Ok(Id {
        uid: o.string("uid")?,
        name: o.string("name")?,
        r#type: o
            .get("type")
            .map(|v| type_from_json(v, &join(path, "type")))
            .transpose()?,
        tenancy: o
            .get("tenancy")
            .map(|v| tenancy_from_json(v, &join(path, "tenancy")))
            .transpose()?,
    })
}

fn type_from_json(v: &Value, path: &str) -> Result<Type, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["group", "group_version", "kind"])?;
    Ok(Type {
        group: o.string("group")?,
        group_version: o.string("group_version")?,
        kind: o.string("kind")?,
    })
}

fn tenancy_from_json(v: &Value, path: &str) -> Result<Tenancy, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["partition", "namespace"])?;
    Ok(Tenancy {
        partition: o.string("partition")?,
        namespace: o.string("namespace")?,
    })
}

pub fn status_from_json(v: &Value, path: &str) -> Result<Status, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["observed_generation", "conditions", "updated_at"])?;
    let mut conditions = Vec::new();
    match o.get("conditions") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                conditions.push(condition_from_json(
                    item,
                    &format!("{path}.conditions[{i}]"),
                )?);
            }
        }
        Some(_) => return Err(err(&join(path, "conditions"), "must be an array")),
    }
    Ok(Status {
        observed_generation: o.string("observed_generation")?,
        conditions,
        updated_at: o
            .get("updated_at")
            .map(|v| timestamp_from_json(v, &join(path, "updated_at")))
            .transpose()?,
    })
}

fn condition_from_json(v: &Value, path: &str) -> Result<Condition, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["type", "state", "reason", "message", "resource"])?;
    let state_path = join(path, "state");
    let state = match o.get("state") {
        None => condition::State::Unknown as i32,
        Some(Value::String(s)) => match s.to_ascii_uppercase().trim_start_matches("STATE_") {
            "UNKNOWN" => condition::State::Unknown as i32,
            "TRUE" => condition::State::True as i32,
            "FALSE" => condition::State::False as i32,
            _ => return Err(err(&state_path, "must be UNKNOWN, TRUE or FALSE")),
        },
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| err(&state_path, "is out of range"))?,
        Some(_) => return Err(err(&state_path, "must be UNKNOWN, TRUE or FALSE")),
    };
    let resource = match o.get("resource") {
        None => None,
        Some(v) => {
            let rpath = join(path, "resource");
            let r = Obj::new(v, &rpath)?;
            r.only(&["type", "tenancy", "name", "section"])?;
            Some(Reference {
                r#type: r
                    .get("type")
                    .map(|v| type_from_json(v, &join(&rpath, "type")))
                    .transpose()?,
                tenancy: r
                    .get("tenancy")
                    .map(|v| tenancy_from_json(v, &join(&rpath, "tenancy")))
                    .transpose()?,
                name: r.string("name")?,
                section: r.string("section")?,
            })
        }
    };
    Ok(Condition {
        r#type: o.string("type")?,
        state,
        reason: o.string("reason")?,
        message: o.string("message")?,
        resource,
    })
}

/// Reads a data payload: `{"type_url", "json"}` or `{"type_url", "base64"}`.
pub fn data_from_json(v: &Value, path: &str) -> Result<Any, JsonError> {
    let o = Obj::new(v, path)?;
    o.only(&["type_url", "json", "base64"])?;
    let type_url = o.string("type_url")?;
    let value = match (o.get("json"), o.get("base64")) {
        (Some(j), None) => Bytes::from(json_payload(j)),
        (None, Some(Value::String(b))) => Bytes::from(
            BASE64
                .decode(b.as_bytes())
                .map_err(|e| err(&join(path, "base64"), format!("is not base64: {e}")))?,
        ),
        (None, Some(_)) => return Err(err(&join(path, "base64"), "must be a string")),
        (None, None) => Bytes::new(),
        (Some(_), Some(_)) => return Err(err(path, "give either json or base64, not both")),
    };
    Ok(Any { type_url, value })
}

/// The bytes stored for a JSON payload: its compact serialisation.
pub fn json_payload(v: &Value) -> Vec<u8> {
    // Serialising a Value into a Vec cannot fail (keys are strings).
    serde_json::to_vec(v).unwrap_or_else(|_| unreachable!("a JSON value always serialises"))
}

/// A JSON object being read, with the path used in errors.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, path: &str) -> Result<Obj<'a>, JsonError> {
        match v {
            Value::Object(map) => Ok(Obj {
                path: path.to_string(),
                map,
            }),
            _ => Err(err(path, "must be an object")),
        }
    }

    fn only(&self, allowed: &[&str]) -> Result<(), JsonError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(err(&join(&self.path, k), "unknown field")),
            None => Ok(()),
        }
    }

    /// The value at `key`; `null` counts as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<String, JsonError> {
        match self.get(key) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(err(&join(&self.path, key), "must be a string")),
        }
    }

    fn object(&self, key: &str) -> Result<Option<Obj<'a>>, JsonError> {
        self.get(key)
            .map(|v| Obj::new(v, &join(&self.path, key)))
            .transpose()
    }
}

// ------------------------------------------------------------ timestamps ----

pub use cairn_proto::rfc3339::{format_timestamp, parse_timestamp};

fn timestamp_to_json(t: &Timestamp) -> Value {
    match format_timestamp(t) {
        Some(s) => Value::String(s),
        None => json!({"seconds": t.seconds, "nanos": t.nanos}),
    }
}

fn timestamp_from_json(v: &Value, path: &str) -> Result<Timestamp, JsonError> {
    match v {
        Value::String(s) => parse_timestamp(s).ok_or_else(|| {
            err(
                path,
                "must be an RFC 3339 UTC time such as 2024-03-01T10:00:00Z",
            )
        }),
        Value::Object(_) => {
            let o = Obj::new(v, path)?;
            o.only(&["seconds", "nanos"])?;
            let seconds = match o.get("seconds") {
                None => 0,
                Some(n) => n
                    .as_i64()
                    .ok_or_else(|| err(&join(path, "seconds"), "must be an integer"))?,
            };
            let nanos = match o.get("nanos") {
                None => 0,
                Some(n) => n
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| err(&join(path, "nanos"), "must be a 32-bit integer"))?,
            };
            Ok(Timestamp { seconds, nanos })
        }
        _ => Err(err(path, "must be an RFC 3339 string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::rfc3339::RFC3339_SECONDS_MAX;

    fn full_resource() -> Resource {
        let t = Type {
            group: "catalog".into(),
            group_version: "v2".into(),
            kind: "Service".into(),
        };
        let ten = Tenancy {
            partition: "default".into(),
            namespace: "ns1".into(),
        };
        Resource {
            lease: 0,
            id: Some(Id {
                uid: "01HV6Q7ZJ5K8Y3T2W9XG4M1N0P".into(),
                name: "web".into(),
                r#type: Some(t.clone()),
                tenancy: Some(ten.clone()),
            }),
            owner: Some(Box::new(Id {
                uid: "u0".into(),
                name: "parent".into(),
                r#type: Some(t.clone()),
                tenancy: Some(ten.clone()),
            })),
            version: "12".into(),
            generation: "g7".into(),
            metadata: BTreeMap::from([("team".into(), "a".into()), ("z".into(), "".into())]),
            status: BTreeMap::from([(
                "ctl".into(),
                Status {
                    observed_generation: "g7".into(),
                    conditions: vec![
                        Condition {
                            r#type: "Accepted".into(),
                            state: condition::State::True as i32,
                            reason: "Ok".into(),
                            message: "fine".into(),
                            resource: Some(Reference {
                                r#type: Some(t),
                                tenancy: Some(ten),
                                name: "web".into(),
                                section: "s".into(),
                            }),
                        },
                        Condition {
                            state: 7,
                            ..Default::default()
                        },
                    ],
                    updated_at: Some(Timestamp {
                        seconds: 1_709_287_200,
                        nanos: 5,
                    }),
                },
            )]),
            data: Some(Any {
                type_url: "type.googleapis.com/catalog.v2.Service".into(),
                value: Bytes::from_static(br#"{"port":80}"#),
            }),
        }
    }

    #[test]
    fn every_field_round_trips_through_json() {
        // resource -> JSON -> text -> JSON -> resource gives the same resource.
        let r = full_resource();
        let text = serde_json::to_string_pretty(&resource_to_json(&r)).unwrap();
        let back = resource_from_json(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn json_payloads_show_as_json_and_other_bytes_as_base64() {
        // The compact JSON bytes are shown as JSON; protobuf bytes and
        // non-canonical JSON text fall back to base64, both round trip.
        let v = data_to_json(&Any {
            type_url: "u".into(),
            value: Bytes::from_static(br#"{"a":[1,2],"b":"x"}"#),
        });
        assert_eq!(v, json!({"type_url": "u", "json": {"a": [1, 2], "b": "x"}}));
        for raw in [&[0x08, 0x96, 0x01][..], b"{ \"a\": 1 }", b""] {
            let any = Any {
                type_url: "u".into(),
                value: Bytes::copy_from_slice(raw),
            };
            let v = data_to_json(&any);
            assert!(v.get("base64").is_some(), "{v}");
            assert_eq!(data_from_json(&v, "data").unwrap(), any);
        }
    }

    #[test]
    fn written_json_is_stored_in_compact_form() {
        // Whitespace in the input does not reach the stored bytes.
        let v: Value =
            serde_json::from_str(r#"{"type_url": "u", "json": { "port" : 80 }}"#).unwrap();
        assert_eq!(
            data_from_json(&v, "data").unwrap().value.as_ref(),
            br#"{"port":80}"#
        );
    }

    #[test]
    fn unknown_and_mistyped_fields_are_rejected_with_their_path() {
        // Every error names the field at fault.
        let cases = [
            (json!({"id": {"name": "n"}, "colour": 1}), "colour"),
            (json!({"id": {"name": 3}}), "id.name"),
            (json!({}), "id"),
            (json!({"id": {}, "metadata": {"k": 1}}), "metadata.k"),
            (json!({"id": {}, "data": {"json": 1, "base64": ""}}), "data"),
            (json!({"id": {}, "data": {"base64": "!!"}}), "data.base64"),
            (
                json!({"id": {}, "status": {"s": {"conditions": [{"state": "MAYBE"}]}}}),
                "status.s.conditions[0].state",
            ),
            (
                json!({"id": {}, "status": {"s": {"updated_at": "yesterday"}}}),
                "status.s.updated_at",
            ),
            (json!([1]), "resource"),
        ];
        for (input, path) in cases {
            match resource_from_json(&input) {
                Err(e) => assert_eq!(e.path, path, "{input}"),
                Ok(r) => panic!("{input} was accepted as {r:?}"),
            }
        }
    }

    #[test]
    fn nulls_and_absent_fields_are_empty() {
        // A minimal document gives a resource with empty fields.
        let r =
            resource_from_json(&json!({"id": {"name": "n", "uid": null}, "owner": null})).unwrap();
        assert_eq!(r.id.as_ref().map(|i| i.name.as_str()), Some("n"));
        assert_eq!(r.owner, None);
        assert_eq!(r.version, "");
        assert_eq!(r.data, None);
    }

    #[test]
    fn timestamps_outside_rfc3339_years_fall_back_to_the_object_form() {
        let far = Timestamp {
            seconds: RFC3339_SECONDS_MAX + 1,
            nanos: 0,
        };
        let v = timestamp_to_json(&far);
        assert_eq!(timestamp_from_json(&v, "t"), Ok(far));
    }
}
