//! Metadata selectors on lists and watches through the store's public interface: a list
//! holds exactly the matching resources, a page token belongs to its selector, and a
//! watch sends a resource that stops matching as a Delete and one that starts as an
//! Upsert, so that a cache fed by it equals the list at every revision.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_fsm::{ListFilter, PageBounds, PageToken, Selector, WatchEventKind};
use cairn_proto::v1::Resource;
use common::*;

fn labelled(uid: &str, name: &str, labels: &[(&str, &str)]) -> Resource {
    let mut r = resource(id(uid, name), "");
    r.metadata = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

fn list_names(log: &Log, selector: &Selector) -> Vec<String> {
    let t = services();
    let ten = tenancy("default", "default");
    let filter = ListFilter {
        type_: &t,
        tenancy: &ten,
        name_prefix: "",
        selector: Some(selector),
    };
    let page = log
        .store
        .view()
        .list_page(&filter, None, None, PageBounds::UNBOUNDED);
    names(&page.resources)
}

#[test]
fn a_list_holds_exactly_the_matching_resources_and_its_token_names_its_selector() {
    let mut log = Log::new();
    log.put(labelled("u1", "a", &[("app", "web"), ("env", "prod")]));
    log.put(labelled("u2", "b", &[("app", "web"), ("tier", "db")]));
    log.put(labelled("u3", "c", &[("app", "api"), ("env", "staging")]));
    log.put(labelled("u4", "d", &[("app", "web"), ("canary", "")]));
    let table = [
        ("", vec!["a", "b", "c", "d"]),
        ("app=web", vec!["a", "b", "d"]),
        ("app=web,tier!=db", vec!["a", "d"]),
        ("env in (prod,staging)", vec!["a", "c"]),
        ("app=web,!canary", vec!["a", "b"]),
        ("env notin (prod)", vec!["b", "c", "d"]),
        ("tier", vec!["b"]),
    ];
    for (text, want) in table {
        let selector = Selector::parse(text).unwrap();
        assert_eq!(list_names(&log, &selector), want, "{text}");
    }

    // A page token carries its selector: it is refused for another one.
    let t = services();
    let ten = tenancy("default", "default");
    let web = Selector::parse("app=web").unwrap();
    let api = Selector::parse("app=api").unwrap();
    let of = |selector| ListFilter {
        type_: &t,
        tenancy: &ten,
        name_prefix: "",
        selector,
    };
    let view = log.store.view();
    let bounds = PageBounds {
        resources_max: 1,
        ..PageBounds::UNBOUNDED
    };
    let first = view.list_page(&of(Some(&web)), None, None, bounds);
    let token = first.next.expect("more pages").encode();
    assert!(PageToken::decode(&token, &of(Some(&web))).is_ok());
    for other in [of(Some(&api)), of(None)] {
        let error = PageToken::decode(&token, &other).unwrap_err().to_string();
        assert!(error.contains("selector"), "{error}");
    }
}

#[test]
fn a_watch_sends_what_stops_matching_as_a_delete_and_what_starts_as_an_upsert() {
    let mut log = Log::new();
    let a = log.put(labelled("u1", "a", &[("app", "web")]));
    log.put(labelled("u2", "b", &[("app", "api")]));
    let mut w = filter(services(), tenancy("default", "default"), "");
    w.selector = Some(Arc::new(Selector::parse("app=web").unwrap()));
    let mut watch = log.store.watch(w.clone(), 0).unwrap();
    let start = log.index;

    let mut a2 = a.resource();
    a2.metadata.insert("app".into(), "api".into());
    let a2 = log.put(a2); // stops matching
    let b = log.store.view().read(&id("u2", "b")).unwrap();
    let mut b2 = b.resource();
    b2.metadata.insert("app".into(), "web".into());
    let b2 = log.put(b2); // starts matching
    let mut b3 = b2.resource();
    b3.data = None;
    let b3 = log.put(b3); // still matches
    let mut a3 = a2.resource();
    a3.metadata.insert("other".into(), "x".into());
    log.put(a3); // never matched since: nothing
    log.delete(id("u2", "b"), b3.version()).unwrap(); // a matching one goes

    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    use WatchEventKind::*;
    let seen: Vec<_> = summary(&events)
        .into_iter()
        .map(|(kind, name, _, _)| (kind, name))
        .collect();
    let want = [
        (Upsert, "a"),
        (EndOfSnapshot, ""),
        (Delete, "a"),
        (Upsert, "b"),
        (Upsert, "b"),
        (Delete, "b"),
    ];
    let want: Vec<_> = want.iter().map(|(k, n)| (*k, n.to_string())).collect();
    assert_eq!(seen, want);

    // A watch resumed from a revision replays the same events from the history.
    let mut resumed = log.store.watch(w, start).unwrap();
    let (replayed, _) = drain(&mut resumed);
    assert_eq!(summary(&replayed), summary(&events[2..]));

    // A cache fed by the watch equals the list at the end.
    let mut cache: BTreeMap<String, ()> = BTreeMap::new();
    for (kind, name, _, _) in summary(&events) {
        match kind {
            Upsert => {
                cache.insert(name, ());
            }
            Delete => {
                cache.remove(&name);
            }
            _ => {}
        }
    }
    let listed = list_names(&log, &Selector::parse("app=web").unwrap());
    assert_eq!(cache.into_keys().collect::<Vec<_>>(), listed);
}
