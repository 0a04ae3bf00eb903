//! A stored resource as the table keeps it: its protobuf encoding, made once
//! when the write is applied, and read without decoding.
//!
//! The version is set at apply (it is the entry's index), so apply is where
//! the final bytes are known. They are encoded then, once, and from then on
//! the same bytes (cheap `Bytes` clones) serve every answer: reads, lists,
//! ListByOwner, watch events, snapshots, the writer's own reply. The decoded
//! resource is not kept: one full copy per resource, not two.
//!
//! What the store and the node need to know of a stored resource without
//! decoding it (its uid, version, type and tenancy) is read from the bytes by
//! [`ResourceHead::parse`], a scan that allocates nothing. The same scan
//! serves encodings that arrive from the leader (a forwarded strong list), so
//! it trusts nothing: it is bounded by its input and answers malformed bytes
//! with an error, never a panic.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use cairn_proto::v1::{Resource, Tenancy, Type};
use prost::Message;

use crate::key::{self, Key};
use crate::FsmError;

/// A resource as stored: its canonical protobuf encoding (prost's, with
/// sorted maps), the bytes every answer sends. Cloning is one reference
/// count; two stored resources are equal when their bytes are.
///
/// Invariant: the bytes decode to exactly the resource that was stored, and
/// encoding that resource gives the bytes back (checked when it is made, in
/// debug builds; the head is checked against the storage key always).
#[derive(Clone)]
pub struct StoredResource(Arc<Inner>);

struct Inner {
    encoded: Bytes,
    /// The owner-index entry (owner prefix ++ storage key) of an owned
    /// resource: the very key the owner index holds it under.
    owner_entry: Option<Key>,
    /// The lease it is attached to (0: none).
    lease: u64,
    /// Its lifecycle metadata ([`crate::lifecycle`]), read once when it is stored.
    lifecycle: LifecycleFlags,
}

/// What [`crate::lifecycle`] needs to know of a stored resource without decoding it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LifecycleFlags {
    /// It holds at least one finalizer.
    pub finalizers: bool,
    /// It is marked for deletion.
    pub marked: bool,
    /// It is marked and holds [`crate::lifecycle::ORPHAN_FINALIZER`].
    pub orphaning: bool,
}

impl StoredResource {
    /// Encodes `resource`, stored at the storage key `key`.
    pub(crate) fn new(resource: &Resource, key: &str) -> StoredResource {
        let mut buf = Vec::with_capacity(resource.encoded_len());
        let encoded = resource.encode(&mut buf);
        assert!(encoded.is_ok(), "encoding into a Vec cannot fail");
        let stored = StoredResource(Arc::new(Inner {
            encoded: Bytes::from(buf),
            owner_entry: resource
                .owner
                .as_ref()
                .map(|owner| Key::from(key::owner_entry(owner, key))),
            lease: resource.lease,
            lifecycle: LifecycleFlags {
                finalizers: crate::lifecycle::has_finalizers(&resource.metadata),
                marked: crate::lifecycle::is_marked(&resource.metadata),
                orphaning: crate::lifecycle::is_marked(&resource.metadata)
                    && crate::lifecycle::finalizers(&resource.metadata)
                        .contains(&crate::lifecycle::ORPHAN_FINALIZER),
            },
        }));
        debug_assert!(
            Resource::decode(stored.encoded().as_ref()).as_ref() == Ok(resource),
            "a stored resource's bytes decode to the resource"
        );
        debug_assert!(
            {
                let head = stored.head();
                let [group, kind, partition, namespace, name] = key::fields(key);
                head.group() == group
                    && head.kind() == kind
                    && head.partition() == partition
                    && head.namespace() == namespace
                    && head.name == name
                    && head.uid == stored.uid()
                    && head.group_version() == stored.group_version()
                    && head.version == stored.version()
            },
            "a stored resource's bytes name its storage key"
        );
        stored
    }

    /// Stores `resource` as the table would (its storage key from its id).
    /// For resources that come back from elsewhere (a reply read back) and
    /// for tests; the table makes its own when it applies a write.
    pub fn from_resource(resource: &Resource) -> StoredResource {
        let id = resource.id.clone().unwrap_or_default();
        StoredResource::new(resource, &key::storage_key(&id))
    }

    /// The resource's protobuf encoding (`cairn.v1.Resource`), shared.
    pub fn encoded(&self) -> &Bytes {
        &self.0.encoded
    }

    /// Decodes the resource (a copy). Only for answers that need the
    /// message itself (an error detail, a test); every ordinary answer sends
    /// [`StoredResource::encoded`].
    pub fn resource(&self) -> Resource {
        match Resource::decode(self.encoded().as_ref()) {
            Ok(resource) => resource,
            Err(e) => unreachable!("a stored resource's bytes decode: {e}"),
        }
    }

    /// The id, version, type and tenancy, read from the bytes.
    pub fn head(&self) -> ResourceHead<'_> {
        match ResourceHead::parse(self.encoded()) {
            Ok(head) => head,
            Err(e) => unreachable!("a stored resource's bytes scan: {e}"),
        }
    }

    /// The version the store assigned (the decimal index of its entry).
    pub fn version(&self) -> &str {
        self.field(&[RESOURCE_VERSION])
    }

    /// `id.uid`.
    pub fn uid(&self) -> &str {
        self.field(&[RESOURCE_ID, ID_UID])
    }

    /// `id.type.group_version`.
    pub fn group_version(&self) -> &str {
        self.field(&[RESOURCE_ID, ID_TYPE, TYPE_GROUP_VERSION])
    }

    /// The string at `path` (field numbers, outermost first), "" when absent.
    /// A quick walk that relies on the bytes being prost's own encoding
    /// (fields in ascending order, each at most once), which a stored
    /// resource's are; [`ResourceHead::parse`] is the strict reader for bytes
    /// from elsewhere.
    fn field(&self, path: &[u32]) -> &str {
        let mut message: &[u8] = self.encoded();
        'path: for (depth, number) in path.iter().enumerate() {
            for field in Fields(message) {
                let Ok((n, value)) = field else {
                    unreachable!("a stored resource's bytes scan")
                };
                if n < *number {
                    continue;
                }
                if n > *number {
                    break;
                }
                let Value::LengthDelimited(bytes) = value else {
                    unreachable!("a stored resource's field {n} is length-delimited")
                };
                if depth + 1 == path.len() {
                    return match std::str::from_utf8(bytes) {
                        Ok(text) => text,
                        Err(_) => unreachable!("a stored resource's strings are UTF-8"),
                    };
                }
                message = bytes;
                continue 'path;
            }
            return "";
        }
        ""
    }

    /// What this resource counts for in the table's usage, stored under a key of
    /// `key_len` bytes ([`crate::capacity::accounted_bytes`]).
    pub fn accounted_bytes(&self, key_len: usize) -> u64 {
        crate::capacity::accounted_bytes(
            self.0.encoded.len(),
            key_len,
            self.0.owner_entry.as_ref().map(|e| e.len()),
        )
    }

    /// The lease it is attached to (0: none).
    pub fn lease(&self) -> u64 {
        self.0.lease
    }

    /// Its lifecycle metadata ([`crate::lifecycle`]).
    pub(crate) fn lifecycle(&self) -> LifecycleFlags {
        self.0.lifecycle
    }

    pub(crate) fn owner_entry(&self) -> Option<&Key> {
        self.0.owner_entry.as_ref()
    }

    /// Whether both are the same allocation (not only equal bytes).
    pub(crate) fn ptr_eq(a: &StoredResource, b: &StoredResource) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl PartialEq for StoredResource {
    fn eq(&self, other: &StoredResource) -> bool {
        self.encoded() == other.encoded()
    }
}

impl fmt::Debug for StoredResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoredResource")
            .field(&self.resource())
            .finish()
    }
}

// Field numbers of cairn.v1.Resource, ID and Type that are read here.
const RESOURCE_ID: u32 = 1;
const RESOURCE_VERSION: u32 = 3;
const ID_UID: u32 = 1;
const ID_TYPE: u32 = 3;
const TYPE_GROUP_VERSION: u32 = 2;

/// What a resource's encoding says of its identity, borrowed from the bytes:
/// the fields of its id (an absent id reads as empty fields and no type or
/// tenancy) and its version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceHead<'a> {
    pub uid: &'a str,
    pub name: &'a str,
    /// `id.type`, if present.
    pub type_: Option<TypeHead<'a>>,
    /// `id.tenancy`, if present.
    pub tenancy: Option<TenancyHead<'a>>,
    pub version: &'a str,
}

/// `cairn.v1.Type`, borrowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeHead<'a> {
    pub group: &'a str,
    pub group_version: &'a str,
    pub kind: &'a str,
}

impl<'a> From<&'a Type> for TypeHead<'a> {
    fn from(t: &'a Type) -> TypeHead<'a> {
        TypeHead {
            group: &t.group,
            group_version: &t.group_version,
            kind: &t.kind,
        }
    }
}

/// `cairn.v1.Tenancy`, borrowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenancyHead<'a> {
    pub partition: &'a str,
    pub namespace: &'a str,
}

impl<'a> From<&'a Tenancy> for TenancyHead<'a> {
    fn from(t: &'a Tenancy) -> TenancyHead<'a> {
        TenancyHead {
            partition: &t.partition,
            namespace: &t.namespace,
        }
    }
}

impl<'a> ResourceHead<'a> {
    /// Reads the head of an encoded `cairn.v1.Resource`. Strict where prost
    /// is lenient, so that the head never disagrees with what a client
    /// decodes: a field of the id or the version that appears twice (prost
    /// would merge or keep the last) is an error, as are a known field with
    /// the wrong wire type, a truncated field, invalid UTF-8 and groups.
    /// Unknown fields are skipped, as prost skips them.
    pub fn parse(encoded: &'a [u8]) -> Result<ResourceHead<'a>, FsmError> {
        let mut head = ResourceHead::default();
        let mut seen = Seen::default();
        for field in Fields(encoded) {
            match field? {
                (1, value) => {
                    seen.once(1, "id")?;
                    parse_id(value.message("id")?, &mut head)?;
                }
                (3, value) => {
                    seen.once(3, "version")?;
                    head.version = value.text("version")?;
                }
                _ => {}
            }
        }
        Ok(head)
    }

    /// `id.type.group` ("" when absent), and so on for the accessors below.
    pub fn group(&self) -> &'a str {
        self.type_.map(|t| t.group).unwrap_or("")
    }

    pub fn group_version(&self) -> &'a str {
        self.type_.map(|t| t.group_version).unwrap_or("")
    }

    pub fn kind(&self) -> &'a str {
        self.type_.map(|t| t.kind).unwrap_or("")
    }

    pub fn partition(&self) -> &'a str {
        self.tenancy.map(|t| t.partition).unwrap_or("")
    }

    pub fn namespace(&self) -> &'a str {
        self.tenancy.map(|t| t.namespace).unwrap_or("")
    }
}

fn parse_id<'a>(encoded: &'a [u8], head: &mut ResourceHead<'a>) -> Result<(), FsmError> {
    let mut seen = Seen::default();
    for field in Fields(encoded) {
        match field? {
            (1, value) => {
                seen.once(1, "id.uid")?;
                head.uid = value.text("id.uid")?;
            }
            (2, value) => {
                seen.once(2, "id.name")?;
                head.name = value.text("id.name")?;
            }
            (3, value) => {
                seen.once(3, "id.type")?;
                let [group, group_version, kind] = strings(
                    value.message("id.type")?,
                    ["id.type.group", "id.type.group_version", "id.type.kind"],
                )?;
                head.type_ = Some(TypeHead {
                    group,
                    group_version,
                    kind,
                });
            }
            (4, value) => {
                seen.once(4, "id.tenancy")?;
                let [partition, namespace] = strings(
                    value.message("id.tenancy")?,
                    ["id.tenancy.partition", "id.tenancy.namespace"],
                )?;
                head.tenancy = Some(TenancyHead {
                    partition,
                    namespace,
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// A message whose fields 1..=N are strings named `names` (others skipped).
fn strings<'a, const N: usize>(
    encoded: &'a [u8],
    names: [&'static str; N],
) -> Result<[&'a str; N], FsmError> {
    let mut values = [""; N];
    let mut seen = Seen::default();
    for field in Fields(encoded) {
        let (number, value) = field?;
        let Some(slot) = (number as usize).checked_sub(1).filter(|i| *i < N) else {
            continue;
        };
        seen.once(number, names[slot])?;
        values[slot] = value.text(names[slot])?;
    }
    Ok(values)
}

fn malformed(what: impl fmt::Display) -> FsmError {
    FsmError::Decode(format!("resource: {what}"))
}

/// The known fields (numbers 1 to 31) of one message seen so far.
#[derive(Default)]
struct Seen(u32);

impl Seen {
    fn once(&mut self, number: u32, field: &str) -> Result<(), FsmError> {
        assert!(
            (1..32).contains(&number),
            "known fields are numbered 1 to 31"
        );
        let bit = 1 << number;
        if self.0 & bit != 0 {
            return Err(malformed(format_args!("{field} appears twice")));
        }
        self.0 |= bit;
        Ok(())
    }
}

/// One field's value, as its wire type carries it.
enum Value<'a> {
    Varint,
    Fixed,
    LengthDelimited(&'a [u8]),
}

impl<'a> Value<'a> {
    fn message(self, field: &str) -> Result<&'a [u8], FsmError> {
        match self {
            Value::LengthDelimited(bytes) => Ok(bytes),
            _ => Err(malformed(format_args!("{field} has the wrong wire type"))),
        }
    }

    fn text(self, field: &str) -> Result<&'a str, FsmError> {
        std::str::from_utf8(self.message(field)?)
            .map_err(|_| malformed(format_args!("{field} is not UTF-8")))
    }
}

/// The fields of an encoded message, in order: (number, value).
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), FsmError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let result = self.field();
        if result.is_err() {
            // One error ends the message.
            self.0 = &[];
        }
        Some(result)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u32, Value<'a>), FsmError> {
        let buf = &mut self.0;
        let key = varint(buf).ok_or_else(|| malformed("a truncated field key"))?;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|n| (1..=MAX_FIELD_NUMBER).contains(n))
            .ok_or_else(|| malformed(format_args!("field number {} is out of range", key >> 3)))?;
        let value = match key & 7 {
            0 => {
                varint(buf).ok_or_else(|| malformed("a truncated varint"))?;
                Value::Varint
            }
            1 => {
                *buf = buf
                    .get(8..)
                    .ok_or_else(|| malformed("a truncated fixed64"))?;
                Value::Fixed
            }
            5 => {
                *buf = buf
                    .get(4..)
                    .ok_or_else(|| malformed("a truncated fixed32"))?;
                Value::Fixed
            }
            2 => {
                let len = varint(buf).ok_or_else(|| malformed("a truncated length"))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|len| *len <= buf.len())
                    .ok_or_else(|| malformed("a length runs past the end"))?;
                let (value, rest) = buf.split_at(len);
                *buf = rest;
                Value::LengthDelimited(value)
            }
            3 | 4 => return Err(malformed("groups are not used")),
            other => return Err(malformed(format_args!("wire type {other} is unknown"))),
        };
        Ok((number, value))
    }
}

/// The largest field number protobuf allows.
const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

/// Reads a base-128 varint of at most 10 bytes; `None` if truncated or longer.
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *buf = &buf[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::google::protobuf::Any;
    use cairn_proto::v1::Id;

    fn id(name: &str) -> Id {
        Id {
            uid: "u1".into(),
            name: name.into(),
            r#type: Some(Type {
                group: "catalog".into(),
                group_version: "v2".into(),
                kind: "Service".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "prod".into(),
            }),
        }
    }

    fn resource() -> Resource {
        Resource {
            id: Some(id("web")),
            owner: Some(Box::new(id("owner"))),
            version: "42".into(),
            data: Some(Any {
                type_url: "t".into(),
                value: Bytes::from_static(&[1, 2, 3]),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_head_is_read_from_the_bytes() {
        // Every field of the id and the version; the owner's id is not the id.
        let stored = StoredResource::from_resource(&resource());
        assert_eq!(
            stored.head(),
            ResourceHead {
                uid: "u1",
                name: "web",
                type_: Some(TypeHead {
                    group: "catalog",
                    group_version: "v2",
                    kind: "Service",
                }),
                tenancy: Some(TenancyHead {
                    partition: "default",
                    namespace: "prod",
                }),
                version: "42",
            }
        );
        assert_eq!(stored.resource(), resource());
        assert_eq!(stored.encoded().as_ref(), resource().encode_to_vec());
    }

    #[test]
    fn an_absent_id_type_or_tenancy_reads_as_absent() {
        let head = ResourceHead::parse(&[]).expect("an empty message is a resource");
        assert_eq!(head, ResourceHead::default());
        let mut r = resource();
        if let Some(id) = r.id.as_mut() {
            id.r#type = None;
            id.tenancy = None;
        }
        let bytes = r.encode_to_vec();
        let head = ResourceHead::parse(&bytes).expect("parses");
        assert_eq!((head.type_, head.tenancy, head.name), (None, None, "web"));
    }

    #[test]
    fn a_duplicated_id_field_is_refused() {
        // prost merges two ids; the head refuses rather than guess.
        let mut bytes = resource().encode_to_vec();
        let extra = Resource {
            id: Some(id("other")),
            ..Default::default()
        };
        bytes.extend(extra.encode_to_vec());
        assert!(Resource::decode(bytes.as_slice()).is_ok());
        assert!(matches!(
            ResourceHead::parse(&bytes),
            Err(FsmError::Decode(_))
        ));
    }

    #[test]
    fn malformed_bytes_are_errors_never_panics() {
        // Every truncation and every single-byte change of a valid encoding.
        let bytes = resource().encode_to_vec();
        for cut in 0..bytes.len() {
            let _ = ResourceHead::parse(&bytes[..cut]);
        }
        for at in 0..bytes.len() {
            for value in [0x00, 0x07, 0x0b, 0x80, 0xff] {
                let mut changed = bytes.clone();
                changed[at] = value;
                let _ = ResourceHead::parse(&changed);
            }
        }
        // A group, a length past the end, invalid UTF-8 in the name.
        assert!(ResourceHead::parse(&[0x0b]).is_err());
        assert!(ResourceHead::parse(&[0x0a, 0x05, 0x00]).is_err());
        assert!(ResourceHead::parse(&[0x0a, 0x03, 0x12, 0x01, 0xff]).is_err());
    }
}
