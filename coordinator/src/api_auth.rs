//! Who is calling the API (DESIGN §12): a verified client certificate named in
//! `api.clients`, or a bearer token whose SHA-256 is in `api.tokens`. The presented
//! token is hashed and compared with every configured digest in constant time, so
//! neither the time taken nor an early exit tells how much of a guess was right.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{ApiConfig, Role};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The token's name or the certificate's name.
    pub name: String,
    pub role: Role,
    /// `token` or `certificate`.
    pub via: &'static str,
}

/// Why a caller is not let in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401.
    #[error(
        "credentials required: a client certificate named in api.clients, or Authorization: Bearer <token> \
         with the token's SHA-256 in api.tokens"
    )]
    Missing,
    /// 401.
    #[error("the bearer token is not in api.tokens")]
    UnknownToken,
    /// 401.
    #[error("the Authorization header is not `Bearer <token>`")]
    BadHeader,
    /// 403: the certificate is valid but has no role.
    #[error("client certificate {0:?} has no role: it is not in api.clients")]
    UnknownCertificate(String),
}

impl AuthError {
    pub fn status(&self) -> u16 {
        match self {
            AuthError::UnknownCertificate(_) => 403,
            _ => 401,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Credentials {
    tokens: Vec<(String, [u8; 32], Role)>,
    clients: Vec<(String, Role)>,
}

impl Credentials {
    /// From a validated config (token digests are 64 hex digits).
    pub fn from_config(api: &ApiConfig) -> Credentials {
        let tokens = api
            .tokens
            .iter()
            .filter_map(|t| {
                let mut d = [0u8; 32];
                hex::decode_to_slice(&t.sha256, &mut d).ok()?;
                Some((t.name.clone(), d, t.role))
            })
            .collect();
        Credentials {
            tokens,
            clients: api.clients.iter().map(|c| (c.name.clone(), c.role)).collect(),
        }
    }

    /// `cert_names`: the names of the client certificate the TLS handshake verified, if
    /// any. A certificate named in `api.clients` wins; otherwise the bearer token counts.
    pub fn authenticate(
        &self,
        cert_names: Option<&[String]>,
        authorization: Option<&str>,
    ) -> Result<Actor, AuthError> {
        if let Some(names) = cert_names
            && let Some((name, role)) = self.clients.iter().find(|(n, _)| names.contains(n))
        {
            return Ok(Actor {
                name: name.clone(),
                role: *role,
                via: "certificate",
            });
        }
        match authorization {
            Some(h) => {
                let token = h.strip_prefix("Bearer ").ok_or(AuthError::BadHeader)?;
                self.token(token.trim()).ok_or(AuthError::UnknownToken)
            }
            None => match cert_names.and_then(|n| n.first()) {
                Some(name) => Err(AuthError::UnknownCertificate(name.clone())),
                None => Err(AuthError::Missing),
            },
        }
    }

    fn token(&self, presented: &str) -> Option<Actor> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        // every digest is compared, whichever matches
        let mut found = None;
        for (name, d, role) in &self.tokens {
            let eq: bool = d.ct_eq(&digest).into();
            if eq && found.is_none() {
                found = Some(Actor {
                    name: name.clone(),
                    role: *role,
                    via: "token",
                });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiClient, ApiToken};

    fn creds() -> Credentials {
        Credentials::from_config(&ApiConfig {
            tls: None,
            clients: vec![ApiClient {
                name: "alice".into(),
                role: Role::Auditor,
            }],
            tokens: vec![ApiToken {
                name: "ci".into(),
                sha256: hex::encode(Sha256::digest(b"s3cret-token")),
                role: Role::Operator,
            }],
        })
    }

    #[test]
    fn a_token_logs_in_only_when_its_hash_matches() {
        let c = creds();
        assert_eq!(
            c.authenticate(None, Some("Bearer s3cret-token")).unwrap(),
            Actor {
                name: "ci".into(),
                role: Role::Operator,
                via: "token"
            }
        );
        // same length, one character off
        assert_eq!(
            c.authenticate(None, Some("Bearer s3cret-tokem")),
            Err(AuthError::UnknownToken)
        );
        assert_eq!(
            c.authenticate(None, Some("Bearer ")),
            Err(AuthError::UnknownToken)
        );
        assert_eq!(
            c.authenticate(None, Some("s3cret-token")),
            Err(AuthError::BadHeader)
        );
        assert_eq!(c.authenticate(None, None), Err(AuthError::Missing));
    }

    #[test]
    fn a_certificate_needs_a_role_or_falls_back_to_the_token() {
        let c = creds();
        let alice = vec!["alice".to_string()];
        assert_eq!(c.authenticate(Some(&alice), None).unwrap().role, Role::Auditor);
        let bob = vec!["bob".to_string()];
        assert_eq!(
            c.authenticate(Some(&bob), None),
            Err(AuthError::UnknownCertificate("bob".into()))
        );
        assert_eq!(
            c.authenticate(Some(&bob), Some("Bearer s3cret-token"))
                .unwrap()
                .name,
            "ci"
        );
    }

    #[test]
    fn roles_are_ordered_as_design_12_lists_them() {
        assert!(
            Role::Viewer < Role::Operator && Role::Operator < Role::Auditor && Role::Auditor < Role::Admin
        );
    }
}
