//! How much memory the table holds per stored resource, next to the resource's
//! encoded size (issue 9's target: at most 3×).
//!
//! Run: `cargo run --release -p cairn-fsm --example memory [-- COUNT]`
//!
//! It writes COUNT (default 100,000) resources shaped like `cairn bench`'s (a
//! 256-byte payload, the bench's type, tenancy and names) into a fresh
//! [`Store`], then reports the heap bytes still live per resource: what the
//! allocator handed out (`malloc_usable_size`, so size-class rounding counts),
//! before and after, divided by COUNT. Unlike a process's RSS this is exact and
//! repeatable, and leaves out the Raft log, the allocator's free lists and
//! every buffer that dies with its request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use cairn_fsm::{Command, Limits, Store};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Id, Resource, Tenancy, Type};

/// The system allocator, counting the usable bytes of live allocations.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

fn usable_bytes(ptr: *mut u8) -> isize {
    // SAFETY: `ptr` was returned by the system allocator and is still live.
    unsafe { libc::malloc_usable_size(ptr.cast()) as isize }
}

// SAFETY: every call is forwarded to `System`; the counter only observes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(usable_bytes(ptr), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(usable_bytes(ptr), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = usable_bytes(ptr);
        let moved = System.realloc(ptr, layout, new_size);
        if !moved.is_null() {
            LIVE_BYTES.fetch_add(usable_bytes(moved) - before, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A resource as `cairn bench write` creates it (see bench/src).
fn bench_resource(k: u64) -> Resource {
    Resource {
        id: Some(Id {
            uid: "bench".into(),
            name: format!("k{k:09}"),
            r#type: Some(Type {
                group: "bench".into(),
                group_version: "v1".into(),
                kind: "Item".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "mem1763830000".into(),
            }),
        }),
        data: Some(Any {
            type_url: "type.googleapis.com/cairn.bench.Value".into(),
            value: Bytes::from(vec![0x5a; 256]),
        }),
        ..Default::default()
    }
}

fn main() {
    let count: u64 = match std::env::args().nth(1) {
        Some(arg) => match arg.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("memory: COUNT must be a positive integer, got {arg:?}");
                std::process::exit(2);
            }
        },
        None => 100_000,
    };
    let store = Store::new(Limits::default());
    let before_bytes = LIVE_BYTES.load(Ordering::Relaxed);
    let mut encoded_bytes = 0u64;
    for k in 0..count {
        let index = k + 1;
        store
            .apply(
                index,
                &Command::Write {
                    resource: bench_resource(k),
                },
            )
            .expect("a bench resource is valid");
        if k == 0 {
            let stored = store.view().iter().next().cloned().expect("one stored");
            encoded_bytes = stored.encoded().len() as u64;
        }
    }
    let after_bytes = LIVE_BYTES.load(Ordering::Relaxed);
    assert_eq!(store.view().len() as u64, count, "every write was stored");
    let per_resource_bytes = (after_bytes - before_bytes) as f64 / count as f64;
    println!("resources              {count}");
    println!("encoded size           {encoded_bytes} B (as stored, with its version)");
    println!("heap per resource      {per_resource_bytes:.0} B (live allocations, size classes included)");
    println!(
        "ratio                  {:.2}x",
        per_resource_bytes / encoded_bytes as f64
    );
}
