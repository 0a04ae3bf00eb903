//! The console's query parameters, parsed and checked before anything else sees them. Pure.
//!
//! A query string is at most [`QUERY_BYTES_MAX`] bytes and [`PARAMETERS_MAX`] parameters;
//! each parameter is percent-decoded to UTF-8, named by the endpoint (an unknown or repeated
//! one is refused), and turned into the request the API takes. Names, types and tenancies
//! are then checked by the API's own validation (`cairn_forwarding::Executor::check_*`, the
//! one set of identifier rules), whose field names [`in_parameters`] turns back into the
//! parameter to blame: every refusal is `InvalidArgument` naming the parameter.

use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, Consistency};

/// The longest query string accepted.
pub const QUERY_BYTES_MAX: usize = 4096;
/// The most parameters one query may carry.
pub const PARAMETERS_MAX: usize = 16;
/// The most resources one listing answers (and the default when `limit` is absent).
pub const RESOURCES_LIMIT_MAX: u32 = 500;
pub const RESOURCES_LIMIT_DEFAULT: u32 = 100;

/// The decoded parameters of one query, each named once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn or<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.get(name).unwrap_or(default)
    }
}

/// `%XX` and `+` decoded; `Err` says what is wrong.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        "holds a '%' that is not followed by two hex digits".to_string()
                    })?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "is not UTF-8 once percent-decoded".to_string())
}

/// Parses a raw query (`None`: no query) for an endpoint that takes the parameters
/// `allowed`.
pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Params, ApiError> {
    let raw = raw.unwrap_or("");
    if raw.len() > QUERY_BYTES_MAX {
        return Err(ApiError::invalid(
            "query",
            format!("is {} bytes, more than {QUERY_BYTES_MAX}", raw.len()),
        ));
    }
    let mut params = Params::default();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        if params.0.len() == PARAMETERS_MAX {
            return Err(ApiError::invalid(
                "query",
                format!("holds more than {PARAMETERS_MAX} parameters"),
            ));
        }
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key)
            .map_err(|why| ApiError::invalid("query", format!("a parameter name {why}")))?;
        if !allowed.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                printable(&key),
                format!(
                    "is not a parameter of this endpoint (it takes {})",
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
        let value = percent_decode(value).map_err(|why| ApiError::invalid(key.as_str(), why))?;
        if params.get(&key).is_some() {
            return Err(ApiError::invalid(key, "is given more than once"));
        }
        params.0.push((key, value));
    }
    Ok(params)
}

/// A parameter name fit to be quoted back: at most 64 characters, control characters
/// escaped.
fn printable(name: &str) -> String {
    let short: String = name.chars().take(64).collect();
    format!("{short:?}")
}

/// The parameter of a field of the API's requests, as the executor's validation names it.
pub fn parameter_of(field: &str) -> &str {
    let field = field.strip_prefix("id.").unwrap_or(field);
    match field {
        "type.group" => "group",
        "type.group_version" => "version",
        "type.kind" => "kind",
        "tenancy.partition" => "partition",
        "tenancy.namespace" => "namespace",
        "name_prefix" => "prefix",
        // `name`, `limit`, `after`, and what has no parameter of its own (`type`, `tenancy`).
        _ => field,
    }
}

/// The API's refusal of a request built from parameters, naming the parameter instead of
/// the request's field.
pub fn in_parameters(error: ApiError) -> ApiError {
    match error {
        ApiError::InvalidArgument { field, reason } => ApiError::InvalidArgument {
            field: parameter_of(&field).to_string(),
            reason,
        },
        other => other,
    }
}

/// The type of `group` and `kind` (and `version`, where it matters: a read).
fn type_of(params: &Params) -> pb::Type {
    pb::Type {
        group: params.or("group", "").to_string(),
        group_version: params.or("version", "").to_string(),
        kind: params.or("kind", "").to_string(),
    }
}

/// A tenancy pattern of `partition` and `namespace`, each `*` (any) when absent.
fn tenancy_pattern(params: &Params) -> pb::Tenancy {
    pb::Tenancy {
        partition: params.or("partition", "*").to_string(),
        namespace: params.or("namespace", "*").to_string(),
    }
}

/// `limit`: 1..=[`RESOURCES_LIMIT_MAX`], [`RESOURCES_LIMIT_DEFAULT`] when absent.
fn limit(params: &Params) -> Result<u32, ApiError> {
    let Some(text) = params.get("limit") else {
        return Ok(RESOURCES_LIMIT_DEFAULT);
    };
    text.parse::<u32>()
        .ok()
        .filter(|n| (1..=RESOURCES_LIMIT_MAX).contains(n))
        .ok_or_else(|| {
            ApiError::invalid(
                "limit",
                format!("must be a whole number from 1 to {RESOURCES_LIMIT_MAX}"),
            )
        })
}

/// The parameters of `/ui/api/resources`.
pub const LIST_PARAMETERS: &[&str] =
    &["group", "kind", "partition", "namespace", "prefix", "limit"];

/// `/ui/api/resources`: one page (at most `limit`) of the resources of `group`.`kind` in
/// the tenancy pattern `partition`/`namespace` (each `*` when absent) whose names start
/// with `prefix`, as this node has applied them. Not yet validated: see the module docs.
pub fn list_request(params: &Params) -> Result<pb::ListRequest, ApiError> {
    Ok(pb::ListRequest {
        r#type: Some(type_of(params)),
        tenancy: Some(tenancy_pattern(params)),
        name_prefix: params.or("prefix", "").to_string(),
        consistency: Consistency::Eventual as i32,
        limit: limit(params)?,
        ..pb::ListRequest::default()
    })
}

/// The parameters of `/ui/api/resource`.
pub const READ_PARAMETERS: &[&str] =
    &["group", "version", "kind", "partition", "namespace", "name"];

/// `/ui/api/resource`: the resource `name` of `group`/`version`/`kind` in
/// `partition`/`namespace` (absent: empty, as in the API), as this node has applied it.
pub fn read_request(params: &Params) -> pb::ReadRequest {
    pb::ReadRequest {
        id: Some(pb::Id {
            uid: String::new(),
            name: params.or("name", "").to_string(),
            r#type: Some(type_of(params)),
            tenancy: Some(pb::Tenancy {
                partition: params.or("partition", "").to_string(),
                namespace: params.or("namespace", "").to_string(),
            }),
        }),
        consistency: Consistency::Eventual as i32,
        revision: 0,
    }
}

/// The parameters of `/ui/api/watch`.
pub const WATCH_PARAMETERS: &[&str] =
    &["group", "kind", "partition", "namespace", "prefix", "after"];

/// `/ui/api/watch`: the changes to `group`.`kind` in `partition`/`namespace` (each `*` when
/// absent) whose names start with `prefix`, after the revision `after` (absent: `now`, this
/// node's applied revision: changes from now on, no snapshot).
pub fn watch_request(params: &Params, now: u64) -> Result<pb::WatchListRequest, ApiError> {
    let start_revision = match params.get("after") {
        None => now,
        Some(text) => text
            .parse::<u64>()
            .map_err(|_| ApiError::invalid("after", "must be a revision (a whole number)"))?,
    };
    Ok(pb::WatchListRequest {
        r#type: Some(type_of(params)),
        tenancy: Some(tenancy_pattern(params)),
        name_prefix: params.or("prefix", "").to_string(),
        start_revision,
        consistency: Consistency::Eventual as i32,
        selector: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(e: ApiError) -> String {
        match e {
            ApiError::InvalidArgument { field, .. } => field,
            other => panic!("not an invalid argument: {other}"),
        }
    }

    #[test]
    fn queries_are_decoded_and_bounded() {
        let allowed = &["group", "kind", "name"];
        let ok: [(&str, &[(&str, &str)]); 5] = [
            ("", &[]),
            (
                "group=demo&kind=Thing",
                &[("group", "demo"), ("kind", "Thing")],
            ),
            ("name=a%20b+c", &[("name", "a b c")]),
            ("name=%C3%A9t%C3%A9", &[("name", "été")]),
            ("group&&kind=", &[("group", ""), ("kind", "")]),
        ];
        for (raw, want) in ok {
            let params = parse(Some(raw), allowed).unwrap();
            for (k, v) in want {
                assert_eq!(params.get(k), Some(*v), "{raw}");
            }
        }
        let long = format!("name={}", "x".repeat(QUERY_BYTES_MAX));
        let refused = [
            ("colour=red", "\"colour\""),
            ("name=a&name=b", "name"),
            ("name=%zz", "name"),
            ("name=%e9", "name"),
            ("name=%4", "name"),
            (long.as_str(), "query"),
            ("%ff=1", "query"),
        ];
        for (raw, blamed) in refused {
            assert_eq!(
                field(parse(Some(raw), allowed).unwrap_err()),
                blamed,
                "{raw}"
            );
        }
        let names: Vec<String> = (0..=PARAMETERS_MAX).map(|i| format!("p{i}")).collect();
        let every: Vec<&str> = names.iter().map(String::as_str).collect();
        let at_most = names[..PARAMETERS_MAX].join("&");
        assert!(parse(Some(&at_most), &every).is_ok());
        let one_too_many = names.join("&");
        assert_eq!(
            field(parse(Some(&one_too_many), &every).unwrap_err()),
            "query"
        );
    }

    #[test]
    fn api_fields_name_their_parameters() {
        for (field, parameter) in [
            ("type.group", "group"),
            ("type.kind", "kind"),
            ("tenancy.partition", "partition"),
            ("tenancy.namespace", "namespace"),
            ("name_prefix", "prefix"),
            ("id.name", "name"),
            ("id.type.group", "group"),
            ("id.type.group_version", "version"),
            ("id.tenancy.namespace", "namespace"),
            ("limit", "limit"),
        ] {
            assert_eq!(parameter_of(field), parameter, "{field}");
        }
    }

    #[test]
    fn requests_are_built_with_their_defaults_and_bounds() {
        let params = |raw: &str, allowed| parse(Some(raw), allowed).unwrap();
        let list = list_request(&params("group=demo&kind=Thing", LIST_PARAMETERS)).unwrap();
        assert_eq!(list.limit, RESOURCES_LIMIT_DEFAULT);
        assert_eq!(
            list.tenancy.unwrap().partition,
            "*",
            "every tenancy by default"
        );
        assert_eq!(list.consistency, Consistency::Eventual as i32);
        for (limit, ok) in [
            ("1", true),
            ("500", true),
            ("0", false),
            ("501", false),
            ("-1", false),
            ("ten", false),
        ] {
            let raw = format!("group=demo&kind=Thing&limit={limit}");
            let built = list_request(&params(&raw, LIST_PARAMETERS));
            assert_eq!(built.is_ok(), ok, "limit={limit}");
            if let Err(e) = built {
                assert_eq!(field(e), "limit");
            }
        }
        let read = read_request(&params(
            "group=demo&version=v1&kind=Thing&partition=default&namespace=default&name=web",
            READ_PARAMETERS,
        ));
        let id = read.id.unwrap();
        assert_eq!(
            (id.name.as_str(), id.r#type.unwrap().group_version.as_str()),
            ("web", "v1")
        );
        let watch = watch_request(&params("group=demo&kind=Thing", WATCH_PARAMETERS), 42).unwrap();
        assert_eq!(watch.start_revision, 42, "from now on, without a snapshot");
        let watch = watch_request(
            &params("group=demo&kind=Thing&after=7", WATCH_PARAMETERS),
            42,
        )
        .unwrap();
        assert_eq!(watch.start_revision, 7);
        let bad = watch_request(&params("after=x", WATCH_PARAMETERS), 42).unwrap_err();
        assert_eq!(field(bad), "after");
    }

    #[test]
    fn the_apis_own_rules_blame_the_parameter() {
        // The one set of identifier rules: cairn_fsm's, as the executor applies them.
        let limits = cairn_fsm::Limits::default();
        let list = |raw: &str| {
            let request = list_request(&parse(Some(raw), LIST_PARAMETERS).unwrap()).unwrap();
            cairn_forwarding::checks::list(&limits, &request)
                .map(drop)
                .map_err(in_parameters)
        };
        assert!(list("group=demo&kind=Thing").is_ok());
        assert!(list("group=demo&kind=Thing&partition=*&namespace=web").is_ok());
        for (raw, blamed) in [
            ("kind=Thing", "group"),
            ("group=demo", "kind"),
            ("group=de*mo&kind=Thing", "group"),
            ("group=demo&kind=Thing&partition=a*", "partition"),
            ("group=demo&kind=Thing&namespace=%01", "namespace"),
            ("group=demo&kind=Thing&prefix=a*", "prefix"),
        ] {
            assert_eq!(field(list(raw).unwrap_err()), blamed, "{raw}");
        }
        let read = |raw: &str| {
            let request = read_request(&parse(Some(raw), READ_PARAMETERS).unwrap());
            cairn_forwarding::checks::read(&limits, &request)
                .map(drop)
                .map_err(in_parameters)
        };
        assert!(read("group=demo&version=v1&kind=Thing&name=web").is_ok());
        let long = format!(
            "group=demo&kind=Thing&name={}",
            "n".repeat(limits.name_bytes_max + 1)
        );
        for (raw, blamed) in [
            ("group=demo&kind=Thing", "name"),
            ("group=demo&kind=Thing&name=*", "name"),
            (long.as_str(), "name"),
            ("group=demo&version=v*&kind=Thing&name=a", "version"),
        ] {
            assert_eq!(field(read(raw).unwrap_err()), blamed, "{raw}");
        }
    }
}
