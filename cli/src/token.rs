//! `cairn token new | hash`: bearer tokens for `[[auth.grants]]`, made and hashed as the
//! node checks them (`cairn_server::auth`).

use clap::Subcommand;

use crate::common::exit;

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Print a new random token (line 1) and its `token_sha256` config line (line 2).
    New,
    /// Print the `token_sha256` config line of a token read from stdin.
    Hash,
}

/// `cairn token new | hash`.
pub fn run(command: TokenCommand) -> u8 {
    use cairn_server::auth::{new_token, token_sha256_hex};
    match command {
        TokenCommand::New => match new_token() {
            Ok(token) => {
                println!("{token}");
                println!("token_sha256 = \"{}\"", token_sha256_hex(&token));
                eprintln!(
                    "cairn: give the token (line 1) to the client; put the token_sha256 line \
                     (line 2) in a [[auth.grants]] entry of every node's config. The node \
                     keeps only the hash: the token cannot be shown again."
                );
                exit::OK
            }
            Err(e) => {
                eprintln!("cairn: {e}");
                exit::ERROR
            }
        },
        TokenCommand::Hash => {
            let mut text = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
                eprintln!("cairn: cannot read the token from stdin: {e}");
                return exit::ERROR;
            }
            match cairn_client::BearerToken::new(text) {
                Ok(token) => {
                    println!("token_sha256 = \"{}\"", token_sha256_hex(token.secret()));
                    exit::OK
                }
                Err(e) => {
                    eprintln!("cairn: stdin: {e}");
                    exit::USAGE
                }
            }
        }
    }
}
