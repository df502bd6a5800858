//! Standard Webhooks signing: a secret is `whsec_` and base64 of 24 random
//! bytes; a signature is `v1,` and base64 of HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}` with the decoded secret.
//! Several signatures (during a rotation's grace period) are separated by
//! spaces in one `webhook-signature` header.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

pub const SECRET_PREFIX: &str = "whsec_";

/// A fresh signing secret.
pub fn new_secret() -> Option<String> {
    let mut bytes = [0u8; 24];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes)))
}

/// `v1,<signature>` of one message with one secret; `None` when the secret
/// is not `whsec_` and base64.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Option<String> {
    let key_bytes = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .ok()?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, &key_bytes);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(id.as_bytes());
    ctx.update(b".");
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body.as_bytes());
    Some(format!("v1,{}", STANDARD.encode(ctx.sign().as_ref())))
}

/// The `webhook-signature` header: one signature per secret, space-separated.
pub fn signature_header(
    secrets: &[String],
    id: &str,
    timestamp: i64,
    body: &str,
) -> Option<String> {
    let signatures: Option<Vec<String>> = secrets
        .iter()
        .map(|s| sign(s, id, timestamp, body))
        .collect();
    Some(signatures?.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries (their test vector).
    #[test]
    fn signs_the_reference_example() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, id, 1614265330, body).unwrap(),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn two_secrets_give_two_signatures() {
        let a = new_secret().unwrap();
        let b = new_secret().unwrap();
        assert!(a.starts_with("whsec_") && a != b);
        let header = signature_header(&[a.clone(), b.clone()], "msg_1", 5, "{}").unwrap();
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&a, "msg_1", 5, "{}").unwrap());
        assert_eq!(parts[1], sign(&b, "msg_1", 5, "{}").unwrap());
        assert_eq!(sign("whsec_***", "m", 1, ""), None);
    }
}
