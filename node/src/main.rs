fn main() -> std::process::ExitCode {
    cairn_node::cli::main()
}
