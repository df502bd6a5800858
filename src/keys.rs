//! API keys: random, shown once, stored only as a SHA-256 hash. Keys carry
//! 256 bits of randomness, so a fast hash is enough: there is nothing to
//! brute-force that a slow hash would protect.

use crate::clock::Clock;
use crate::domain::new_id;
use crate::store::{ApiKey, Store, StoreError};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Prefix that makes a leaked key recognisable to secret scanners.
pub const KEY_PREFIX: &str = "oj_";

/// Who is calling: the owner (tenant) of the key, never a header the client chooses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub owner_id: String,
    pub is_admin: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("owner name must be 1-128 characters of letters, digits, '-', '_', '.' or '@'")]
    InvalidOwner,
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn valid_owner(owner: &str) -> bool {
    (1..=128).contains(&owner.len())
        && owner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

/// Create a key for `owner` and return it; only its hash is stored.
pub async fn create_key(
    store: &dyn Store,
    clock: &dyn Clock,
    owner: &str,
    admin: bool,
) -> Result<String, KeyError> {
    if !valid_owner(owner) {
        return Err(KeyError::InvalidOwner);
    }
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let key = format!("{KEY_PREFIX}{}", hex::encode(secret));
    store
        .insert_api_key(ApiKey {
            id: new_id(),
            owner_id: owner.to_string(),
            key_hash: hash_key(&key),
            is_admin: admin,
            created_at: clock.now_ms(),
        })
        .await?;
    Ok(key)
}

/// The caller a presented key belongs to, if any.
pub async fn authenticate(
    store: &dyn Store,
    presented: &str,
) -> Result<Option<Caller>, StoreError> {
    if !presented.starts_with(KEY_PREFIX) || presented.len() > 256 {
        return Ok(None);
    }
    Ok(store
        .find_api_key(&hash_key(presented))
        .await?
        .map(|k| Caller {
            owner_id: k.owner_id,
            is_admin: k.is_admin,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_are_checked() {
        assert!(valid_owner("acme-prod"));
        assert!(!valid_owner(""));
        assert!(!valid_owner("a b"));
        assert!(!valid_owner(&"x".repeat(129)));
    }
}
