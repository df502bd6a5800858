//! AWS credentials and signed requests for the bedrock kind: the access
//! key, secret and session token read from the environment variables a
//! provider file names (AWS's standard ones by default) when the provider
//! is built, and a POST signed with them by [`super::sigv4`].
//!
//! Credentials are not refreshed: temporary ones that expire fail their
//! calls (`ExpiredTokenException`, `unauthorized`) until the server is
//! restarted with new ones.

use super::config::{ProviderConfig, ProviderConfigError, Secret};
use super::sigv4::{self, Credentials, Scope};
use std::time::SystemTime;

/// The AWS credentials from the variables this file names (or AWS's
/// standard ones): an access key id and secret are required, a session
/// token is used when its variable is set. Errors name the variable,
/// never its value.
pub fn credentials_of(config: &ProviderConfig) -> Result<Credentials, ProviderConfigError> {
    let var_of = |given: &Option<String>, standard: &str| {
        given.clone().unwrap_or_else(|| standard.to_string())
    };
    let read = |var: &str| match std::env::var(var) {
        Ok(value) if !value.is_empty() => Some(value),
        _ => None,
    };
    let required = |field: &'static str, var: String| {
        read(&var).ok_or(ProviderConfigError::MissingCredential {
            path: config.source.clone(),
            field,
            var,
        })
    };
    let access_key_id = required(
        "access_key_id_env",
        var_of(&config.access_key_id_env, "AWS_ACCESS_KEY_ID"),
    )?;
    let secret = required(
        "secret_access_key_env",
        var_of(&config.secret_access_key_env, "AWS_SECRET_ACCESS_KEY"),
    )?;
    let token_var = var_of(&config.session_token_env, "AWS_SESSION_TOKEN");
    let session_token = match read(&token_var) {
        Some(token) => Some(Secret::new(token)),
        // A variable the file names must hold a token; AWS's standard
        // one is optional (long-term keys have none).
        None if config.session_token_env.is_some() => {
            return Err(ProviderConfigError::MissingCredential {
                path: config.source.clone(),
                field: "session_token_env",
                var: token_var,
            })
        }
        None => None,
    };
    Ok(Credentials {
        access_key_id,
        secret_access_key: Secret::new(secret),
        session_token,
    })
}

/// A POST of the JSON `body` to `url`, signed for `scope` at the current
/// time: `content-type`, `host`, `x-amz-content-sha256`, `x-amz-date` and,
/// with a session token, `x-amz-security-token` are signed. The path is
/// signed as it is sent (already percent-encoded). `Err` says why `url`
/// cannot be signed.
pub fn signed_post(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    credentials: &Credentials,
    scope: Scope<'_>,
) -> Result<reqwest::RequestBuilder, String> {
    let url = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {url}: {e}"))?;
    // The Host header reqwest sends: the port only when it is not the default.
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return Err(format!("no host in {url}")),
    };
    let payload_hash = sigv4::payload_hash(&body);
    let amz_date = sigv4::amz_date(SystemTime::now());
    let mut headers = vec![
        ("content-type", "application/json"),
        ("host", host.as_str()),
        ("x-amz-content-sha256", payload_hash.as_str()),
        ("x-amz-date", amz_date.as_str()),
    ];
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token", token.expose()));
    }
    let request = sigv4::Request {
        method: "POST",
        path: url.path(),
        query: &[],
        headers: &headers,
        payload_hash: &payload_hash,
    };
    let signature = sigv4::sign(&request, credentials, scope, &amz_date);
    let mut builder = client.post(url.clone());
    for (name, value) in headers.iter().filter(|(name, _)| *name != "host") {
        builder = builder.header(*name, *value);
    }
    Ok(builder
        .header("authorization", signature.authorization)
        .body(body))
}
