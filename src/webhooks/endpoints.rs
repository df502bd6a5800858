//! What an owner may do with its webhook endpoints, for the HTTP API and
//! the CLI alike: create (the secret shown once), list, delete, rotate the
//! secret, list deliveries with their tries, redeliver. An owner sees only
//! its own endpoints (another's is "not found"); the admin sees every
//! owner's. Ids and timestamps are made here; the store writes them.

use super::secrets::{SecretError, SecretKey};
use super::ssrf::check_url;
use super::{signing, WebhooksConfig, DEFAULT_EVENT_TYPES, EVENT_TYPES};
use crate::clock::Clock;
use crate::domain::OwnerId;
use crate::store::webhooks::{WebhookDelivery, WebhookEndpoint, WebhookTry};
use crate::store::{Store, StoreError};

/// Whose endpoints a call may touch.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub owner_id: &'a OwnerId,
    pub is_admin: bool,
}

impl Actor<'_> {
    fn may_see(&self, endpoint: &WebhookEndpoint) -> bool {
        self.is_admin || endpoint.owner_id == *self.owner_id
    }
}

/// The most deliveries one listing answers (`limit`, 1 to this).
pub const MAX_DELIVERIES_LISTED: i64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("the delivery is still pending; it is sent again by itself")]
    DeliveryPending,
    /// The owner has an endpoint with this URL already: a second would
    /// deliver every event twice, under two ids its receiver cannot match.
    #[error(
        "the owner already has endpoint {0} for this url; delete it first to register the url again"
    )]
    UrlTaken(String),
    #[error(
        "webhooks are not configured on this server: set ${0} to a key (base64 of 32 bytes; \
         `onejob webhooks keygen` prints one) so secrets can be stored encrypted"
    )]
    NoKey(String),
    #[error(transparent)]
    Secret(SecretError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What `POST /v1/webhooks` asks for.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEndpoint {
    pub url: String,
    #[serde(default)]
    pub events: Option<Vec<String>>,
    #[serde(default)]
    pub description: Option<String>,
    /// Admin only: the owner the endpoint is for (default: the caller).
    #[serde(default)]
    pub owner: Option<OwnerId>,
}

/// What a new endpoint is, checked: its owner, event types and description.
pub struct CheckedEndpoint {
    pub owner_id: OwnerId,
    pub events: Vec<String>,
    pub description: String,
}

/// Everything [`Webhooks::create`] refuses whatever the database holds (a
/// URL too long or that may not be called, an unknown event type, a
/// description too long or with a control character, an owner the actor
/// may not name): the one rule for the API, the console and the CLI, which
/// calls it before it opens (or, new, creates) the database.
pub fn check_new_endpoint(
    actor: Actor<'_>,
    new: &NewEndpoint,
    allow_private_networks: bool,
) -> Result<CheckedEndpoint, WebhookError> {
    if new.url.len() > MAX_URL {
        return Err(WebhookError::Invalid(format!(
            "url is longer than {MAX_URL} bytes"
        )));
    }
    // The parser would drop a tab or a line break and escape the rest:
    // what is stored and listed would not be what is called.
    if let Some(c) = new.url.chars().find(|c| c.is_control()) {
        return Err(WebhookError::Invalid(format!(
            "url {}",
            crate::domain::text::control_refusal(c)
        )));
    }
    check_url(&new.url, allow_private_networks)
        .map_err(|e| WebhookError::Invalid(e.to_string()))?;
    let events = match &new.events {
        None => DEFAULT_EVENT_TYPES.iter().map(|s| s.to_string()).collect(),
        Some(list) if list.is_empty() => {
            return Err(WebhookError::Invalid(
                "events must name at least one event type".to_string(),
            ))
        }
        Some(list) => {
            let mut events: Vec<String> = Vec::new();
            for e in list {
                if !EVENT_TYPES.contains(&e.as_str()) {
                    return Err(WebhookError::Invalid(format!(
                        "events: unknown event type {e:?}; known: {}",
                        EVENT_TYPES.join(", ")
                    )));
                }
                if !events.contains(e) {
                    events.push(e.clone());
                }
            }
            events
        }
    };
    let description = new.description.clone().unwrap_or_default();
    if description.chars().count() > MAX_DESCRIPTION {
        return Err(WebhookError::Invalid(format!(
            "description is longer than {MAX_DESCRIPTION} characters"
        )));
    }
    if let Some(problem) = crate::domain::text::typed_text_problem(&description) {
        return Err(WebhookError::Invalid(format!("description {problem}")));
    }
    let owner_id = match &new.owner {
        Some(owner) if actor.is_admin && !OwnerId::is_valid_name(owner) => {
            return Err(WebhookError::Invalid(format!(
                "owner must be {}",
                OwnerId::NAME_RULE
            )))
        }
        Some(owner) if actor.is_admin => owner.clone(),
        Some(_) if !actor.is_admin => {
            return Err(WebhookError::Invalid(
                "owner may be given by an admin key only".to_string(),
            ))
        }
        _ => actor.owner_id.clone(),
    };
    Ok(CheckedEndpoint {
        owner_id,
        events,
        description,
    })
}

/// The server-side pieces every action needs.
pub struct Webhooks<'a> {
    pub store: &'a dyn Store,
    pub clock: &'a dyn Clock,
    pub config: &'a WebhooksConfig,
    pub key: Option<&'a SecretKey>,
}

/// The longest description kept.
const MAX_DESCRIPTION: usize = 500;
/// The longest URL accepted.
const MAX_URL: usize = 2_048;

impl Webhooks<'_> {
    fn key(&self) -> Result<&SecretKey, WebhookError> {
        self.key
            .ok_or_else(|| WebhookError::NoKey(self.config.secret_key_env.clone()))
    }

    /// A new endpoint and its secret (`whsec_…`), which is shown only here.
    pub async fn create(
        &self,
        actor: Actor<'_>,
        new: NewEndpoint,
    ) -> Result<(WebhookEndpoint, String), WebhookError> {
        let key = self.key()?;
        let CheckedEndpoint {
            owner_id,
            events,
            description,
        } = check_new_endpoint(actor, &new, self.config.allow_private_networks)?;
        if let Some(taken) = self
            .store
            .list_webhook_endpoints(Some(&owner_id))
            .await?
            .into_iter()
            .find(|e| e.url == new.url)
        {
            return Err(WebhookError::UrlTaken(taken.id));
        }
        let id = format!("wh_{}", crate::domain::new_id());
        let secret = signing::new_secret().ok_or(WebhookError::Secret(SecretError::Random))?;
        let sealed = key.seal(&id, &secret).map_err(WebhookError::Secret)?;
        let now = self.clock.now_ms();
        let endpoint = WebhookEndpoint {
            id,
            owner_id,
            url: new.url,
            description,
            events: WebhookEndpoint::events_column(&events),
            secret: sealed,
            previous_secret: None,
            previous_secret_until: None,
            enabled: true,
            disabled_reason: None,
            created_at: now,
            updated_at: now,
        };
        self.store.insert_webhook_endpoint(endpoint.clone()).await?;
        Ok((endpoint, secret))
    }

    /// The caller's endpoints (the admin's: everyone's, or `owner`'s).
    pub async fn list(
        &self,
        actor: Actor<'_>,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<WebhookEndpoint>, WebhookError> {
        let owner = if actor.is_admin {
            owner
        } else {
            Some(actor.owner_id)
        };
        Ok(self.store.list_webhook_endpoints(owner).await?)
    }

    /// The endpoint, if the actor may see it.
    pub async fn get(&self, actor: Actor<'_>, id: &str) -> Result<WebhookEndpoint, WebhookError> {
        self.store
            .get_webhook_endpoint(id)
            .await?
            .filter(|e| actor.may_see(e))
            .ok_or(WebhookError::NotFound("webhook endpoint"))
    }

    pub async fn delete(&self, actor: Actor<'_>, id: &str) -> Result<(), WebhookError> {
        self.get(actor, id).await?;
        if self.store.delete_webhook_endpoint(id).await? {
            Ok(())
        } else {
            Err(WebhookError::NotFound("webhook endpoint"))
        }
    }

    /// A new secret, shown only here; the old one signs too until the grace
    /// period (`rotation_grace_ms`) ends.
    pub async fn rotate(
        &self,
        actor: Actor<'_>,
        id: &str,
    ) -> Result<(WebhookEndpoint, String), WebhookError> {
        let key = self.key()?;
        self.get(actor, id).await?;
        let secret = signing::new_secret().ok_or(WebhookError::Secret(SecretError::Random))?;
        let sealed = key.seal(id, &secret).map_err(WebhookError::Secret)?;
        let now = self.clock.now_ms();
        let until = now + self.config.rotation_grace_ms as i64;
        if !self
            .store
            .rotate_webhook_secret(id, &sealed, until, now)
            .await?
        {
            return Err(WebhookError::NotFound("webhook endpoint"));
        }
        Ok((self.get(actor, id).await?, secret))
    }

    /// The endpoint's deliveries, newest first, each with its tries.
    pub async fn deliveries(
        &self,
        actor: Actor<'_>,
        id: &str,
        limit: i64,
    ) -> Result<Vec<(WebhookDelivery, Vec<WebhookTry>)>, WebhookError> {
        if !(1..=MAX_DELIVERIES_LISTED).contains(&limit) {
            return Err(WebhookError::Invalid(format!(
                "limit: a whole number from 1 to {MAX_DELIVERIES_LISTED}"
            )));
        }
        self.get(actor, id).await?;
        let deliveries = self.store.list_webhook_deliveries(id, limit).await?;
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            let tries = self.store.list_webhook_tries(&d.id).await?;
            out.push((d, tries));
        }
        Ok(out)
    }

    /// Send a delivered or failed delivery again, now: the same
    /// `webhook-id` and body (receivers dedup by the id), a fresh budget.
    /// Answered as [`Webhooks::deliveries`] shows it: with the tries made
    /// so far, which `tries` counts (every try, before the redelivery too).
    pub async fn redeliver(
        &self,
        actor: Actor<'_>,
        endpoint_id: &str,
        delivery_id: &str,
    ) -> Result<(WebhookDelivery, Vec<WebhookTry>), WebhookError> {
        self.get(actor, endpoint_id).await?;
        let delivery = self
            .store
            .get_webhook_delivery(delivery_id)
            .await?
            .filter(|d| d.endpoint_id == endpoint_id)
            .ok_or(WebhookError::NotFound("webhook delivery"))?;
        if !self
            .store
            .redeliver_webhook(&delivery.id, self.clock.now_ms())
            .await?
        {
            return Err(WebhookError::DeliveryPending);
        }
        let delivery = self
            .store
            .get_webhook_delivery(delivery_id)
            .await?
            .ok_or(WebhookError::NotFound("webhook delivery"))?;
        let tries = self.store.list_webhook_tries(&delivery.id).await?;
        Ok((delivery, tries))
    }
}
