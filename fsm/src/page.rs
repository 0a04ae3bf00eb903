//! Paginated lists: the page scan ([`View::list_page`]) and the page token
//! ([`PageToken`]) that carries a listing from one page to the next.
//!
//! A *listing* is the sequence of pages answering one List filter (type,
//! tenancy, name prefix; [`ListFilter`]) at one revision, the revision of its
//! first page. Pages follow storage-key order: each later page is read from
//! the view at that revision ([`crate::Store::view_at`], the MVCC history
//! that also serves `ListRequest.revision`), starting just after the last
//! storage key the previous page served. So writes, deletes and
//! re-creations between pages never change what a listing shows, and no
//! resource is served twice or skipped; once the history no longer reaches
//! that revision, the next page is `Compacted` and the listing must start
//! again.
//!
//! A page holds at most [`PageBounds::resources_max`] resources (the node's
//! `list_page_size_max`, or the request's smaller `limit`) and ends before
//! its encoded resources would pass [`PageBounds::bytes_max`] (by default
//! [`LIST_PAGE_BYTES_MAX`], under a client's 4 MiB message limit), but
//! always holds at least one resource when any is left. Only what the
//! caller may see (`visible`) is counted. A page ends the listing (no next
//! token) exactly when no further resource matches: the scan looks one
//! resource ahead.
//!
//! ## The token
//!
//! Opaque to users: URL-safe base64 without padding of a small versioned
//! binary record,
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | format, [`PAGE_TOKEN_FORMAT_VERSION`] |
//! | 8 | the listing's revision, big-endian, never 0 |
//! | 8 | fingerprint of the listing's filter (FNV-1a 64 of group, kind, partition, namespace and name prefix), big-endian |
//! | rest | the storage key of the last resource served (five UTF-8 fields joined by NUL) |
//!
//! It comes from outside, so nothing in it is trusted: its length is bounded
//! ([`PAGE_TOKEN_CHARS_MAX`]) before it is decoded, the decoder is bounded by
//! its input and never panics, and every malformed form, a token of another
//! listing (another filter's fingerprint, or a last key the filter does not
//! match) included, is `InvalidArgument` on field `page_token`. The token
//! is not authenticated, and needs not be: its key only says where the scan
//! of the *request's* filter resumes, and its revision is one a request may
//! ask for anyway, so a forged token shows nothing the request could not.

use std::ops::Bound;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use cairn_proto::v1::{Tenancy, Type};

use crate::key::{self, Key};
use crate::state::View;
use crate::validate::{Limits, NAME_BYTES_HARD_MAX};
use crate::{FsmError, ReadScope, Selector, StoredResource};

/// The byte budget of one page's encoded resources: a little under the 4 MiB
/// a gRPC client decodes by default, leaving room for the rest of the answer
/// (its revision and next token).
pub const LIST_PAGE_BYTES_MAX: usize = 3 * 1024 * 1024;

/// The format byte that opens every token this version issues.
pub const PAGE_TOKEN_FORMAT_VERSION: u8 = 1;

/// Format, revision and filter fingerprint.
const TOKEN_HEADER_BYTES: usize = 1 + 8 + 8;

/// The longest storage key: five fields of at most the hard name bound,
/// joined by four separators (a node configured with a smaller
/// `name_bytes_max` may still hold longer keys written before).
const KEY_BYTES_MAX: usize = 5 * NAME_BYTES_HARD_MAX + 4;

/// The longest token a node accepts, in characters: the base64 of the
/// largest record. Anything longer is refused before it is decoded.
pub const PAGE_TOKEN_CHARS_MAX: usize = (TOKEN_HEADER_BYTES + KEY_BYTES_MAX).div_ceil(3) * 4;

/// The filter of a listing: what every page of it answers.
#[derive(Debug, Clone, Copy)]
pub struct ListFilter<'a> {
    /// Only group and kind are used.
    pub type_: &'a Type,
    pub tenancy: &'a Tenancy,
    pub name_prefix: &'a str,
    /// Only resources whose metadata matches (None: all).
    pub selector: Option<&'a Selector>,
}

impl ListFilter<'_> {
    /// Whether `resource` passes the selector (decodes it only when there is one).
    pub(crate) fn selects(&self, resource: &StoredResource) -> bool {
        self.selector.is_none_or(|s| s.selects(resource))
    }

    /// FNV-1a 64 of the filter's fields, each closed by 0xFF (a byte UTF-8
    /// never holds, so no two filters share a byte string). Fixed forever:
    /// a token issued by one node is checked by another.
    fn fingerprint(&self) -> u64 {
        const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let fields = [
            self.type_.group.as_str(),
            self.type_.kind.as_str(),
            self.tenancy.partition.as_str(),
            self.tenancy.namespace.as_str(),
            self.name_prefix,
        ];
        // A selector is one more field, only when there is one: a listing without it keeps
        // the fingerprint it had before selectors (its tokens cross an upgrade).
        let selector = self
            .selector
            .filter(|s| !s.is_empty())
            .map(|s| s.to_string());
        let mut hash = OFFSET_BASIS;
        for field in fields.into_iter().chain(selector.as_deref()) {
            for byte in field.bytes().chain([0xff]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(PRIME);
            }
        }
        hash
    }
}

/// How large one page may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageBounds {
    /// Most resources in the page (at least 1).
    pub resources_max: usize,
    /// Most bytes of encoded resources (as the answer's repeated field
    /// carries them), except that a page always holds one resource.
    pub bytes_max: usize,
}

impl PageBounds {
    /// No bound: the whole listing in one page ([`View::list`]).
    pub const UNBOUNDED: PageBounds = PageBounds {
        resources_max: usize::MAX,
        bytes_max: usize::MAX,
    };

    /// The bounds of a page a request asked for with `limit`: 0 means the
    /// node's `list_page_size_max`, and a larger limit is capped to it (not
    /// refused); the byte budget is [`LIST_PAGE_BYTES_MAX`].
    pub fn for_request(limit: u32, limits: &Limits) -> PageBounds {
        let page_size_max = limits.list_page_size_max.max(1);
        let resources_max = match usize::try_from(limit) {
            Ok(0) | Err(_) => page_size_max,
            Ok(limit) => limit.min(page_size_max),
        };
        PageBounds {
            resources_max,
            bytes_max: LIST_PAGE_BYTES_MAX,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct Page {
    /// In storage-key order.
    pub resources: Vec<StoredResource>,
    /// Where the next page starts; `None`: this page ends the listing.
    pub next: Option<PageToken>,
}

/// Where a listing resumes: its revision, its filter's fingerprint and the
/// last storage key served. See the module docs for its encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageToken {
    revision: u64,
    filter_fingerprint: u64,
    last_key: Key,
}

impl PageToken {
    /// The revision of the listing: every page of it reads this one.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The token as a client carries it (URL-safe base64, no padding).
    pub fn encode(&self) -> String {
        let mut record = Vec::with_capacity(TOKEN_HEADER_BYTES + self.last_key.len());
        record.push(PAGE_TOKEN_FORMAT_VERSION);
        record.extend_from_slice(&self.revision.to_be_bytes());
        record.extend_from_slice(&self.filter_fingerprint.to_be_bytes());
        record.extend_from_slice(self.last_key.as_bytes());
        let text = URL_SAFE_NO_PAD.encode(&record);
        assert!(
            text.len() <= PAGE_TOKEN_CHARS_MAX,
            "a token of a stored key fits the bound its decoder enforces"
        );
        text
    }

    /// Reads the token a client sent with a list of `filter`. Every way it
    /// can be wrong is `InvalidArgument` on field `page_token`, saying what
    /// is wrong; none panics.
    pub fn decode(text: &str, filter: &ListFilter<'_>) -> Result<PageToken, FsmError> {
        let invalid = |reason: String| FsmError::invalid("page_token", reason);
        if text.len() > PAGE_TOKEN_CHARS_MAX {
            return Err(invalid(format!(
                "is {} characters, more than any token ({PAGE_TOKEN_CHARS_MAX})",
                text.len()
            )));
        }
        let record = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|e| invalid(format!("is not a page token (not URL-safe base64: {e})")))?;
        if record.len() <= TOKEN_HEADER_BYTES {
            return Err(invalid(format!(
                "is not a page token (a record of {} bytes, too short)",
                record.len()
            )));
        }
        let (header, key_bytes) = record.split_at(TOKEN_HEADER_BYTES);
        let format = header[0];
        if format != PAGE_TOKEN_FORMAT_VERSION {
            return Err(invalid(format!(
                "has format {format}, this node reads format {PAGE_TOKEN_FORMAT_VERSION}"
            )));
        }
        let revision = u64::from_be_bytes(be_bytes(&header[1..9]));
        let filter_fingerprint = u64::from_be_bytes(be_bytes(&header[9..17]));
        if revision == 0 {
            return Err(invalid("names revision 0, which no listing has".into()));
        }
        if filter_fingerprint != filter.fingerprint() {
            return Err(invalid(
                "belongs to another listing: its type, tenancy, name prefix or selector differ \
                 from this request's"
                    .into(),
            ));
        }
        let last_key = std::str::from_utf8(key_bytes)
            .map_err(|_| invalid("is not a page token (its key is not UTF-8)".into()))?;
        check_storage_key(last_key).map_err(|reason| invalid(format!("is damaged: {reason}")))?;
        let matcher = key::Matcher::new(filter.type_, filter.tenancy, filter.name_prefix);
        if !matcher.matches_key(last_key) {
            return Err(invalid(
                "belongs to another listing: its last resource does not match this request's \
                 filter"
                    .into(),
            ));
        }
        Ok(PageToken {
            revision,
            filter_fingerprint,
            last_key: Key::from(last_key),
        })
    }
}

/// Eight bytes of a slice the caller cut to eight.
fn be_bytes(slice: &[u8]) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(slice);
    bytes
}

/// Whether `key` has the form of a storage key: five fields joined by NUL,
/// none holding another control character, group, kind and name not empty,
/// within the length any stored key has.
fn check_storage_key(key: &str) -> Result<(), String> {
    if key.len() > KEY_BYTES_MAX {
        return Err(format!(
            "a key of {} bytes, longer than any stored key",
            key.len()
        ));
    }
    let fields: Vec<&str> = key.split(key::SEPARATOR).collect();
    let [group, kind, _partition, _namespace, name] = fields.as_slice() else {
        return Err(format!("a key of {} fields, not 5", fields.len()));
    };
    if fields.iter().any(|f| f.chars().any(char::is_control)) {
        return Err("a key field holds a control character".into());
    }
    if group.is_empty() || kind.is_empty() || name.is_empty() {
        return Err("a key with an empty group, kind or name".into());
    }
    Ok(())
}

/// The bytes a resource of `len` encoded bytes takes in the answer's
/// `repeated bytes resources = 1`: a one-byte tag, the length, the bytes.
fn answer_field_bytes(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

impl View {
    /// One page of the listing of `filter` at this view's revision: the
    /// first page (`after = None`) or the one after the page that issued
    /// `after`, whose revision must be this view's (read it from
    /// [`crate::Store::view_at`]). Only what `visible` shows (`None`:
    /// everything) is served and counted. See the module docs for the rules.
    pub fn list_page(
        &self,
        filter: &ListFilter<'_>,
        visible: Option<&ReadScope>,
        after: Option<&PageToken>,
        bounds: PageBounds,
    ) -> Page {
        assert!(
            bounds.resources_max > 0,
            "a page holds at least one resource"
        );
        let fingerprint = filter.fingerprint();
        if let Some(after) = after {
            assert_eq!(
                after.revision,
                self.revision(),
                "a listing's later pages are read at its first page's revision"
            );
            assert_eq!(
                after.filter_fingerprint, fingerprint,
                "a token is used only with the filter it was decoded for"
            );
        }
        let matcher = key::Matcher::new(filter.type_, filter.tenancy, filter.name_prefix);
        let prefix = matcher.scan_prefix();
        let start = match after {
            Some(token) if &*token.last_key >= prefix => Bound::Excluded(&*token.last_key),
            _ => Bound::Included(prefix),
        };
        let candidates = self
            .state
            .resources
            .range::<_, str>((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| matcher.matches_key(k))
            .filter(|(_, r)| visible.is_none_or(|v| v.shows_resource(r)))
            .filter(|(_, r)| filter.selects(r));
        let mut resources: Vec<StoredResource> = Vec::new();
        let mut bytes = 0usize;
        let mut last_key: Option<&Key> = None;
        for (key, resource) in candidates {
            let cost = answer_field_bytes(resource.encoded().len());
            let full = resources.len() >= bounds.resources_max
                || (!resources.is_empty() && bytes.saturating_add(cost) > bounds.bytes_max);
            if full {
                let Some(last_key) = last_key else {
                    unreachable!("a full page holds a resource")
                };
                assert!(**key > **last_key, "a page ends before a later key");
                return Page {
                    resources,
                    next: Some(PageToken {
                        revision: self.revision(),
                        filter_fingerprint: fingerprint,
                        last_key: last_key.clone(),
                    }),
                };
            }
            bytes += cost;
            resources.push(resource.clone());
            last_key = Some(key);
        }
        assert!(resources.len() <= bounds.resources_max);
        Page {
            resources,
            next: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn type_(group: &str, kind: &str) -> Type {
        Type {
            group: group.into(),
            group_version: String::new(),
            kind: kind.into(),
        }
    }

    fn tenancy(partition: &str, namespace: &str) -> Tenancy {
        Tenancy {
            partition: partition.into(),
            namespace: namespace.into(),
        }
    }

    fn token(revision: u64, filter: &ListFilter<'_>, last_key: &str) -> PageToken {
        PageToken {
            revision,
            filter_fingerprint: filter.fingerprint(),
            last_key: Key::from(last_key),
        }
    }

    /// A record as `encode` writes it, with every field chosen.
    fn record(format: u8, revision: u64, fingerprint: u64, key: &[u8]) -> String {
        let mut r = vec![format];
        r.extend_from_slice(&revision.to_be_bytes());
        r.extend_from_slice(&fingerprint.to_be_bytes());
        r.extend_from_slice(key);
        URL_SAFE_NO_PAD.encode(r)
    }

    fn field_and_reason(result: Result<PageToken, FsmError>) -> (String, String) {
        match result {
            Err(FsmError::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_token_round_trips_and_stays_opaque_and_url_safe() {
        // encode then decode gives the same token back; the text needs no escaping in a URL.
        let (t, ten) = (type_("g", "K"), tenancy("p", "*"));
        let filter = ListFilter {
            type_: &t,
            tenancy: &ten,
            name_prefix: "na",
            selector: None,
        };
        let original = token(42, &filter, "g\0K\0p\0ns\0name");
        let text = original.encode();
        assert!(text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(PageToken::decode(&text, &filter), Ok(original));
        // The longest stored key still fits the bound.
        let long = "n".repeat(NAME_BYTES_HARD_MAX);
        let key = [long.as_str(); 5].join("\0");
        let everything = tenancy("*", "*");
        let (t, prefix) = (type_(&long, &long), "");
        let filter = ListFilter {
            type_: &t,
            tenancy: &everything,
            name_prefix: prefix,
            selector: None,
        };
        let text = token(u64::MAX, &filter, &key).encode();
        assert!(text.len() <= PAGE_TOKEN_CHARS_MAX);
        assert!(PageToken::decode(&text, &filter).is_ok());
    }

    #[test]
    fn every_malformed_token_is_refused_on_page_token_saying_why() {
        // Length, base64, size, format, revision, fingerprint, key form and key match.
        let (t, ten) = (type_("g", "K"), tenancy("p", "ns"));
        let filter = ListFilter {
            type_: &t,
            tenancy: &ten,
            name_prefix: "",
            selector: None,
        };
        let fp = filter.fingerprint();
        let good_key = b"g\0K\0p\0ns\0name";
        let cases: Vec<(String, &str)> = vec![
            ("A".repeat(PAGE_TOKEN_CHARS_MAX + 1), "characters"),
            ("not base64!".into(), "base64"),
            ("AAAA=".into(), "base64"),
            (
                URL_SAFE_NO_PAD.encode([1u8; TOKEN_HEADER_BYTES]),
                "too short",
            ),
            (String::new(), "too short"),
            (record(2, 5, fp, good_key), "format 2"),
            (record(1, 0, fp, good_key), "revision 0"),
            (record(1, 5, fp ^ 1, good_key), "another listing"),
            (record(1, 5, fp, b"g\0K\0p\0ns\0\xff"), "UTF-8"),
            (record(1, 5, fp, b"g\0K\0p\0ns"), "4 fields"),
            (record(1, 5, fp, b"g\0K\0p\0ns\0a\0b"), "6 fields"),
            (record(1, 5, fp, b"g\0K\0p\0ns\0a\x07b"), "control"),
            (record(1, 5, fp, b"g\0K\0p\0ns\0"), "empty"),
            (record(1, 5, fp, b"g\0K\0q\0ns\0name"), "does not match"),
            (record(1, 5, fp, b"g\0Other\0p\0ns\0name"), "does not match"),
        ];
        for (text, says) in cases {
            let (field, reason) = field_and_reason(PageToken::decode(&text, &filter));
            assert_eq!(field, "page_token", "{text:?}");
            assert!(reason.contains(says), "{text:?}: {reason:?} lacks {says:?}");
        }
        let long_key = vec![b'n'; KEY_BYTES_MAX + 1];
        let (_, reason) =
            field_and_reason(PageToken::decode(&record(1, 5, fp, &long_key), &filter));
        assert!(reason.contains("longer than any stored key"), "{reason}");
    }

    #[test]
    fn the_fingerprint_tells_every_filter_field_apart() {
        // Changing any one field, or moving bytes between fields, changes it; the group version does not.
        let base = (type_("g", "K"), tenancy("p", "ns"), "pre");
        let fp = |t: &Type, ten: &Tenancy, prefix: &str| {
            ListFilter {
                type_: t,
                tenancy: ten,
                name_prefix: prefix,
                selector: None,
            }
            .fingerprint()
        };
        let reference = fp(&base.0, &base.1, base.2);
        let mut versioned = base.0.clone();
        versioned.group_version = "v9".into();
        assert_eq!(fp(&versioned, &base.1, base.2), reference);
        for (t, ten, prefix) in [
            (type_("g2", "K"), base.1.clone(), "pre"),
            (type_("g", "K2"), base.1.clone(), "pre"),
            (base.0.clone(), tenancy("*", "ns"), "pre"),
            (base.0.clone(), tenancy("p", "*"), "pre"),
            (base.0.clone(), base.1.clone(), "pr"),
            (type_("gK", ""), base.1.clone(), "pre"),
            (base.0.clone(), tenancy("pn", "s"), "pre"),
        ] {
            assert_ne!(fp(&t, &ten, prefix), reference, "{t:?} {ten:?} {prefix:?}");
        }
    }

    #[test]
    fn a_request_limit_is_capped_by_the_node_and_zero_means_its_maximum() {
        // limit 0 = list_page_size_max; a smaller one is kept; a larger one is capped.
        let limits = Limits {
            list_page_size_max: 100,
            ..Limits::default()
        };
        let size = |limit| PageBounds::for_request(limit, &limits).resources_max;
        assert_eq!(size(0), 100);
        assert_eq!(size(1), 1);
        assert_eq!(size(99), 99);
        assert_eq!(size(100), 100);
        assert_eq!(size(101), 100);
        assert_eq!(size(u32::MAX), 100);
        assert_eq!(
            PageBounds::for_request(7, &limits).bytes_max,
            LIST_PAGE_BYTES_MAX
        );
    }
}
