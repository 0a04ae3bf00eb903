//! The partition machinery on the real kernel: namespaces, nftables rules and
//! their cleanup. Needs root, `ip` and `nft`; otherwise each test prints
//! SKIPPED with the reason and returns.

use std::process::Command;

use jepsen_tests::net::{self, shapes, NetworkLab};

fn skip_reason() -> Option<String> {
    net::unavailable_reason()
}

fn namespaces() -> String {
    String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned()
}

fn ruleset(namespace: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", namespace, "nft", "list", "ruleset"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn partition_rules_appear_in_the_namespaces_and_heal_removes_them() {
    // Isolating node 1 installs drop rules on both sides; healing removes every table.
    if let Some(reason) = skip_reason() {
        println!(
            "SKIPPED partition_rules_appear_in_the_namespaces_and_heal_removes_them: {reason}"
        );
        return;
    }
    let lab = NetworkLab::new().unwrap();
    let a = lab.add_node(1).unwrap();
    let b = lab.add_node(2).unwrap();
    lab.partition(&shapes::isolate(1, &[1, 2])).unwrap();
    let rules_a = ruleset(&a.namespace);
    assert!(
        rules_a.contains("cairn_nemesis") && rules_a.contains(&b.ip),
        "{rules_a}"
    );
    let rules_b = ruleset(&b.namespace);
    assert!(rules_b.contains(&a.ip), "{rules_b}");
    lab.heal().unwrap();
    assert!(!ruleset(&a.namespace).contains("cairn_nemesis"));
    assert!(!ruleset(&b.namespace).contains("cairn_nemesis"));
}

#[test]
fn dropping_the_lab_removes_its_namespaces_and_bridge() {
    // Everything the lab created is gone once it is dropped.
    if let Some(reason) = skip_reason() {
        println!("SKIPPED dropping_the_lab_removes_its_namespaces_and_bridge: {reason}");
        return;
    }
    let lab = NetworkLab::new().unwrap();
    let node = lab.add_node(3).unwrap();
    let bridge = lab.bridge().to_owned();
    assert!(namespaces().contains(&node.namespace));
    drop(lab);
    assert!(!namespaces().contains(&node.namespace));
    let links = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!links.contains(&format!(" {bridge}:")), "{links}");
    assert!(!links.contains(&format!(" {bridge} ")), "{links}");
}
