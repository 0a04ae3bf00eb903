/// mimalloc instead of glibc's malloc: a write allocates and frees many small
/// buffers on several threads (HTTP/2 frames, protobuf messages, openraft
/// entries), and glibc's arenas spent about a fifth of the leader's CPU in
/// `_int_malloc`, `malloc_consolidate` and `free` (perf, 64 clients, see
/// docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cairn_cli::main()
}
