//! Webhook secrets at rest. A signing secret must be usable to sign, so it
//! cannot be hashed as API keys are: it is sealed with AES-256-GCM under a
//! key that lives only in the environment (the variable `[webhooks]
//! secret_key_env` names, base64 of 32 bytes), never in the database or a
//! file. The endpoint's id is the associated data, so a sealed secret
//! copied onto another endpoint's row does not open. A database dump alone
//! reveals no secret.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// The stored form's version prefix.
const SEALED_PREFIX: &str = "v1:";

/// The key secrets are sealed with. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct SecretKey([u8; 32]);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(…)")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("no webhook key is set; the server cannot sign")]
    NoKey,
    #[error("the stored secret does not open with this key (was the key changed?)")]
    Unreadable,
    #[error("the system random source failed")]
    Random,
}

impl SecretKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        SecretKey(bytes)
    }

    /// Parse base64 of exactly 32 bytes.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| "is not base64".to_string())?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| format!("is {} bytes, not 32", b.len()))?;
        Ok(SecretKey(key))
    }

    /// The key in variable `name`: `None` when it is unset or empty; an
    /// error (naming the variable, never its value) when it is malformed.
    pub fn from_env(name: &str) -> Result<Option<Self>, String> {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => SecretKey::parse(&v).map(Some).map_err(|why| {
                format!("webhooks: the key in ${name} {why}; expected base64 of 32 bytes")
            }),
            _ => Ok(None),
        }
    }

    /// A fresh random key, base64 (what `onejob webhooks keygen` prints).
    pub fn generate() -> Result<String, SecretError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SecretError::Random)?;
        Ok(STANDARD.encode(bytes))
    }

    fn aead(&self) -> Result<LessSafeKey, SecretError> {
        UnboundKey::new(&AES_256_GCM, &self.0)
            .map(LessSafeKey::new)
            .map_err(|_| SecretError::Unreadable)
    }

    /// `secret` sealed for endpoint `endpoint_id`: `v1:` and base64 of
    /// nonce, ciphertext and tag.
    pub fn seal(&self, endpoint_id: &str, secret: &str) -> Result<String, SecretError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretError::Random)?;
        let mut in_out = secret.as_bytes().to_vec();
        self.aead()?
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(endpoint_id.as_bytes()),
                &mut in_out,
            )
            .map_err(|_| SecretError::Unreadable)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&in_out);
        Ok(format!("{SEALED_PREFIX}{}", STANDARD.encode(out)))
    }

    /// The secret `sealed` holds, if it was sealed with this key for this endpoint.
    pub fn open(&self, endpoint_id: &str, sealed: &str) -> Result<String, SecretError> {
        let raw = sealed
            .strip_prefix(SEALED_PREFIX)
            .and_then(|b| STANDARD.decode(b).ok())
            .filter(|b| b.len() > NONCE_LEN)
            .ok_or(SecretError::Unreadable)?;
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SecretError::Unreadable)?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .aead()?
            .open_in_place(nonce, Aad::from(endpoint_id.as_bytes()), &mut in_out)
            .map_err(|_| SecretError::Unreadable)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SecretError::Unreadable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_for_its_endpoint_and_key() {
        let key = SecretKey::from_bytes([7; 32]);
        let sealed = key.seal("wh_1", "whsec_abc").unwrap();
        assert!(sealed.starts_with("v1:"));
        assert!(!sealed.contains("whsec_abc"));
        assert_eq!(key.open("wh_1", &sealed).unwrap(), "whsec_abc");
        assert_eq!(key.open("wh_2", &sealed), Err(SecretError::Unreadable));
        let other = SecretKey::from_bytes([8; 32]);
        assert_eq!(other.open("wh_1", &sealed), Err(SecretError::Unreadable));
        // Two seals of one secret differ (a fresh nonce each).
        assert_ne!(key.seal("wh_1", "whsec_abc").unwrap(), sealed);
    }

    #[test]
    fn a_key_is_base64_of_32_bytes_and_never_printed() {
        let text = SecretKey::generate().unwrap();
        let key = SecretKey::parse(&text).unwrap();
        assert_eq!(format!("{key:?}"), "SecretKey(…)");
        assert!(SecretKey::parse("c2hvcnQ=").unwrap_err().contains("not 32"));
        assert!(SecretKey::parse("***").unwrap_err().contains("base64"));
    }
}
