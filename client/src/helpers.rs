//! What the layer above always needs on top of the raw calls: create with a
//! generated uid, create-if-absent, read-modify-write with CAS retry, and
//! delete of whatever is current.

use cairn_proto::v1::{Consistency, DeleteRequest, DeleteResponse, Id, Resource};

use crate::error::{ClientError, Outcome};
use crate::Client;

impl Client {
    /// Creates `resource` (the expected version must be empty). An empty
    /// `id.uid` is replaced by a new ULID, as Consul's resource service does:
    /// the store never generates uids. Fails with CasFailure or WrongUid when
    /// something is stored at the key.
    pub async fn create(&self, mut resource: Resource) -> Result<Resource, ClientError> {
        prepare_create(&mut resource)?;
        self.write(resource).await
    }

    /// Creates `resource` unless something is stored at its key (whatever its
    /// uid or group version). Returns the stored resource and whether this
    /// call created it.
    ///
    /// When the create's outcome is unknown (deadline, dropped connection),
    /// the uid it carried settles it: a strong read finding that uid means
    /// the create applied. Otherwise the unknown error is returned as is.
    pub async fn create_if_absent(
        &self,
        mut resource: Resource,
    ) -> Result<(Resource, bool), ClientError> {
        prepare_create(&mut resource)?;
        let id = resource.id.clone().unwrap_or_default();
        let uid = id.uid.clone();
        let any_lifetime = Id {
            uid: String::new(),
            ..id
        };
        for _ in 0..self.options().cas_attempts_max {
            match self.write(resource.clone()).await {
                Ok(stored) => return Ok((stored, true)),
                Err(e) if e.is_cas_conflict() => {
                    match self.read_any_group_version(any_lifetime.clone()).await {
                        Ok(existing) => {
                            let created = existing.id.as_ref().is_some_and(|i| i.uid == uid);
                            return Ok((existing, created));
                        }
                        // Deleted between the write and the read: try again.
                        Err(ClientError::NotFound) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if e.outcome() == Outcome::Unknown => {
                    return match self.read_any_group_version(any_lifetime.clone()).await {
                        Ok(existing) if existing.id.as_ref().is_some_and(|i| i.uid == uid) => {
                            Ok((existing, true))
                        }
                        _ => Err(e),
                    };
                }
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::CasFailure(format!(
            "create_if_absent: still conflicting after {} attempts",
            self.options().cas_attempts_max
        )))
    }

    /// Reads the current resource (strongly), lets `modify` compute the next
    /// one, and writes it with the version and uid that were read. On a CAS
    /// conflict it starts over, up to `cas_attempts_max` times. `modify`
    /// returning `None` leaves the resource as it is (and returns it).
    ///
    /// `id.uid` empty = whatever lifetime is current; otherwise only that
    /// lifetime (NotFound once it is gone). The written resource's version is
    /// always the one read; an empty uid in it is filled from the one read.
    pub async fn read_modify_write<F>(&self, id: Id, mut modify: F) -> Result<Resource, ClientError>
    where
        F: FnMut(&Resource) -> Option<Resource>,
    {
        for _ in 0..self.options().cas_attempts_max {
            let current = self.read(id.clone(), Consistency::Strong).await?;
            let Some(mut next) = modify(&current) else {
                return Ok(current);
            };
            next.version = current.version.clone();
            let current_id = current.id.clone().unwrap_or_default();
            match next.id.as_mut() {
                Some(next_id) if next_id.uid.is_empty() => next_id.uid = current_id.uid,
                Some(_) => {}
                None => next.id = Some(current_id),
            }
            match self.write(next).await {
                Ok(stored) => return Ok(stored),
                Err(e) if e.is_cas_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::CasFailure(format!(
            "read_modify_write: still conflicting after {} attempts",
            self.options().cas_attempts_max
        )))
    }

    /// Deletes whatever lifetime is current at `id`'s key (or only the
    /// lifetime `id.uid` when given): reads it strongly for its uid and
    /// version, then deletes by CAS, starting over on a conflict. Returns the
    /// resource as it was when deleted, `None` when nothing was stored.
    pub async fn delete_current(&self, id: Id) -> Result<Option<Resource>, ClientError> {
        Ok(self
            .delete_current_request(id, false)
            .await?
            .map(|(r, _)| r))
    }

    /// As [`Client::delete_current`], keeping what the resource owns when `orphan`
    /// (`orphan_dependents`); also returns the answer, which says whether the resource
    /// was only marked for deletion (it has finalizers).
    pub async fn delete_current_request(
        &self,
        id: Id,
        orphan: bool,
    ) -> Result<Option<(Resource, DeleteResponse)>, ClientError> {
        for _ in 0..self.options().cas_attempts_max {
            let current = match self.read_any_group_version(id.clone()).await {
                Ok(current) => current,
                Err(ClientError::NotFound) => return Ok(None),
                Err(e) => return Err(e),
            };
            let request = DeleteRequest {
                id: current.id.clone(),
                version: current.version.clone(),
                fence: None,
                orphan_dependents: orphan,
            };
            match self.delete_request(request).await {
                Ok(answer) => return Ok(Some((current, answer))),
                Err(e) if e.is_cas_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::CasFailure(format!(
            "delete_current: still conflicting after {} attempts",
            self.options().cas_attempts_max
        )))
    }

    /// A strong read of the key, whatever group version is stored.
    async fn read_any_group_version(&self, id: Id) -> Result<Resource, ClientError> {
        match self.read(id, Consistency::Strong).await {
            Ok(r) => Ok(r),
            Err(ClientError::GroupVersionMismatch { stored, .. }) => Ok(*stored),
            Err(e) => Err(e),
        }
    }
}

/// A new ULID, as a uid.
pub fn new_uid() -> String {
    ulid::Ulid::new().to_string()
}

/// Checks a resource is a create (empty expected version) and gives it a
/// uid if it has none.
fn prepare_create(resource: &mut Resource) -> Result<(), ClientError> {
    if !resource.version.is_empty() {
        return Err(ClientError::invalid(
            "resource.version",
            "must be empty to create (it is the expected stored version)",
        ));
    }
    let Some(id) = resource.id.as_mut() else {
        return Err(ClientError::invalid("resource.id", "is required"));
    };
    if id.uid.is_empty() {
        id.uid = new_uid();
    }
    assert!(!id.uid.is_empty(), "a created resource has a uid");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_fills_an_empty_uid_with_a_ulid_and_keeps_a_given_one() {
        // A missing uid becomes a 26-character ULID; a given one is kept.
        let mut r = Resource {
            id: Some(Id {
                name: "n".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(prepare_create(&mut r), Ok(()));
        let uid = r.id.as_ref().map(|i| i.uid.clone()).unwrap_or_default();
        assert_eq!(uid.len(), 26);
        assert!(ulid::Ulid::from_string(&uid).is_ok());
        assert_eq!(prepare_create(&mut r), Ok(()));
        assert_eq!(r.id.as_ref().map(|i| i.uid.as_str()), Some(uid.as_str()));
    }

    #[test]
    fn create_rejects_an_expected_version_and_a_missing_id() {
        // A create is a write expecting nothing stored; an id is required.
        let mut r = Resource {
            id: Some(Id::default()),
            version: "3".into(),
            ..Default::default()
        };
        assert!(matches!(
            prepare_create(&mut r),
            Err(ClientError::InvalidArgument { .. })
        ));
        let mut r = Resource::default();
        assert!(matches!(
            prepare_create(&mut r),
            Err(ClientError::InvalidArgument { .. })
        ));
    }
}
