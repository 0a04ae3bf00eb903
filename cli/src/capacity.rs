//! `cairn alarm list | disarm` and `cairn quota set | list | delete` (`docs/operations.md`,
//! "Capacity").
//!
//! Alarms go through the AdminService (`Alarm`); a disarm runs on the leader. Tenant quotas
//! are resources of the reserved type `cairn.v1.Quota` (group `cairn`, kind `Quota`), so
//! `quota set` is an upsert and `quota list` a list, through the ResourceService: they are
//! replicated and watched like any resource, and a grant must allow writing that type.

use bytes::Bytes;
use cairn_client::{Client, ClientError};
use cairn_fsm::capacity::{QUOTA_GROUP, QUOTA_GROUP_VERSION, QUOTA_KIND, QUOTA_TYPE_URL};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{self as pb, Consistency, Id, Resource, Tenancy, Type};
use clap::Subcommand;
use prost::Message;
use serde_json::json;

use crate::admin::{client_of, fail};
use crate::common::{exit, exit_code, GlobalArgs, OutputFormat};
use cairn_client::admin::Operation;

#[derive(Subcommand)]
pub enum AlarmCommand {
    /// The alarms raised in the cluster (as the first node that answers applied them).
    List,
    /// Clear NOSPACE through the log. The next write the space quota refuses raises it
    /// again: make room first (delete resources) or raise `data_bytes_max` on every node.
    Disarm,
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Create or replace the quota NAME of a tenancy, with its limits: `count=N`,
    /// `bytes=N`, `count/GROUP.KIND=N`, `bytes/GROUP.KIND=N` (bytes as accounted by the
    /// store; suffixes K, M, G, Ki, Mi, Gi).
    Set {
        name: String,
        /// PARTITION/NAMESPACE the quota limits.
        #[arg(long, default_value = "default/default", value_parser = crate::data::parse_tenancy)]
        tenancy: Tenancy,
        /// The limits, `KEY=VALUE`.
        #[arg(required = true, value_parser = parse_limit)]
        limits: Vec<(String, u64)>,
    },
    /// The quotas of the tenancies matching --tenancy (`*` for either part).
    List {
        #[arg(long, default_value = "*/*", value_parser = crate::data::parse_tenancy)]
        tenancy: Tenancy,
    },
    /// Remove the quota NAME of a tenancy (removing nothing is success).
    Delete {
        name: String,
        #[arg(long, default_value = "default/default", value_parser = crate::data::parse_tenancy)]
        tenancy: Tenancy,
    },
}

/// `KEY=VALUE` with a byte or count suffix.
fn parse_limit(s: &str) -> Result<(String, u64), String> {
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE (for example count=100)"))?;
    cairn_fsm::capacity::QuotaLimit::parse(key)?;
    Ok((key.to_string(), parse_quantity(value)?))
}

/// `100`, `64K`, `1Mi`, `2G`...
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a number (for example 100, 64Ki, 1G)"))?;
    let factor: u64 = match suffix {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => {
            return Err(format!(
                "{other:?} is not a suffix: use K, M, G, Ki, Mi or Gi"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `cairn alarm ...`.
pub async fn alarm(command: AlarmCommand, global: &GlobalArgs) -> u8 {
    let client = match client_of(global) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let disarm = matches!(command, AlarmCommand::Disarm);
    let request = pb::AlarmRequest { disarm };
    let answered = if disarm {
        client
            .at_leader(Operation::Mutation, |mut c| async move {
                c.alarm(request).await
            })
            .await
    } else {
        client
            .first_status(|_| Ok(()))
            .await
            .map(|(_, status)| pb::AlarmResponse {
                alarms: status.alarms,
                log_index: 0,
            })
    };
    let r = match answered {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    match global.output {
        OutputFormat::Json => out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "alarms": r.alarms.iter().map(|a| json!({
                    "name": a.name, "raised_index": a.raised_index, "reason": a.reason,
                    "members": a.members,
                })).collect::<Vec<_>>(),
                "log_index": r.log_index,
            }))
            .unwrap_or_default()
        ),
        OutputFormat::Table => {
            if disarm {
                out!("disarmed at log index {}", r.log_index);
            }
            if r.alarms.is_empty() {
                if !disarm {
                    out!("no alarm is raised");
                }
            } else {
                for a in &r.alarms {
                    out!(
                        "{}\traised at index {}\t{}",
                        a.name,
                        a.raised_index,
                        a.reason
                    );
                }
            }
        }
    }
    exit::OK
}

fn quota_type() -> Type {
    Type {
        group: QUOTA_GROUP.into(),
        group_version: QUOTA_GROUP_VERSION.into(),
        kind: QUOTA_KIND.into(),
    }
}

fn quota_id(name: &str, tenancy: &Tenancy) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(quota_type()),
        tenancy: Some(tenancy.clone()),
    }
}

/// `cairn quota ...`.
pub async fn quota(command: QuotaCommand, global: &GlobalArgs) -> u8 {
    let client = match crate::data::client_of(global) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cairn: {e}");
            return exit_code(&e);
        }
    };
    match run_quota(&client, command, global.output).await {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("cairn: {e}");
            exit_code(&e)
        }
    }
}

async fn run_quota(
    client: &Client,
    command: QuotaCommand,
    output: OutputFormat,
) -> Result<(), ClientError> {
    match command {
        QuotaCommand::Set {
            name,
            tenancy,
            limits,
        } => {
            let hard: std::collections::BTreeMap<String, u64> = limits.into_iter().collect();
            let resource = Resource {
                id: Some(quota_id(&name, &tenancy)),
                data: Some(Any {
                    type_url: QUOTA_TYPE_URL.into(),
                    value: Bytes::from(pb::QuotaSpec { hard }.encode_to_vec()),
                }),
                ..Default::default()
            };
            let stored = crate::data::upsert(client, resource).await?;
            print_quotas(output, &[stored]);
        }
        QuotaCommand::List { tenancy } => {
            let listed = client
                .list(quota_type(), tenancy, "", Consistency::Strong)
                .await?;
            print_quotas(output, &listed.resources);
        }
        QuotaCommand::Delete { name, tenancy } => {
            match client
                .read(quota_id(&name, &tenancy), Consistency::Strong)
                .await
            {
                Ok(stored) => {
                    let id = stored.id.clone().unwrap_or_default();
                    client.delete(id, stored.version).await?;
                    out!(
                        "deleted quota {name} of {}/{}",
                        tenancy.partition,
                        tenancy.namespace
                    );
                }
                Err(ClientError::NotFound) => out!(
                    "no quota {name} in {}/{}",
                    tenancy.partition,
                    tenancy.namespace
                ),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn print_quotas(output: OutputFormat, quotas: &[Resource]) {
    let rows: Vec<(String, String, String, u64)> = quotas
        .iter()
        .flat_map(|r| {
            let id = r.id.clone().unwrap_or_default();
            let tenancy = id.tenancy.unwrap_or_default();
            let spec = r
                .data
                .as_ref()
                .and_then(|d| pb::QuotaSpec::decode(d.value.as_ref()).ok())
                .unwrap_or_default();
            spec.hard.into_iter().map(move |(key, value)| {
                (
                    format!("{}/{}", tenancy.partition, tenancy.namespace),
                    id.name.clone(),
                    key,
                    value,
                )
            })
        })
        .collect();
    match output {
        OutputFormat::Json => out!(
            "{}",
            serde_json::to_string_pretty(
                &rows
                    .iter()
                    .map(|(tenancy, name, limit, value)| json!({
                        "tenancy": tenancy, "name": name, "limit": limit, "value": value,
                    }))
                    .collect::<Vec<_>>()
            )
            .unwrap_or_default()
        ),
        OutputFormat::Table => {
            if rows.is_empty() {
                out!("no quota");
            }
            for (tenancy, name, limit, value) in rows {
                out!("{tenancy}\t{name}\t{limit}\t{value}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_limits_parse_or_say_what_is_wrong() {
        assert_eq!(parse_quantity("100"), Ok(100));
        assert_eq!(parse_quantity("64Ki"), Ok(65_536));
        assert_eq!(parse_quantity("2G"), Ok(2_000_000_000));
        assert!(parse_quantity("1Ti").is_err());
        assert!(parse_quantity("x").is_err());
        assert_eq!(
            parse_limit("count/catalog.Service=5"),
            Ok(("count/catalog.Service".into(), 5))
        );
        assert!(parse_limit("pods=5").is_err());
        assert!(parse_limit("count").is_err());
    }
}
