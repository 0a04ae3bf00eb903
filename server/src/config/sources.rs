//! Where settings come from: the layers (defaults < file < `CAIRN_*` environment variables
//! < flags), which environment variables are read, how a value that does not load is
//! reported, and `cairn agent --print-config`.
//!
//! The setting names come from [`Config`] itself (its serialized keys): the environment
//! variables read, the flags' defaults and `docs/configuration.md` all follow them.

use std::path::Path;
use std::sync::LazyLock;

use figment::error::{Actual, Kind};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider};

use super::{invalid, Config, ConfigError};

/// The prefix of every environment variable that names a setting.
const ENV_PREFIX: &str = "CAIRN_";

/// The layer names figment records for each value (its metadata's name); files are named
/// `file PATH`.
const DEFAULTS: &str = "default";
const ENVIRONMENT: &str = "environment";
const FLAGS: &str = "flag";

/// Every top-level setting, in [`Config`]'s order: the field names its `Deserialize` asks
/// for (what the file, the environment and the flags may set).
pub fn setting_keys() -> &'static [String] {
    static KEYS: LazyLock<Vec<String>> = LazyLock::new(|| {
        struct_fields::<Config>()
            .iter()
            .map(|f| f.to_string())
            .collect()
    });
    &KEYS
}

/// The field names a struct's derived `Deserialize` passes to `deserialize_struct`.
fn struct_fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// Whether `key` (any case) names a top-level setting.
pub fn is_setting(key: &str) -> bool {
    setting_keys().iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// The environment variable of a setting: `CAIRN_NODE_ID` for `node_id`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
}

/// The flag of a setting: `--node-id` for `node_id`.
pub fn flag_name(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

/// The `CAIRN_*` variables that name no setting but are read by the `cairn` command line
/// (its cluster flags: `--endpoints`, `--token`, `--cacert`, `--cert`, `--key`), which are
/// often set where a node runs: the agent neither reads them nor warns about them. The
/// command line's flags are held to this list by its tests (the command line stands above
/// the configuration, which therefore names them rather than asks it).
pub const COMMAND_LINE_ENVIRONMENT: &[&str] = &[
    "CAIRN_ENDPOINTS",
    "CAIRN_TOKEN",
    "CAIRN_CACERT",
    "CAIRN_CERT",
    "CAIRN_KEY",
];

/// The `CAIRN_*` variables of this process that name no setting and that the command-line
/// client does not read (Kubernetes' `CAIRN_PORT`, `CAIRN_SERVICE_HOST` for a Service
/// named `cairn`, typos), sorted. The node ignores them and warns once.
fn ignored_environment() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            name.len() > ENV_PREFIX.len()
                && name[..ENV_PREFIX.len()].eq_ignore_ascii_case(ENV_PREFIX)
                && !is_setting(&name[ENV_PREFIX.len()..])
                && !COMMAND_LINE_ENVIRONMENT
                    .iter()
                    .any(|c| c.eq_ignore_ascii_case(name))
        })
        .collect();
    names.sort();
    names
}

/// Logs one warning naming `ignored_environment`, if there is any (never their values).
pub fn warn_ignored_environment() {
    let ignored = ignored_environment();
    if !ignored.is_empty() {
        tracing::warn!(
            variables = %ignored.join(", "),
            "ignoring environment variables that name no setting (the settings are listed in \
             docs/configuration.md)"
        );
    }
}

/// A provider under a name of ours (the layer), so that a value's metadata says where it
/// came from.
struct Layer<P> {
    name: String,
    inner: P,
}

impl<P: Provider> Provider for Layer<P> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        self.inner.data()
    }

    fn profile(&self) -> Option<Profile> {
        self.inner.profile()
    }
}

fn layer<P: Provider>(name: impl Into<String>, inner: P) -> Layer<P> {
    Layer {
        name: name.into(),
        inner,
    }
}

/// The layers: defaults < file < environment < flags (not validated).
pub(super) fn figment(
    file: Option<&Path>,
    flags: Serialized<serde_json::Value>,
) -> Result<Figment, ConfigError> {
    let mut figment = Figment::from(layer(DEFAULTS, Serialized::defaults(Config::default())));
    if let Some(file) = file {
        if !file.exists() {
            return Err(invalid(
                "config",
                format!("file {} does not exist", file.display()),
            ));
        }
        figment = figment.merge(layer(format!("file {}", file.display()), Toml::file(file)));
    }
    // Only variables naming a setting: any other `CAIRN_*` (a Kubernetes service link, a
    // typo, the client's CAIRN_ENDPOINTS) is no concern of the node's.
    let environment = Env::prefixed(ENV_PREFIX).filter(|key| is_setting(key.as_str()));
    Ok(figment
        .merge(layer(ENVIRONMENT, environment))
        .merge(layer(FLAGS, flags)))
}

/// Where the value of `key` (a dotted path) came from, in words: `default`, `file PATH`,
/// `environment variable CAIRN_X`, `flag --x`.
fn describe(metadata: Option<&Metadata>, key: &str) -> String {
    let top = key.split('.').next().unwrap_or(key);
    match metadata.map(|m| m.name.as_ref()) {
        None | Some(DEFAULTS) => DEFAULTS.to_string(),
        Some(ENVIRONMENT) => format!("environment variable {}", env_name(top)),
        Some(FLAGS) => format!("flag {}", flag_name(top)),
        Some(other) => other.to_string(),
    }
}

/// A value figment could not load, in the operator's words: the key, what is wrong, and
/// where the value came from.
pub(super) fn load_error(e: figment::Error) -> ConfigError {
    let mut path = e.path.clone();
    let reason = match &e.kind {
        Kind::UnknownField(name, _) => {
            if path.last() != Some(name) {
                path.push(name.clone());
            }
            "is not a setting (every setting is listed in docs/configuration.md)".to_string()
        }
        Kind::MissingField(name) => {
            if path.last().map(String::as_str) != Some(name.as_ref()) {
                path.push(name.to_string());
            }
            "is required".to_string()
        }
        Kind::UnknownVariant(found, expected) => {
            format!("is `{found}`, must be one of {}", expected.join(", "))
        }
        Kind::InvalidType(found, expected) | Kind::InvalidValue(found, expected) => {
            format!("is {}, must be {}", actual(found), expected_text(expected))
        }
        Kind::Message(message) => message.clone(),
        other => other.to_string(),
    };
    let field = path.join(".");
    let from = describe(e.metadata.as_ref(), &field);
    if field.is_empty() {
        ConfigError::Source { from, reason }
    } else {
        ConfigError::Value {
            field,
            reason,
            from,
        }
    }
}

fn actual(found: &Actual) -> String {
    match found {
        Actual::Str(s) => format!("{s:?}"),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Signed(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Bool(b) => b.to_string(),
        Actual::Seq => "a list".into(),
        Actual::Map => "a table".into(),
        Actual::Unit | Actual::Option => "empty".into(),
        other => other.to_string(),
    }
}

fn expected_text(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer".into(),
        "a sequence" => "a list".into(),
        "a boolean" => "true or false".into(),
        s if s.starts_with("struct ") || s.starts_with("a map") => "a table".into(),
        s => s.to_string(),
    }
}

/// What `cairn agent --print-config` shows: the configuration as TOML, with where each value
/// came from; and whether it is valid.
pub struct Explained {
    pub text: String,
    /// Why the configuration would not start a node, if it would not.
    pub invalid: Option<ConfigError>,
}

/// Values never printed: `token_sha256` is a password hash (a weak token could be guessed
/// from it). Token and key *files* are paths, and are printed.
const SECRET_KEYS: &[&str] = &["token_sha256"];

/// The column source comments start at.
const COMMENT_COLUMN: usize = 48;

pub(super) fn explain(
    file: Option<&Path>,
    flags: Serialized<serde_json::Value>,
) -> Result<Explained, ConfigError> {
    let figment = figment(file, flags)?;
    let config: Config = figment.extract().map_err(load_error)?;
    let problem = config.validate().err();
    let body = toml::to_string(&config).map_err(|e| invalid("config", e.to_string()))?;
    let mut text = String::from(
        "# The effective configuration of this `cairn agent`, and where each value came from\n\
         # (default < config file < CAIRN_* environment variable < flag).\n",
    );
    let ignored = ignored_environment();
    if !ignored.is_empty() {
        text.push_str(&format!(
            "# Ignored (they name no setting): {}\n",
            ignored.join(", ")
        ));
    }
    // The table the lines are in (`auth`, `members`, `auth.grants`, ...); whether it is
    // (inside) an entry of an array of tables, whose lines share the array's source.
    let mut section = String::new();
    let mut in_array = false;
    let mut annotated: Vec<String> = Vec::new();
    for line in body.lines() {
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_matches(|c| c == '[' || c == ']').to_string();
            let owner = owning_key(&section);
            in_array = line.starts_with("[[") || owner != section;
            if annotated.contains(&owner) {
                text.push_str(line);
                text.push('\n');
            } else {
                text.push_str(&format!(
                    "{}# {}\n",
                    pad(line),
                    describe(figment.find_metadata(&owner), &owner)
                ));
                annotated.push(owner);
            }
            continue;
        }
        let Some((key, _)) = line.split_once(" = ") else {
            text.push_str(line);
            text.push('\n');
            continue;
        };
        let key = key.trim();
        if SECRET_KEYS.contains(&key) {
            text.push_str(&format!("# {key} = (set; not shown)\n"));
            continue;
        }
        if in_array {
            text.push_str(line);
            text.push('\n');
            continue;
        }
        let full = if section.is_empty() {
            key.to_string()
        } else {
            format!("{section}.{key}")
        };
        text.push_str(&format!(
            "{}# {}\n",
            pad(line),
            describe(figment.find_metadata(&full), &full)
        ));
    }
    if let Ok(serde_json::Value::Object(values)) = serde_json::to_value(&config) {
        let unset: Vec<&str> = setting_keys()
            .iter()
            .filter(|k| values.get(k.as_str()).is_some_and(|v| v.is_null()))
            .map(|k| k.as_str())
            .collect();
        if !unset.is_empty() {
            text.push_str(&format!("\n# Not set: {}\n", unset.join(", ")));
        }
    }
    Ok(Explained {
        text,
        invalid: problem,
    })
}

/// The key whose source covers a section: `members` for `members` (an array of tables),
/// `auth.grants` for `auth.grants` and `auth.grants.read`, `auth` for `auth`.
fn owning_key(section: &str) -> String {
    let mut parts = section.split('.');
    match (parts.next(), parts.next()) {
        (Some("auth"), Some(sub)) => format!("auth.{sub}"),
        (Some(top), _) => top.to_string(),
        (None, _) => String::new(),
    }
}

fn pad(line: &str) -> String {
    let width = COMMENT_COLUMN.max(line.len() + 2);
    format!("{line:<width$}")
}

/// Settings that must be given: their value in [`Config::default`] is a placeholder that
/// validation refuses.
pub const REQUIRED: &[&str] = &["node_id"];

/// A setting's default as the operator writes it; `None` when it is unset by default (or
/// [`REQUIRED`]). The `cairn agent` flag named after a setting shows it in its help.
pub fn default_text(key: &str) -> Option<String> {
    if REQUIRED.contains(&key) {
        return None;
    }
    static DEFAULTS: LazyLock<serde_json::Value> =
        LazyLock::new(|| serde_json::to_value(Config::default()).expect("the defaults serialize"));
    match DEFAULTS.get(key)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(a) if a.is_empty() => None,
        serde_json::Value::Object(_) => None,
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_are_the_config_fields_in_order() {
        let keys = setting_keys();
        assert_eq!(keys.first().map(String::as_str), Some("node_id"));
        assert_eq!(
            keys.last().map(String::as_str),
            Some("keepalive_timeout_ms")
        );
        let serde_json::Value::Object(all) = serde_json::to_value(Config::default()).unwrap()
        else {
            panic!("a table")
        };
        let mut sorted = keys.to_vec();
        sorted.sort();
        assert_eq!(sorted, all.keys().cloned().collect::<Vec<_>>());
        assert!(is_setting("NODE_ID") && is_setting("log_level"));
        assert!(!is_setting("port") && !is_setting("service_host") && !is_setting("foo"));
    }

    #[test]
    fn a_value_that_does_not_load_names_its_field_and_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "node_id = 1\nelection_timeout_ms = \"soon\"\n").unwrap();
        let flags = Serialized::defaults(serde_json::json!({}));
        let e = Config::load(Some(&file), flags).unwrap_err().to_string();
        assert!(
            e.contains("`election_timeout_ms`")
                && e.contains("\"soon\"")
                && e.contains(&format!("file {}", file.display())),
            "{e}"
        );
        std::fs::write(&file, "node_id = 1\nport = 7001\n").unwrap();
        let flags = Serialized::defaults(serde_json::json!({}));
        let e = Config::load(Some(&file), flags).unwrap_err().to_string();
        assert!(e.contains("field `port`: is not a setting"), "{e}");
        let flags = Serialized::defaults(serde_json::json!({"log_format": "xml"}));
        let e = Config::load(None, flags).unwrap_err().to_string();
        assert!(
            e.contains("`log_format`")
                && e.contains("text, json")
                && e.contains("flag --log-format"),
            "{e}"
        );
    }
}
