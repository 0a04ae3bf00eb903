//! Credentials a client presents: a bearer token, sent as
//! `authorization: Bearer <token>` metadata on every call.
//!
//! A [`BearerToken`] never shows its secret in `Debug` output or logs; the
//! metadata value is marked sensitive so that tonic and hyper do not print it
//! either. [`Credentials`] is the tonic interceptor that attaches it, shared by
//! the [`crate::Client`] and the `cairn` admin commands.

use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::ClientError;

/// The metadata key carrying the token.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// A bearer token: printable ASCII without spaces, at most
/// [`BearerToken::LEN_MAX`] bytes. The secret is only reachable through
/// [`BearerToken::secret`].
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(Arc<str>);

impl BearerToken {
    /// The longest token accepted (a generated one is far shorter).
    pub const LEN_MAX: usize = 1024;

    /// Checks a token's form; the error names the `token` setting, never
    /// the token itself.
    pub fn new(token: impl Into<String>) -> Result<BearerToken, ClientError> {
        let token = token.into();
        let token = token.trim();
        if token.is_empty() {
            return Err(ClientError::invalid("token", "is empty"));
        }
        if token.len() > Self::LEN_MAX {
            return Err(ClientError::invalid(
                "token",
                format!("is longer than {} bytes", Self::LEN_MAX),
            ));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::invalid(
                "token",
                "must be printable ASCII without spaces",
            ));
        }
        Ok(BearerToken(Arc::from(token)))
    }

    /// The token itself (to hash it, or to hand it to another process).
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The `authorization` metadata value, marked sensitive.
    fn header_value(&self) -> MetadataValue<Ascii> {
        let mut value = MetadataValue::try_from(format!("Bearer {}", self.0))
            .expect("a BearerToken is printable ASCII by construction");
        value.set_sensitive(true);
        value
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// A tonic interceptor adding `authorization: Bearer <token>` to every
/// request, or nothing when there is no token. Clones share the token:
/// [`Credentials::replace`] changes it for every clone's next request (a
/// node re-reading its token file on SIGHUP).
#[derive(Clone, Default)]
pub struct Credentials {
    header: Arc<parking_lot::RwLock<Option<MetadataValue<Ascii>>>>,
}

impl Credentials {
    pub fn new(token: Option<&BearerToken>) -> Credentials {
        Credentials {
            header: Arc::new(parking_lot::RwLock::new(
                token.map(BearerToken::header_value),
            )),
        }
    }

    /// Every clone presents `token` (or nothing) from its next request on.
    pub fn replace(&self, token: Option<&BearerToken>) {
        *self.header.write() = token.map(BearerToken::header_value);
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = if self.header.read().is_some() {
            "Credentials(bearer <redacted>)"
        } else {
            "Credentials(none)"
        };
        f.write_str(shown)
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = self.header.read().clone() {
            request.metadata_mut().insert(AUTHORIZATION_HEADER, header);
        }
        Ok(request)
    }
}

/// A channel whose every request carries [`Credentials`].
pub type AuthenticatedChannel = InterceptedService<Channel, Credentials>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    #[test]
    fn a_token_is_sent_as_a_bearer_header_and_never_shown() {
        // The header carries the token; Debug output of either type does not.
        let token = BearerToken::new("cairn-abc123").unwrap();
        assert_eq!(format!("{token:?}"), "BearerToken(<redacted>)");
        let mut credentials = Credentials::new(Some(&token));
        assert!(!format!("{credentials:?}").contains("abc123"));
        let request = credentials.call(tonic::Request::new(())).unwrap();
        let header = request.metadata().get(AUTHORIZATION_HEADER).unwrap();
        assert_eq!(header.to_str().unwrap(), "Bearer cairn-abc123");
        assert!(header.is_sensitive());
        let bare = Credentials::new(None)
            .call(tonic::Request::new(()))
            .unwrap();
        assert!(bare.metadata().get(AUTHORIZATION_HEADER).is_none());
    }

    #[test]
    fn a_replaced_token_is_what_every_clone_sends_next() {
        let mut credentials = Credentials::new(Some(&BearerToken::new("old").unwrap()));
        let mut clone = credentials.clone();
        credentials.replace(Some(&BearerToken::new("new").unwrap()));
        for c in [&mut credentials, &mut clone] {
            let request = c.call(tonic::Request::new(())).unwrap();
            let header = request.metadata().get(AUTHORIZATION_HEADER).unwrap();
            assert_eq!(header.to_str().unwrap(), "Bearer new");
        }
        clone.replace(None);
        let request = credentials.call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get(AUTHORIZATION_HEADER).is_none());
    }

    #[test]
    fn malformed_tokens_are_refused_naming_the_setting() {
        // Empty, spaced, non-ASCII or huge tokens could never match a grant.
        for bad in [
            "",
            "   ",
            "has space",
            "tab\there",
            "caf\u{e9}",
            &"x".repeat(1025),
        ] {
            match BearerToken::new(bad) {
                Err(ClientError::InvalidArgument { field, .. }) => assert_eq!(field, "token"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        // Surrounding whitespace (a token file's newline) is dropped.
        assert_eq!(BearerToken::new("abc\n").unwrap().secret(), "abc");
    }
}
