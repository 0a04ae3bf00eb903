fn main() {
    eprintln!("cairn: the node is not built yet");
    std::process::exit(2);
}
