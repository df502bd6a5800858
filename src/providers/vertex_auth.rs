//! Vertex AI's OAuth: a service account's JSON key exchanged for an access
//! token by the JWT-bearer grant (RFC 7523, as Google documents it for
//! server-to-server apps), the token cached and fetched anew before it
//! expires.
//!
//! The JWT is signed RS256 with `ring` (already in the build under rustls):
//! a JWT is three base64url segments, so signing one needs no more than
//! that. The private key never leaves this module and is never printed:
//! errors name the file and the field, not the content.

use super::classify::retry_after;
use super::config::{Secret, Timeouts};
use super::transport::exchange;
use super::{AttemptOutcome, Failure};
use crate::domain::ErrorKind;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// The scope Vertex AI's generateContent needs.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint, when the key file names none.
pub const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// How long an assertion is valid for (Google's maximum).
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
/// A token expiring within this is replaced before use, so a call never
/// starts with a token that dies on the way.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);
const JWT_BEARER_GRANT: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";

/// The fields of a service-account key file that the grant needs.
pub struct ServiceAccount {
    client_email: String,
    private_key_id: Option<String>,
    token_uri: String,
    key: RsaKeyPair,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .field("key", &"***")
            .finish()
    }
}

impl ServiceAccount {
    /// Read a key file as Google issues it (`"type": "service_account"`).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parse a key file's JSON. Messages name fields, never values.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| format!("not JSON (line {}, column {})", e.line(), e.column()))?;
        if value["type"] != "service_account" {
            return Err("`type` must be \"service_account\"".into());
        }
        let field = |name: &str| value[name].as_str().filter(|v| !v.is_empty());
        let client_email = field("client_email").ok_or("`client_email` is missing")?;
        let pem = field("private_key").ok_or("`private_key` is missing")?;
        let der = pem_body(pem, "PRIVATE KEY")
            .ok_or("`private_key` is not a PEM \"PRIVATE KEY\" (PKCS #8)")?;
        let key = RsaKeyPair::from_pkcs8(&der)
            .map_err(|e| format!("`private_key` is not a usable RSA key: {e}"))?;
        Ok(ServiceAccount {
            client_email: client_email.to_string(),
            private_key_id: field("private_key_id").map(str::to_string),
            token_uri: field("token_uri").unwrap_or(DEFAULT_TOKEN_URI).to_string(),
            key,
        })
    }

    pub fn token_uri(&self) -> &str {
        &self.token_uri
    }

    /// A signed assertion for the grant, issued at `now` (seconds since
    /// the epoch).
    pub fn assertion(&self, now: u64) -> Result<String, String> {
        let mut header = json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = json!(kid);
        }
        let claims = json!({
            "iss": self.client_email,
            "scope": CLOUD_PLATFORM_SCOPE,
            "aud": self.token_uri,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME.as_secs(),
        });
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .map_err(|_| "the private key cannot sign".to_string())?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

/// The base64 body of a PEM block labelled `label`, decoded.
pub fn pem_body(pem: &str, label: &str) -> Option<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin)? + begin.len();
    let stop = start + pem[start..].find(&end)?;
    let body: String = pem[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    STANDARD.decode(body).ok()
}

struct CachedToken {
    token: Secret,
    expires_at: Instant,
}

/// Access tokens for one service account, shared by every call of the
/// provider; one fetch at a time, so concurrent calls wait for the same
/// new token rather than each asking for one.
pub struct VertexAuth {
    account: ServiceAccount,
    client: reqwest::Client,
    timeouts: Timeouts,
    cached: Mutex<Option<CachedToken>>,
}

impl std::fmt::Debug for VertexAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VertexAuth")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

fn auth_failure(retryable: bool, message: String, status: Option<u16>) -> Failure {
    Failure {
        retryable,
        retry_after: None,
        kind: if retryable {
            ErrorKind::AuthUnavailable
        } else {
            ErrorKind::Unauthorized
        },
        message,
        status,
    }
}

impl VertexAuth {
    pub fn new(account: ServiceAccount, client: reqwest::Client, timeouts: Timeouts) -> Self {
        VertexAuth {
            account,
            client,
            timeouts,
            cached: Mutex::new(None),
        }
    }

    /// A token valid for at least [`REFRESH_MARGIN`]. Failing to get one is
    /// a definitive failure of the call: no inference request was sent.
    pub async fn token(&self) -> Result<Secret, Failure> {
        let mut cached = self.cached.lock().await;
        if let Some(t) = cached.as_ref() {
            if t.expires_at.saturating_duration_since(Instant::now()) > REFRESH_MARGIN {
                return Ok(t.token.clone());
            }
        }
        let fresh = self.fetch().await?;
        let token = fresh.token.clone();
        *cached = Some(fresh);
        Ok(token)
    }

    async fn fetch(&self) -> Result<CachedToken, Failure> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let assertion = self
            .account
            .assertion(now)
            .map_err(|m| auth_failure(false, m, None))?;
        let requested = Instant::now();
        let request = self
            .client
            .post(self.account.token_uri())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type={JWT_BEARER_GRANT}&assertion={assertion}"
            ));
        let response = exchange(request, &self.timeouts).await.map_err(|outcome| {
            let detail = match outcome {
                AttemptOutcome::Failed(f) => f.message,
                AttemptOutcome::Unknown(a) => a.message,
                other => format!("{other:?}"),
            };
            auth_failure(true, format!("token endpoint: {detail}"), None)
        })?;
        let status = response.status.as_u16();
        let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        if !response.status.is_success() {
            // OAuth's error shape: {"error": "invalid_grant", "error_description": …}.
            let message = format!(
                "token endpoint answered HTTP {status}: {} {}",
                body["error"].as_str().unwrap_or_default(),
                body["error_description"].as_str().unwrap_or_default()
            );
            let mut failure = auth_failure(
                response.status.is_server_error() || status == 429,
                message,
                Some(status),
            );
            failure.retry_after = retry_after(&response.headers, SystemTime::now());
            return Err(failure);
        }
        let token = body["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                auth_failure(
                    true,
                    "token answer has no access_token".into(),
                    Some(status),
                )
            })?;
        let lifetime = body["expires_in"].as_u64().unwrap_or(0);
        Ok(CachedToken {
            token: Secret::new(token),
            expires_at: requested + Duration::from_secs(lifetime),
        })
    }
}

/// The service account named by `credentials_env`: the variable holds the
/// key file's path. Messages name the variable and the file, never a key.
pub fn account_from_env(var: &str) -> Result<ServiceAccount, String> {
    let path = std::env::var_os(var)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| "the variable is not set".to_string())?;
    ServiceAccount::load(Path::new(&path))
}
