//! Paginated lists through the store's public API: the page scan
//! (`View::list_page`) against the plain list it pages (order, filters,
//! visibility, the count and byte bounds, exact boundaries), pages read at
//! the first page's revision while the table changes, and the page token
//! (round trip between pages; any malformed text refused, never a panic).

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use cairn_fsm::{
    FsmError, Limits, ListFilter, Page, PageBounds, PageToken, ReadScope, Scope, StoredResource,
    View, LIST_PAGE_BYTES_MAX, PAGE_TOKEN_CHARS_MAX,
};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Resource, Tenancy, Type};
use common::*;
use proptest::prelude::*;

fn bounds(resources_max: usize) -> PageBounds {
    PageBounds {
        resources_max,
        bytes_max: LIST_PAGE_BYTES_MAX,
    }
}

/// Every page of the listing of `filter` on `view`, each token passed
/// through its text form as a client carries it.
fn listing(
    view: &View,
    filter: &ListFilter<'_>,
    visible: Option<&ReadScope>,
    bounds: PageBounds,
) -> Vec<Page> {
    let mut pages = Vec::new();
    let mut after: Option<PageToken> = None;
    loop {
        let page = view.list_page(filter, visible, after.as_ref(), bounds);
        let next = page.next.clone();
        pages.push(page);
        match next {
            None => return pages,
            Some(token) => {
                assert_eq!(token.revision(), view.revision());
                let decoded = PageToken::decode(&token.encode(), filter).expect("own token");
                assert_eq!(decoded, token);
                after = Some(decoded);
            }
        }
        assert!(pages.len() < 100_000, "a listing ends");
    }
}

fn keys(resources: &[StoredResource]) -> Vec<(String, String, String)> {
    resources
        .iter()
        .map(|r| {
            let h = r.head();
            (
                h.partition().to_string(),
                h.namespace().to_string(),
                h.name.to_string(),
            )
        })
        .collect()
}

/// The bytes a resource takes in an answer's `repeated bytes` field.
fn answer_bytes(resources: &[StoredResource]) -> usize {
    resources
        .iter()
        .map(|r| {
            let len = r.encoded().len();
            1 + prost::encoding::encoded_len_varint(len as u64) + len
        })
        .sum()
}

fn flatten(pages: &[Page]) -> Vec<StoredResource> {
    pages.iter().flat_map(|p| p.resources.clone()).collect()
}

/// Seven Services in assorted tenancies, plus same-named resources of other
/// kinds and groups (never listed).
fn populate(log: &mut Log) {
    for (p, ns, name) in [
        ("default", "default", "api"),
        ("default", "default", "apple"),
        ("default", "default", "Api"),
        ("default", "team", "api"),
        ("other", "default", "api"),
        ("", "", "api"),
        ("", "team", "web"),
    ] {
        log.put(resource(full_id("u", name, services(), tenancy(p, ns)), ""));
    }
    for t in [
        ty("catalog", "v1", "Node"),
        ty("catalogue", "v1", "Service"),
    ] {
        log.put(resource(
            full_id("u", "api", t, tenancy("default", "default")),
            "",
        ));
    }
}

fn filters() -> Vec<(Tenancy, &'static str)> {
    let mut out = Vec::new();
    for (p, ns) in [
        ("*", "*"),
        ("default", "*"),
        ("*", "default"),
        ("default", "default"),
        ("", ""),
        ("nope", "*"),
    ] {
        for prefix in ["", "ap", "api", "A", "zz"] {
            out.push((tenancy(p, ns), prefix));
        }
    }
    out
}

#[test]
fn pages_follow_storage_key_order_and_together_are_the_list() {
    // For every filter and page size: pages concatenated are the plain list
    // (which is in storage-key order), every page but the last is full, and
    // a listing whose size the page size divides ends on a full page, with
    // no empty page after it.
    let mut log = Log::new();
    populate(&mut log);
    let view = log.store.view();
    let services = ty("catalog", "v-ignored", "Service");
    for (ten, prefix) in filters() {
        let filter = ListFilter {
            type_: &services,
            tenancy: &ten,
            name_prefix: prefix,
            selector: None,
        };
        let all = view.list(&services, &ten, prefix);
        for size in 1..=9 {
            let pages = listing(&view, &filter, None, bounds(size));
            assert_eq!(
                keys(&flatten(&pages)),
                keys(&all),
                "{ten:?} {prefix:?} {size}"
            );
            let (last, full) = pages.split_last().expect("at least one page");
            assert!(full.iter().all(|p| p.resources.len() == size));
            assert!(last.resources.len() <= size && last.next.is_none());
            let expected_pages = all.len().div_ceil(size).max(1);
            assert_eq!(pages.len(), expected_pages, "{ten:?} {prefix:?} {size}");
            if !all.is_empty() {
                assert!(!last.resources.is_empty(), "no empty page ends a listing");
            }
        }
    }
}

#[test]
fn a_page_counts_only_what_the_caller_may_see() {
    // A scope of default/* shows 4 of the 7 Services; pages of 2 hold two
    // visible Services each and the second page ends the listing, though
    // invisible ones follow in key order.
    let mut log = Log::new();
    populate(&mut log);
    let view = log.store.view();
    let scope = ReadScope::new(vec![Scope::parse(
        &["catalog.Service".to_string()],
        &["default/*".to_string()],
    )
    .unwrap()]);
    let everything = tenancy("*", "*");
    let filter = ListFilter {
        type_: &services(),
        tenancy: &everything,
        name_prefix: "",
        selector: None,
    };
    let pages = listing(&view, &filter, Some(&scope), bounds(2));
    assert_eq!(pages.len(), 2);
    assert!(pages.iter().all(|p| p.resources.len() == 2));
    assert!(flatten(&pages)
        .iter()
        .all(|r| r.head().partition() == "default"));
    // A scope that shows nothing: one empty last page.
    let none = ReadScope::new(vec![Scope::parse(
        &["other.*".to_string()],
        &["*".to_string()],
    )
    .unwrap()]);
    let pages = listing(&view, &filter, Some(&none), bounds(1));
    assert_eq!(pages.len(), 1);
    assert!(pages[0].resources.is_empty() && pages[0].next.is_none());
}

/// A Service named `name` whose encoding is about `payload_bytes` long.
fn sized(name: &str, payload_bytes: usize) -> Resource {
    let mut r = resource(
        full_id("u", name, services(), tenancy("default", "default")),
        "",
    );
    r.data = Some(Any {
        type_url: "t".into(),
        value: Bytes::from(vec![b'x'; payload_bytes]),
    });
    r
}

#[test]
fn a_page_ends_before_its_byte_budget_but_holds_at_least_one_resource() {
    // Resources of ~1000 bytes under a 2500-byte budget: two per page. A
    // resource larger than the budget is alone on its page, never dropped.
    let mut log = Log::new();
    for i in 0..5 {
        log.put(sized(&format!("r{i}"), 1000));
    }
    log.put(sized("r5-huge", 10_000));
    log.put(sized("r6", 1000));
    let view = log.store.view();
    let ten = tenancy("default", "default");
    let filter = ListFilter {
        type_: &services(),
        tenancy: &ten,
        name_prefix: "",
        selector: None,
    };
    let budget = PageBounds {
        resources_max: 100,
        bytes_max: 2500,
    };
    let pages = listing(&view, &filter, None, budget);
    let names: Vec<Vec<String>> = pages
        .iter()
        .map(|p| keys(&p.resources).into_iter().map(|k| k.2).collect())
        .collect();
    assert_eq!(
        names,
        [
            vec!["r0", "r1"],
            vec!["r2", "r3"],
            vec!["r4"],
            vec!["r5-huge"],
            vec!["r6"]
        ]
    );
    for page in &pages {
        assert!(page.resources.len() == 1 || answer_bytes(&page.resources) <= budget.bytes_max);
    }
}

#[test]
fn later_pages_read_the_first_pages_revision_while_the_table_changes() {
    // Page 1 is read at revision R. Then a listed resource is deleted, one
    // is replaced, one is deleted and re-created, and new ones appear before
    // and after the page boundary. Pages read from view_at(R) still add up
    // to the listing at R, exactly; the latest view would not.
    let mut log = Log::new();
    let mut stored = Vec::new();
    for i in 0..10 {
        stored.push(log.put(sized(&format!("n{i}"), 10)));
    }
    let ten = tenancy("default", "default");
    let filter = ListFilter {
        type_: &services(),
        tenancy: &ten,
        name_prefix: "",
        selector: None,
    };
    let first_view = log.store.view();
    let expected = keys(&first_view.list(&services(), &ten, ""));
    let versions_at_r: Vec<String> = stored.iter().map(|r| r.version().to_string()).collect();
    let first = first_view.list_page(&filter, None, None, bounds(4));
    let token = first.next.clone().expect("more pages");
    let revision = token.revision();
    drop(first_view);

    let id_of = |i: usize| full_id("u", &format!("n{i}"), services(), ten.clone());
    log.delete(id_of(6), stored[6].version()).unwrap();
    let mut replaced = sized("n7", 20);
    replaced.version = stored[7].version().to_string();
    log.put(replaced);
    log.delete(id_of(8), stored[8].version()).unwrap();
    log.put(sized("n8", 30));
    log.put(sized("n35", 10));
    log.put(sized("n95", 10));
    log.put(sized("a-first", 10));

    let mut served = first.resources.clone();
    let mut after = Some(PageToken::decode(&token.encode(), &filter).unwrap());
    while let Some(token) = after {
        let view = log.store.view_at(token.revision()).expect("retained");
        assert_eq!(view.revision(), revision);
        let page = view.list_page(&filter, None, Some(&token), bounds(4));
        served.extend(page.resources);
        after = page.next;
    }
    assert_eq!(keys(&served), expected);
    let versions: Vec<String> = served.iter().map(|r| r.version().to_string()).collect();
    assert_eq!(versions, versions_at_r);
    // The latest table differs, so the check above had something to catch.
    assert_ne!(
        keys(&log.store.view().list(&services(), &ten, "")),
        expected
    );
}

#[test]
fn a_token_of_a_compacted_revision_cannot_be_served() {
    // With 3 changes of history, a listing's revision falls out of reach
    // after a few writes: view_at answers Compacted with the oldest
    // retained revision, which is what a node answers for the next page.
    let mut log = Log::with_limits(Limits {
        history_changes_max: 3,
        ..Limits::default()
    });
    for i in 0..5 {
        log.put(sized(&format!("n{i}"), 10));
    }
    let ten = tenancy("default", "default");
    let filter = ListFilter {
        type_: &services(),
        tenancy: &ten,
        name_prefix: "",
        selector: None,
    };
    let token = log
        .store
        .view()
        .list_page(&filter, None, None, bounds(2))
        .next
        .expect("more pages");
    for i in 5..9 {
        log.put(sized(&format!("n{i}"), 10));
    }
    match log.store.view_at(token.revision()) {
        Err(FsmError::Compacted {
            oldest_retained_revision,
        }) => assert!(oldest_retained_revision > token.revision()),
        other => panic!("expected Compacted, got {:?}", other.map(|v| v.revision())),
    }
}

#[test]
#[should_panic(expected = "read at its first page's revision")]
fn a_page_read_at_another_revision_than_its_token_is_a_bug() {
    // The store asserts what the node must do: read a later page at the token's revision.
    let mut log = Log::new();
    for i in 0..3 {
        log.put(sized(&format!("n{i}"), 10));
    }
    let ten = tenancy("default", "default");
    let filter = ListFilter {
        type_: &services(),
        tenancy: &ten,
        name_prefix: "",
        selector: None,
    };
    let token = log
        .store
        .view()
        .list_page(&filter, None, None, bounds(1))
        .next
        .unwrap();
    log.put(sized("n9", 10));
    log.store
        .view()
        .list_page(&filter, None, Some(&token), bounds(1));
}

// ---------------------------------------------------------------- properties

/// A small universe of names and tenancies, so that filters hit often.
fn arb_entries() -> impl Strategy<Value = Vec<(usize, usize, String, usize)>> {
    proptest::collection::vec((0..3usize, 0..3usize, "[ab]{1,3}", 0..400usize), 0..40)
}

const PARTS: [&str; 3] = ["", "p", "q"];

proptest! {
    #![proptest_config(cairn_test_support::fuzz::config(128))]

    #[test]
    fn any_listing_pages_to_exactly_the_list(
        entries in arb_entries(),
        partition in prop_oneof![Just("*"), Just(""), Just("p")],
        namespace in prop_oneof![Just("*"), Just(""), Just("q")],
        prefix in "[ab]{0,2}",
        resources_max in 1..8usize,
        bytes_max in prop_oneof![Just(LIST_PAGE_BYTES_MAX), 1..1500usize],
    ) {
        // Concatenated pages equal the list, in order; each page within its bounds.
        let mut log = Log::new();
        for (p, ns, name, payload) in &entries {
            let mut r = sized(name, *payload);
            r.id.as_mut().unwrap().tenancy = Some(tenancy(PARTS[*p], PARTS[*ns]));
            let stored = log.store.view().read(r.id.as_ref().unwrap()).ok();
            r.version = stored.map(|s| s.version().to_string()).unwrap_or_default();
            log.put(r);
        }
        let view = log.store.view();
        let ten = tenancy(partition, namespace);
        let t: Type = services();
        let filter = ListFilter { type_: &t, tenancy: &ten, name_prefix: &prefix, selector: None };
        let budget = PageBounds { resources_max, bytes_max };
        let pages = listing(&view, &filter, None, budget);
        prop_assert_eq!(keys(&flatten(&pages)), keys(&view.list(&t, &ten, &prefix)));
        for page in &pages {
            prop_assert!(page.resources.len() <= resources_max);
            prop_assert!(page.resources.len() <= 1 || answer_bytes(&page.resources) <= bytes_max);
        }
        for page in &pages[..pages.len() - 1] {
            prop_assert!(!page.resources.is_empty());
        }
    }

    #[test]
    fn no_text_makes_the_token_decoder_panic(text in ".{0,64}", raw in proptest::collection::vec(any::<u8>(), 0..64)) {
        // Arbitrary text, and arbitrary records in valid base64: refused on page_token or read.
        let ten = tenancy("*", "*");
        let t = services();
        let filter = ListFilter { type_: &t, tenancy: &ten, name_prefix: "", selector: None };
        for candidate in [text, URL_SAFE_NO_PAD.encode(&raw)] {
            match PageToken::decode(&candidate, &filter) {
                Ok(token) => prop_assert_eq!(PageToken::decode(&token.encode(), &filter), Ok(token)),
                Err(FsmError::InvalidArgument { field, .. }) => prop_assert_eq!(field, "page_token"),
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn no_edit_of_a_valid_token_makes_the_decoder_panic(
        edits in cairn_test_support::fuzz::mutations(),
        on_text in any::<bool>(),
    ) {
        // Byte edits of a real token's record (or of its text): refused on page_token, or a
        // token that round-trips and still matches the filter.
        let mut log = Log::new();
        for i in 0..3 {
            log.put(sized(&format!("n{i}"), 10));
        }
        let ten = tenancy("default", "*");
        let t = services();
        let filter = ListFilter { type_: &t, tenancy: &ten, name_prefix: "n", selector: None };
        let token = log.store.view().list_page(&filter, None, None, bounds(1)).next.unwrap();
        let text = token.encode();
        let edited = if on_text {
            String::from_utf8_lossy(&cairn_test_support::fuzz::mutate(text.into_bytes(), &edits)).into_owned()
        } else {
            let record = URL_SAFE_NO_PAD.decode(&text).unwrap();
            URL_SAFE_NO_PAD.encode(cairn_test_support::fuzz::mutate(record, &edits))
        };
        prop_assert!(edited.len() <= PAGE_TOKEN_CHARS_MAX);
        match PageToken::decode(&edited, &filter) {
            Ok(decoded) => {
                prop_assert_eq!(PageToken::decode(&decoded.encode(), &filter), Ok(decoded.clone()));
                // A token still good enough to read from: the scan resumes within the filter.
                if decoded.revision() == log.store.applied_index() {
                    let page = log.store.view().list_page(&filter, None, Some(&decoded), bounds(5));
                    prop_assert!(page.resources.iter().all(|r| r.head().name.starts_with('n')));
                }
            }
            Err(FsmError::InvalidArgument { field, .. }) => prop_assert_eq!(field, "page_token"),
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }
}
