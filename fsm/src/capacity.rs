//! Capacity: what the table accounts for, the cluster's space quota with its `NOSPACE`
//! alarm, and per-tenant quotas (`docs/operations.md`, "Capacity").
//!
//! Everything here is a pure function of the replicated state, so every replica reaches
//! the same decision for the same log:
//! - **Usage** is the sum of [`accounted_bytes`] over the stored resources (kept up to date
//!   by `State::set`, per table and per tenant); it never depends on a node's configuration.
//! - **The space quota** ([`SpaceState::quota_bytes`]) is replicated: the leader proposes the
//!   lowest `data_bytes_max` its members report ([`CapacityAction::SetQuota`]).
//! - **The decision** ([`space_decision`]) refuses a write that makes the table larger when
//!   the alarm is raised or the write would take usage past the quota. Deletes and writes
//!   that shrink a resource are always accepted, so an operator can always make room.
//! - **The alarm** is raised through the log: by the entry whose write the quota refused,
//!   or by [`CapacityAction::RaiseAlarm`], which a node proposes when it refuses a write
//!   before proposing it. It is cleared by the entry that brings usage to or below the
//!   low-water mark ([`SpaceState::settle`]), or by [`CapacityAction::DisarmAlarm`].
//! - **Tenant quotas** are resources of the reserved type [`QUOTA_GROUP`]/[`QUOTA_KIND`];
//!   [`tenant_decision`] checks a write against the quotas of its tenancy.

use std::collections::BTreeMap;

use cairn_proto::v1::QuotaSpec;
use prost::Message;

use crate::FsmError;

/// What one stored resource costs beyond its encoding and its key: the table's tree node,
/// the shared handle and its header. Measured (`docs/benchmarks.md`, "Memory per
/// resource"); deliberately on the high side.
pub const RESOURCE_OVERHEAD_BYTES: u64 = 192;

/// What one owner-index entry costs beyond its key.
pub const OWNER_ENTRY_OVERHEAD_BYTES: u64 = 96;

/// The configuration key the space quota's refusals name.
pub const SPACE_LIMIT: &str = "data_bytes_max";

/// Whether `error` is a refusal by the space quota (not by a tenant quota).
pub fn is_space_refusal(error: &FsmError) -> bool {
    matches!(error, FsmError::ResourceExhausted { limit, .. } if limit == SPACE_LIMIT)
}

/// The alarm clears once usage is at or below this share of the quota.
pub const LOW_WATER_PERCENT: u64 = 90;

/// The group and kind of the reserved type whose resources are tenant quotas.
pub const QUOTA_GROUP: &str = "cairn";
pub const QUOTA_KIND: &str = "Quota";
/// The group version quotas are written with.
pub const QUOTA_GROUP_VERSION: &str = "v1";
/// The `type_url` of a quota's data.
pub const QUOTA_TYPE_URL: &str = "type.googleapis.com/cairn.v1.QuotaSpec";
/// Most limits in one quota.
pub const QUOTA_LIMITS_MAX: usize = 64;

/// What a stored resource counts for: its encoding, its storage key, its owner-index entry
/// (if owned) and the fixed overheads.
pub fn accounted_bytes(encoded_len: usize, key_len: usize, owner_entry_len: Option<usize>) -> u64 {
    encoded_len as u64
        + key_len as u64
        + RESOURCE_OVERHEAD_BYTES
        + owner_entry_len.map_or(0, |len| len as u64 + OWNER_ENTRY_OVERHEAD_BYTES)
}

/// Resources and their accounted bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub count: u64,
    pub bytes: u64,
}

impl Usage {
    /// Adds (`sign = true`) or removes one resource of `bytes`.
    pub(crate) fn change(&mut self, bytes: u64, add: bool) {
        if add {
            self.count += 1;
            self.bytes += bytes;
        } else {
            assert!(
                self.count >= 1 && self.bytes >= bytes,
                "usage never goes below what it counted"
            );
            self.count -= 1;
            self.bytes -= bytes;
        }
    }
}

/// The replicated space quota and its alarm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceState {
    /// The cluster's quota on [`Usage::bytes`]; 0 = none set (a cluster whose members
    /// never reported one, or a 0.1 cluster).
    pub quota_bytes: u64,
    /// The index of the entry that raised the `NOSPACE` alarm, while it is raised.
    pub alarm_index: Option<u64>,
}

/// A change to the [`SpaceState`], carried by `Command::Capacity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityAction {
    /// Sets the quota (0 = none); the leader proposes the lowest its members report.
    SetQuota(u64),
    /// Raises `NOSPACE` (a node refused a write for space before proposing it).
    RaiseAlarm,
    /// Clears `NOSPACE` (`cairn alarm disarm`); the next write over the quota raises it again.
    DisarmAlarm,
}

/// Why [`space_decision`] refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceRefusal {
    /// The `NOSPACE` alarm is raised: only writes that do not grow the table pass.
    Alarm,
    /// The write would take usage past the quota.
    Quota,
}

impl SpaceState {
    /// The usage at or below which a raised alarm clears.
    pub fn low_water_bytes(&self) -> u64 {
        self.quota_bytes / 100 * LOW_WATER_PERCENT
            + self.quota_bytes % 100 * LOW_WATER_PERCENT / 100
    }

    /// The state after `action`, applied at `index` with the table at `usage_bytes`.
    pub fn act(self, action: CapacityAction, index: u64, usage_bytes: u64) -> SpaceState {
        let next = match action {
            CapacityAction::SetQuota(quota_bytes) => SpaceState {
                quota_bytes,
                ..self
            },
            CapacityAction::RaiseAlarm => SpaceState {
                alarm_index: self.alarm_index.or(Some(index)),
                ..self
            },
            CapacityAction::DisarmAlarm => SpaceState {
                alarm_index: None,
                ..self
            },
        };
        // A raise at or below the low-water mark clears at once (nothing to raise), and so
        // does a raised alarm under a quota raised past the usage.
        next.settle(usage_bytes)
    }

    /// The invariant after every entry: a raised alarm has a quota, and usage above its
    /// low-water mark.
    pub fn holds_with(&self, usage_bytes: u64) -> bool {
        self.alarm_index.is_none() || (self.quota_bytes > 0 && usage_bytes > self.low_water_bytes())
    }

    /// Clears the alarm once usage is at or below the low-water mark (or no quota is set).
    /// Called after every applied entry that changed the table.
    pub fn settle(self, usage_bytes: u64) -> SpaceState {
        match self.alarm_index {
            Some(_) if self.quota_bytes == 0 || usage_bytes <= self.low_water_bytes() => {
                SpaceState {
                    alarm_index: None,
                    ..self
                }
            }
            _ => self,
        }
    }

    /// The refusal as the caller sees it: `RESOURCE_EXHAUSTED` naming the quota, the usage
    /// and the request's growth.
    pub fn refusal_error(
        &self,
        refusal: SpaceRefusal,
        usage_bytes: u64,
        growth_bytes: u64,
    ) -> FsmError {
        let reason = match refusal {
            SpaceRefusal::Alarm => format!(
                "the NOSPACE alarm is raised (usage {usage_bytes} bytes of the quota \
                 data_bytes_max = {} bytes; writes that grow the data resume once usage is at \
                 or below {} bytes): this write adds {growth_bytes} bytes; delete resources \
                 to make room",
                self.quota_bytes,
                self.low_water_bytes()
            ),
            SpaceRefusal::Quota => format!(
                "this write adds {growth_bytes} bytes to a usage of {usage_bytes} bytes, past \
                 the quota data_bytes_max = {} bytes; delete resources to make room",
                self.quota_bytes
            ),
        };
        FsmError::ResourceExhausted {
            limit: SPACE_LIMIT.into(),
            value: self.quota_bytes,
            reason,
        }
    }
}

/// The space decision for a write that changes the table's usage by `growth_bytes`
/// (negative: it shrinks), with the table at `usage_bytes`.
///
/// | growth | alarm  | quota                      | decision      |
/// |--------|--------|----------------------------|---------------|
/// | ≤ 0    | any    | any                        | accept        |
/// | > 0    | raised | any                        | refuse: Alarm |
/// | > 0    | clear  | none (0)                   | accept        |
/// | > 0    | clear  | usage + growth > quota     | refuse: Quota |
/// | > 0    | clear  | usage + growth ≤ quota     | accept        |
pub fn space_decision(
    space: SpaceState,
    usage_bytes: u64,
    growth_bytes: i64,
) -> Result<(), SpaceRefusal> {
    if growth_bytes <= 0 {
        return Ok(());
    }
    if space.alarm_index.is_some() {
        return Err(SpaceRefusal::Alarm);
    }
    if space.quota_bytes == 0 {
        return Ok(());
    }
    if usage_bytes.saturating_add(growth_bytes as u64) > space.quota_bytes {
        return Err(SpaceRefusal::Quota);
    }
    Ok(())
}

/// One limit of a tenant quota: what it counts and over which types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaLimit {
    /// `count`: resources in the tenancy, of every type.
    Count,
    /// `bytes`: accounted bytes in the tenancy, of every type.
    Bytes,
    /// `count/<group>.<kind>`.
    TypeCount { group: String, kind: String },
    /// `bytes/<group>.<kind>`.
    TypeBytes { group: String, kind: String },
}

impl QuotaLimit {
    /// Parses a limit's key (`count`, `bytes`, `count/<group>.<kind>`,
    /// `bytes/<group>.<kind>`); the error says what is wrong.
    pub fn parse(key: &str) -> Result<QuotaLimit, String> {
        match key {
            "count" => return Ok(QuotaLimit::Count),
            "bytes" => return Ok(QuotaLimit::Bytes),
            _ => {}
        }
        let Some((what, type_)) = key.split_once('/') else {
            return Err(format!(
                "{key:?} is not a limit: use count, bytes, count/<group>.<kind> or \
                 bytes/<group>.<kind>"
            ));
        };
        let Some((group, kind)) = type_.rsplit_once('.') else {
            return Err(format!("{key:?} names no type: use {what}/<group>.<kind>"));
        };
        if group.is_empty() || kind.is_empty() || type_.chars().any(|c| c.is_control() || c == '*')
        {
            return Err(format!(
                "{key:?} names no valid type: use {what}/<group>.<kind>"
            ));
        }
        let (group, kind) = (group.to_string(), kind.to_string());
        match what {
            "count" => Ok(QuotaLimit::TypeCount { group, kind }),
            "bytes" => Ok(QuotaLimit::TypeBytes { group, kind }),
            _ => Err(format!(
                "{key:?} counts {what:?}: a limit counts count or bytes"
            )),
        }
    }
}

/// A tenant quota's data, decoded and checked: at most [`QUOTA_LIMITS_MAX`] well-formed
/// limits. The error names the field.
pub fn parse_quota(
    data: Option<&cairn_proto::google::protobuf::Any>,
) -> Result<Vec<(QuotaLimit, u64)>, FsmError> {
    let Some(data) = data else {
        return Err(FsmError::invalid(
            "resource.data",
            format!("a {QUOTA_GROUP}.{QUOTA_KIND} needs data of type {QUOTA_TYPE_URL}"),
        ));
    };
    if data.type_url != QUOTA_TYPE_URL {
        return Err(FsmError::invalid(
            "resource.data.type_url",
            format!(
                "is {:?}; a {QUOTA_GROUP}.{QUOTA_KIND} holds {QUOTA_TYPE_URL}",
                data.type_url
            ),
        ));
    }
    let spec = QuotaSpec::decode(data.value.as_ref())
        .map_err(|e| FsmError::invalid("resource.data.value", format!("is no QuotaSpec: {e}")))?;
    quota_limits(&spec.hard)
}

/// Whether the type is the reserved quota type.
pub fn is_quota_type(group: &str, kind: &str) -> bool {
    group == QUOTA_GROUP && kind == QUOTA_KIND
}

/// The extra rule for a write of the reserved quota type: its data is a well-formed
/// [`QuotaSpec`]. Other writes pass.
pub fn validate_quota_write(resource: &cairn_proto::v1::Resource) -> Result<(), FsmError> {
    let is_quota = resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|t| is_quota_type(&t.group, &t.kind));
    if is_quota {
        parse_quota(resource.data.as_ref())?;
    }
    Ok(())
}

/// The limits of a quota's `hard` map, checked.
pub fn quota_limits(hard: &BTreeMap<String, u64>) -> Result<Vec<(QuotaLimit, u64)>, FsmError> {
    if hard.len() > QUOTA_LIMITS_MAX {
        return Err(FsmError::invalid(
            "resource.data.hard",
            format!("holds {} limits, more than {QUOTA_LIMITS_MAX}", hard.len()),
        ));
    }
    hard.iter()
        .map(|(key, value)| {
            QuotaLimit::parse(key)
                .map(|limit| (limit, *value))
                .map_err(|reason| FsmError::invalid(format!("resource.data.hard[{key:?}]"), reason))
        })
        .collect()
}

/// What a write does to its tenancy: the change in resource count (+1 for a create, else 0)
/// and in accounted bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantGrowth {
    pub count: i64,
    pub bytes: i64,
}

/// The tenant-quota decision for a write of type (`group`, `kind`) growing its tenancy by
/// `growth`, with the tenancy at `tenancy_usage` and the type in it at `type_usage`, under
/// the quotas of the tenancy (`(quota name, its limits)`). A limit refuses a write that
/// would take what it counts past it; a write that grows nothing it counts passes (so
/// deletes and shrinking writes always do). The refusal names the quota and the limit.
pub fn tenant_decision(
    quotas: &[(String, Vec<(QuotaLimit, u64)>)],
    group: &str,
    kind: &str,
    tenancy_usage: Usage,
    type_usage: Usage,
    growth: TenantGrowth,
) -> Result<(), FsmError> {
    for (name, limits) in quotas {
        for (limit, max) in limits {
            let (used, grows, key) = match limit {
                QuotaLimit::Count => (tenancy_usage.count, growth.count, "count".to_string()),
                QuotaLimit::Bytes => (tenancy_usage.bytes, growth.bytes, "bytes".to_string()),
                QuotaLimit::TypeCount { group: g, kind: k } if g == group && k == kind => {
                    (type_usage.count, growth.count, format!("count/{g}.{k}"))
                }
                QuotaLimit::TypeBytes { group: g, kind: k } if g == group && k == kind => {
                    (type_usage.bytes, growth.bytes, format!("bytes/{g}.{k}"))
                }
                QuotaLimit::TypeCount { .. } | QuotaLimit::TypeBytes { .. } => continue,
            };
            if grows > 0 && used.saturating_add(grows as u64) > *max {
                return Err(FsmError::ResourceExhausted {
                    limit: format!("quota {name} {key}"),
                    value: *max,
                    reason: format!(
                        "the tenant quota {name:?} allows {key} = {max}; {used} are used and \
                         this write adds {grows}"
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(quota_bytes: u64, alarm: bool) -> SpaceState {
        SpaceState {
            quota_bytes,
            alarm_index: alarm.then_some(7),
        }
    }

    #[test]
    fn the_space_decision_table() {
        use SpaceRefusal::*;
        // (quota, alarm raised, usage, growth) -> decision
        let table: &[(u64, bool, u64, i64, Result<(), SpaceRefusal>)] = &[
            // Deletes and shrinking writes always pass, alarm or not, quota or not.
            (1000, true, 5000, -10, Ok(())),
            (1000, false, 5000, 0, Ok(())),
            (0, true, 0, -1, Ok(())),
            // The alarm refuses every growing write.
            (1000, true, 10, 1, Err(Alarm)),
            (0, true, 10, 1, Err(Alarm)),
            // No quota: everything passes.
            (0, false, u64::MAX - 1, 1_000_000, Ok(())),
            // Up to the quota exactly passes; one byte past is refused.
            (1000, false, 900, 100, Ok(())),
            (1000, false, 900, 101, Err(Quota)),
            (1000, false, 1000, 1, Err(Quota)),
            // Usage already over the quota (a quota lowered, a restore): growth refused.
            (1000, false, 2000, 1, Err(Quota)),
        ];
        for &(quota, alarm, usage, growth, expected) in table {
            assert_eq!(
                space_decision(space(quota, alarm), usage, growth),
                expected,
                "quota {quota}, alarm {alarm}, usage {usage}, growth {growth}"
            );
        }
    }

    #[test]
    fn the_alarm_clears_at_the_low_water_mark_and_a_raise_below_it_does_nothing() {
        let raised = space(1000, true);
        assert_eq!(raised.low_water_bytes(), 900);
        assert_eq!(
            raised.settle(901),
            raised,
            "above the low-water mark: still raised"
        );
        assert_eq!(raised.settle(900).alarm_index, None, "at the mark: cleared");
        assert_eq!(
            space(0, true).settle(u64::MAX).alarm_index,
            None,
            "no quota: cleared"
        );
        let clear = space(1000, false);
        assert_eq!(
            clear.act(CapacityAction::RaiseAlarm, 9, 950).alarm_index,
            Some(9)
        );
        assert_eq!(
            clear.act(CapacityAction::RaiseAlarm, 9, 800).alarm_index,
            None
        );
        assert_eq!(
            raised.act(CapacityAction::RaiseAlarm, 9, 950).alarm_index,
            Some(7),
            "a second raise keeps the first index"
        );
        assert_eq!(
            raised.act(CapacityAction::DisarmAlarm, 9, 5000).alarm_index,
            None
        );
        assert_eq!(clear.act(CapacityAction::SetQuota(5), 9, 0).quota_bytes, 5);
        // The mark does not overflow for the largest quota.
        assert!(space(u64::MAX, false).low_water_bytes() < u64::MAX);
    }

    #[test]
    fn quota_limit_keys_parse_or_say_what_is_wrong() {
        assert_eq!(QuotaLimit::parse("count"), Ok(QuotaLimit::Count));
        assert_eq!(QuotaLimit::parse("bytes"), Ok(QuotaLimit::Bytes));
        assert_eq!(
            QuotaLimit::parse("count/demo.v1.Thing"),
            Ok(QuotaLimit::TypeCount {
                group: "demo.v1".into(),
                kind: "Thing".into()
            })
        );
        assert_eq!(
            QuotaLimit::parse("bytes/demo.Thing"),
            Ok(QuotaLimit::TypeBytes {
                group: "demo".into(),
                kind: "Thing".into()
            })
        );
        for bad in [
            "",
            "counts",
            "count/",
            "count/Thing",
            "size/demo.Thing",
            "count/.Thing",
            "count/demo.*",
        ] {
            assert!(QuotaLimit::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn the_tenant_decision_table() {
        let quota = |limits: &[(&str, u64)]| {
            vec![(
                "q".to_string(),
                limits
                    .iter()
                    .map(|(k, v)| (QuotaLimit::parse(k).unwrap(), *v))
                    .collect::<Vec<_>>(),
            )]
        };
        let used = |count, bytes| Usage { count, bytes };
        let grow = |count, bytes| TenantGrowth { count, bytes };
        // (limits, tenancy usage, type usage, growth) -> accepted?
        let table: &[(&[(&str, u64)], Usage, Usage, TenantGrowth, bool)] = &[
            (&[("count", 3)], used(2, 0), used(2, 0), grow(1, 10), true),
            (&[("count", 3)], used(3, 0), used(3, 0), grow(1, 10), false),
            // An update (no new resource) passes a full count limit.
            (&[("count", 3)], used(3, 0), used(3, 0), grow(0, 10), true),
            (
                &[("bytes", 100)],
                used(1, 90),
                used(1, 90),
                grow(0, 10),
                true,
            ),
            (
                &[("bytes", 100)],
                used(1, 90),
                used(1, 90),
                grow(0, 11),
                false,
            ),
            // Shrinking and deleting always pass.
            (
                &[("bytes", 100)],
                used(1, 500),
                used(1, 500),
                grow(0, -1),
                true,
            ),
            (&[("count", 0)], used(9, 0), used(9, 0), grow(-1, -10), true),
            // A per-type limit counts its type only.
            (
                &[("count/demo.Thing", 1)],
                used(5, 0),
                used(1, 0),
                grow(1, 1),
                false,
            ),
            (
                &[("count/demo.Other", 1)],
                used(5, 0),
                used(1, 0),
                grow(1, 1),
                true,
            ),
            (
                &[("bytes/demo.Thing", 10)],
                used(5, 0),
                used(1, 5),
                grow(0, 6),
                false,
            ),
        ];
        for (limits, tenancy, type_, growth, accepted) in table {
            let decision =
                tenant_decision(&quota(limits), "demo", "Thing", *tenancy, *type_, *growth);
            assert_eq!(
                decision.is_ok(),
                *accepted,
                "{limits:?} {tenancy:?} {type_:?} {growth:?}"
            );
            if let Err(FsmError::ResourceExhausted { limit, .. }) = decision {
                assert!(
                    limit.starts_with("quota q "),
                    "the refusal names the quota: {limit}"
                );
            }
        }
    }
}
