//! The cluster version: which commands the cluster's log may carry, and which file formats
//! its members may write (`docs/upgrading.md`).
//!
//! Every member supports a range of cluster versions (this build:
//! [`ClusterVersion::SUPPORTED_MIN`] to [`ClusterVersion::SUPPORTED_MAX`]). The cluster
//! version is replicated state: it changes only through the log
//! ([`crate::Command::ClusterVersion`]), so every replica agrees on it at every index. The
//! leader raises it once every member supports the higher one; an operator lowers it with a
//! downgrade, which pins it there until cancelled. A command that needs a higher version
//! than the cluster's is refused with [`FsmError::FailedPrecondition`] before it is proposed
//! and again at apply ([`ClusterVersionState::require`], the one check).
//!
//! What is decided here is a pure function of the replicated state and the command
//! ([`ClusterVersionState::decide`]): never of this build's own range, which differs between
//! the members of a cluster being upgraded. The checks against this build's range are the
//! node's, before it proposes.

use std::fmt;

use crate::FsmError;

/// A cluster version, `major.minor` (a release's first two numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterVersion {
    pub major: u32,
    pub minor: u32,
}

impl ClusterVersion {
    pub const fn new(major: u32, minor: u32) -> ClusterVersion {
        ClusterVersion { major, minor }
    }

    /// The version of every cluster that never recorded one: what release 0.1.0 runs (it
    /// knows no cluster version). The lowest there is.
    pub const BASELINE: ClusterVersion = ClusterVersion::new(0, 1);
    /// The highest cluster version this build can run in: its release's `major.minor`.
    pub const SUPPORTED_MAX: ClusterVersion = ClusterVersion::new(0, 2);
    /// The lowest cluster version this build can run in: how far a cluster it belongs to
    /// may be downgraded.
    pub const SUPPORTED_MIN: ClusterVersion = ClusterVersion::BASELINE;

    /// Parses `major.minor` (`0.2`); the error says what is wrong.
    pub fn parse(text: &str) -> Result<ClusterVersion, String> {
        let bad =
            || format!("{text:?} is not a cluster version: expected MAJOR.MINOR, such as 0.2");
        let (major, minor) = text.trim().split_once('.').ok_or_else(bad)?;
        let number = |part: &str| {
            if part.is_empty() || part.len() > 9 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse::<u32>().map_err(|_| bad())
        };
        let version = ClusterVersion::new(number(major)?, number(minor)?);
        if version < ClusterVersion::BASELINE {
            return Err(format!(
                "{version} is below {}, the lowest cluster version there is",
                ClusterVersion::BASELINE
            ));
        }
        Ok(version)
    }

    /// A cluster version as a member's status reports it (`StatusResponse.cluster_version`):
    /// empty, from a member of release 0.1.0 (which knows none), is the baseline.
    pub fn reported(text: &str) -> Result<ClusterVersion, String> {
        if text.is_empty() {
            Ok(ClusterVersion::BASELINE)
        } else {
            ClusterVersion::parse(text)
        }
    }

    /// Whether this build can run in a cluster of this version.
    pub fn is_supported_here(self) -> bool {
        (ClusterVersion::SUPPORTED_MIN..=ClusterVersion::SUPPORTED_MAX).contains(&self)
    }
}

impl fmt::Display for ClusterVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A change of the cluster version ([`crate::Command::ClusterVersion`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionAction {
    /// The leader's, once every member supports the version.
    Raise,
    /// An operator's (`cairn cluster downgrade --to V`): lowers the version and pins it.
    Downgrade,
    /// An operator's (`cairn cluster downgrade --cancel`): removes the pin.
    CancelDowngrade,
}

/// What a command needs of the cluster version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `WriteStatus` ([`crate::Command::WriteStatus`]).
    StatusWrites,
    /// The space quota and its alarm ([`crate::Command::Capacity`]).
    Capacity,
    /// Leases, writes attached to a lease, and fenced writes ([`crate::lease`]).
    Leases,
    /// The store-set generation, finalizers and deletion marks, and the collection of
    /// what a removed owner owned ([`crate::lifecycle`]).
    Lifecycle,
    /// The `CORRUPT` alarm ([`crate::integrity`]).
    Integrity,
}

impl Feature {
    /// The lowest cluster version that enables it.
    pub fn since(self) -> ClusterVersion {
        match self {
            Feature::StatusWrites
            | Feature::Capacity
            | Feature::Leases
            | Feature::Lifecycle
            | Feature::Integrity => ClusterVersion::new(0, 2),
        }
    }

    /// Its name in messages: the request or command it is.
    pub fn name(self) -> &'static str {
        match self {
            Feature::StatusWrites => "WriteStatus",
            Feature::Capacity => "the space quota and its alarm",
            Feature::Leases => "leases and fenced writes",
            Feature::Lifecycle => "finalizers, orphaning deletes and owner collection",
            Feature::Integrity => "the CORRUPT alarm",
        }
    }
}

/// The cluster version as replicated: the version, and the downgrade target an operator
/// pinned, if any (the version is then at or below it, and never raised above it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterVersionState {
    pub version: ClusterVersion,
    pub downgrade: Option<ClusterVersion>,
}

impl Default for ClusterVersionState {
    /// A cluster that never recorded a version.
    fn default() -> Self {
        ClusterVersionState {
            version: ClusterVersion::BASELINE,
            downgrade: None,
        }
    }
}

impl fmt::Display for ClusterVersionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.downgrade {
            None => write!(f, "{}", self.version),
            Some(target) => write!(f, "{} (downgrade to {target} pinned)", self.version),
        }
    }
}

impl ClusterVersionState {
    /// Whether the cluster version enables `feature`: the one check, made before a command
    /// is proposed (on the node that receives it and on the leader) and again at apply.
    pub fn require(&self, feature: Feature) -> Result<(), FsmError> {
        if self.version >= feature.since() {
            return Ok(());
        }
        Err(FsmError::FailedPrecondition(format!(
            "{} needs cluster version {}; the cluster runs {}{}",
            feature.name(),
            feature.since(),
            self,
            match self.downgrade {
                Some(_) => ": cancel the downgrade (cairn cluster downgrade --cancel) to use it",
                None => {
                    ": the version rises by itself once every member runs a build that \
                     supports it (cairn status shows each member's)"
                }
            }
        )))
    }

    /// The state after `action` to `version` (ignored by `CancelDowngrade`), or why it is
    /// refused. Pure: the same on every replica.
    ///
    /// | action           | when                                   | outcome                      |
    /// |------------------|----------------------------------------|------------------------------|
    /// | Raise V          | V below the version                    | refused                      |
    /// | Raise V          | V is the version                       | unchanged (a repeated raise) |
    /// | Raise V          | V above the version                    | version V, no pin            |
    /// | Downgrade V      | V is the pinned target                 | unchanged (repeated)         |
    /// | Downgrade V      | V at or above the version              | refused                      |
    /// | Downgrade V      | V below the version                    | version V, pinned at V       |
    /// | CancelDowngrade  | pinned                                 | the pin removed              |
    /// | CancelDowngrade  | not pinned                             | unchanged (repeated)         |
    ///
    /// No version is below [`ClusterVersion::BASELINE`]: such a `V` is refused.
    ///
    /// The pin holds the leader back ([`ClusterVersionState::downgrade`]: it proposes no
    /// raise while pinned); it is not a rule of apply. A member that ran release 0.1.0
    /// during a downgrade to 0.1 writes snapshots without it (that release knows no
    /// cluster version), so replicas may disagree on the pin, never on the version: what
    /// every rule reads. A raise that reaches the log therefore applies, pinned or not.
    pub fn decide(
        &self,
        action: VersionAction,
        version: ClusterVersion,
    ) -> Result<ClusterVersionState, FsmError> {
        let refused = |why: String| Err(FsmError::FailedPrecondition(why));
        if action != VersionAction::CancelDowngrade && version < ClusterVersion::BASELINE {
            return Err(FsmError::invalid(
                "cluster_version",
                format!(
                    "{version} is below {}, the lowest cluster version there is",
                    ClusterVersion::BASELINE
                ),
            ));
        }
        match action {
            VersionAction::Raise if version < self.version => refused(format!(
                "the cluster version {} never goes down by a raise (to {version}): a \
                 downgrade does that",
                self.version
            )),
            VersionAction::Raise if version == self.version => Ok(*self),
            VersionAction::Raise => Ok(ClusterVersionState {
                version,
                downgrade: None,
            }),
            VersionAction::Downgrade if self.downgrade == Some(version) => Ok(*self),
            VersionAction::Downgrade if version >= self.version => refused(format!(
                "a downgrade goes below the cluster version {}; {version} is not below it",
                self.version
            )),
            VersionAction::Downgrade => Ok(ClusterVersionState {
                version,
                downgrade: Some(version),
            }),
            VersionAction::CancelDowngrade => Ok(ClusterVersionState {
                version: self.version,
                downgrade: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V01: ClusterVersion = ClusterVersion::new(0, 1);
    const V02: ClusterVersion = ClusterVersion::new(0, 2);
    const V03: ClusterVersion = ClusterVersion::new(0, 3);

    fn at(version: ClusterVersion, downgrade: Option<ClusterVersion>) -> ClusterVersionState {
        ClusterVersionState { version, downgrade }
    }

    #[test]
    fn every_change_of_the_cluster_version_as_the_table_says() {
        use VersionAction::*;
        // (state before, action, version, state after or None for refused)
        let table: [(
            ClusterVersionState,
            VersionAction,
            ClusterVersion,
            Option<ClusterVersionState>,
        ); 13] = [
            (at(V01, None), Raise, V02, Some(at(V02, None))),
            (at(V01, None), Raise, V03, Some(at(V03, None))),
            (at(V02, None), Raise, V02, Some(at(V02, None))),
            (at(V02, None), Raise, V01, None),
            (at(V01, Some(V01)), Raise, V02, Some(at(V02, None))),
            (at(V01, Some(V01)), Raise, V01, Some(at(V01, Some(V01)))),
            (at(V02, None), Downgrade, V01, Some(at(V01, Some(V01)))),
            (at(V01, Some(V01)), Downgrade, V01, Some(at(V01, Some(V01)))),
            (at(V02, None), Downgrade, V02, None),
            (at(V02, None), Downgrade, V03, None),
            (
                at(V01, Some(V01)),
                CancelDowngrade,
                V01,
                Some(at(V01, None)),
            ),
            (at(V02, None), CancelDowngrade, V01, Some(at(V02, None))),
            (at(V02, None), Raise, ClusterVersion::new(0, 0), None),
        ];
        for (before, action, version, after) in table {
            let got = before.decide(action, version);
            match after {
                Some(after) => assert_eq!(got, Ok(after), "{before} {action:?} {version}"),
                None => assert!(got.is_err(), "{before} {action:?} {version}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_refused_change_says_why_in_the_operators_words() {
        let pinned = at(V01, Some(V01))
            .require(Feature::StatusWrites)
            .unwrap_err();
        assert!(
            pinned
                .to_string()
                .contains("cairn cluster downgrade --cancel"),
            "{pinned}"
        );
        let not_below = at(V02, None)
            .decide(VersionAction::Downgrade, V02)
            .unwrap_err();
        assert!(not_below.to_string().contains("not below"), "{not_below}");
    }

    #[test]
    fn a_feature_is_refused_below_its_version_naming_both_versions() {
        let error = ClusterVersionState::default()
            .require(Feature::StatusWrites)
            .unwrap_err();
        assert!(
            matches!(error, FsmError::FailedPrecondition(_)),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains("WriteStatus needs cluster version 0.2; the cluster runs 0.1"),
            "{text}"
        );
        assert_eq!(at(V02, None).require(Feature::StatusWrites), Ok(()));
        assert_eq!(at(V03, None).require(Feature::StatusWrites), Ok(()));
        let pinned = at(V01, Some(V01))
            .require(Feature::StatusWrites)
            .unwrap_err();
        assert!(pinned.to_string().contains("--cancel"), "{pinned}");
    }

    #[test]
    fn versions_parse_and_print_as_major_dot_minor() {
        assert_eq!(ClusterVersion::parse("0.2"), Ok(V02));
        assert_eq!(
            ClusterVersion::parse(" 1.10 "),
            Ok(ClusterVersion::new(1, 10))
        );
        assert_eq!(V02.to_string(), "0.2");
        assert!(ClusterVersion::new(1, 0) > ClusterVersion::new(0, 10));
        for bad in [
            "",
            "1",
            "0.",
            ".1",
            "a.b",
            "0.1.2",
            "-1.0",
            "0.0",
            "99999999999.1",
        ] {
            let error = ClusterVersion::parse(bad).unwrap_err();
            assert!(!error.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn the_highest_supported_version_is_this_releases_major_minor() {
        // One number, said twice: Cargo.toml's release and SUPPORTED_MAX must agree.
        let release = env!("CARGO_PKG_VERSION");
        let major_minor = release
            .rsplit_once('.')
            .map(|(head, _)| head)
            .unwrap_or(release);
        assert_eq!(
            ClusterVersion::parse(major_minor),
            Ok(ClusterVersion::SUPPORTED_MAX),
            "release {release}"
        );
    }

    #[test]
    fn this_build_supports_the_baseline_and_its_own_version() {
        assert!(ClusterVersion::BASELINE.is_supported_here());
        assert!(ClusterVersion::SUPPORTED_MAX.is_supported_here());
        assert!(!ClusterVersion::new(0, 3).is_supported_here());
        assert!(ClusterVersion::SUPPORTED_MIN <= ClusterVersion::SUPPORTED_MAX);
        assert!(Feature::StatusWrites.since() <= ClusterVersion::SUPPORTED_MAX);
    }
}
