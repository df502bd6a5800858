//! `onejob webhooks keygen|create|list|delete|rotate|deliveries|redeliver`:
//! the actions of `/v1/webhooks`, as the admin, straight on the database
//! (the same [`crate::webhooks::endpoints`] calls). A running server sends
//! a redelivery at its next poll.

use super::providers::table;
use super::{open_existing_store, open_store, DbArgs};
use crate::clock::{rfc3339, Clock, SystemClock};
use crate::domain::OwnerId;
use crate::webhooks::endpoints::{check_new_endpoint, Actor, NewEndpoint, WebhookError, Webhooks};
use crate::webhooks::secrets::SecretKey;
use std::sync::LazyLock;

/// The CLI acts as the admin: every owner's endpoints.
fn admin() -> Actor<'static> {
    static NO_OWNER: LazyLock<OwnerId> = LazyLock::new(|| OwnerId::from(""));
    Actor {
        owner_id: &NO_OWNER,
        is_admin: true,
    }
}

/// The configured store and webhook settings, for one command.
struct Opened {
    config: crate::config::Config,
    store: std::sync::Arc<dyn crate::store::Store>,
}

impl Opened {
    /// For a command that reads, or acts on an endpoint or delivery by its
    /// id: the database must exist ([`open_existing_store`]).
    async fn new(db: &DbArgs) -> anyhow::Result<Self> {
        Self::existing(db.load(None)?).await
    }

    async fn existing(config: crate::config::Config) -> anyhow::Result<Self> {
        let store = open_existing_store(&config).await?;
        Ok(Opened { config, store })
    }

    /// For `create`: a new SQLite file is made.
    async fn of(config: crate::config::Config) -> anyhow::Result<Self> {
        let store = open_store(&config).await?;
        Ok(Opened { config, store })
    }

    fn hooks(&self) -> Webhooks<'_> {
        Webhooks {
            store: self.store.as_ref(),
            clock: &SystemClock,
            config: &self.config.webhooks,
            key: self.config.webhook_key.as_ref(),
        }
    }

    /// Commit and close, then hand back what the command did.
    async fn close<T, E>(self, result: Result<T, E>) -> Result<T, E> {
        self.store.close().await;
        result
    }
}

/// `onejob webhooks keygen`: a fresh key for `$ONEJOB_WEBHOOK_KEY`, alone on stdout.
pub fn keygen() -> anyhow::Result<()> {
    println!("{}", SecretKey::generate()?);
    Ok(())
}

/// `onejob webhooks create --owner NAME --url URL [--event TYPE]… [--description TEXT]`;
/// the secret alone on the last line.
pub async fn create(
    db: &DbArgs,
    owner: &OwnerId,
    url: &str,
    events: Vec<String>,
    description: Option<String>,
) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let new = NewEndpoint {
        url: url.to_string(),
        events: (!events.is_empty()).then_some(events),
        description,
        owner: Some(owner.clone()),
    };
    // Refused as `create` refuses it, by the same checks, before the
    // database is opened (or, new, created).
    refuse_without_key(&config)?;
    check_new_endpoint(admin(), &new, config.webhooks.allow_private_networks)?;
    let opened = Opened::of(config).await?;
    let created = opened.hooks().create(admin(), new).await;
    let (endpoint, secret) = opened.close(created).await?;
    println!(
        "created webhook endpoint {} for owner {} ({}); its secret is shown once, store it now:",
        endpoint.id,
        endpoint.owner_id,
        endpoint.event_types().join(", ")
    );
    println!("{secret}");
    Ok(())
}

/// A new secret is stored encrypted: without the key, `create` and
/// `rotate` refuse, whatever the database holds.
fn refuse_without_key(config: &crate::config::Config) -> Result<(), WebhookError> {
    match config.webhook_key {
        Some(_) => Ok(()),
        None => Err(WebhookError::NoKey(config.webhooks.secret_key_env.clone())),
    }
}

/// `onejob webhooks list [--owner NAME]`: what `GET /v1/webhooks` shows but
/// the times of the last change and of a rotation's grace (`-`: no
/// description; a line break in one is written `\n`, as in every table).
pub async fn list(db: &DbArgs, owner: Option<&OwnerId>) -> anyhow::Result<()> {
    let opened = Opened::new(db).await?;
    let listed = opened.hooks().list(admin(), owner).await;
    let endpoints = opened.close(listed).await?;
    let mut rows = vec![[
        "OWNER",
        "ID",
        "ENABLED",
        "EVENTS",
        "CREATED",
        "URL",
        "DESCRIPTION",
    ]
    .map(String::from)];
    for e in endpoints {
        rows.push([
            e.owner_id.to_string(),
            e.id.clone(),
            match (&e.enabled, &e.disabled_reason) {
                (true, _) => "yes".to_string(),
                (false, Some(why)) => format!("no ({why})"),
                (false, None) => "no".to_string(),
            },
            e.event_types().join(","),
            rfc3339(e.created_at),
            e.url.clone(),
            match e.description.as_str() {
                "" => "-".to_string(),
                text => text.to_string(),
            },
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// `onejob webhooks delete ID`.
pub async fn delete(db: &DbArgs, id: &str) -> anyhow::Result<()> {
    let opened = Opened::new(db).await?;
    let deleted = opened.hooks().delete(admin(), id).await;
    opened.close(deleted).await?;
    println!("webhook endpoint {id} deleted, with its deliveries");
    Ok(())
}

/// `onejob webhooks rotate ID`; the new secret alone on the last line.
pub async fn rotate(db: &DbArgs, id: &str) -> anyhow::Result<()> {
    let config = db.load(None)?;
    refuse_without_key(&config)?;
    let opened = Opened::existing(config).await?;
    let rotated = opened.hooks().rotate(admin(), id).await;
    let (endpoint, secret) = opened.close(rotated).await?;
    println!(
        "rotated the secret of webhook endpoint {}; the old one signs too until {}. The new one, shown once:",
        endpoint.id,
        endpoint
            .previous_secret_until
            .map(rfc3339)
            .unwrap_or_else(|| "now".into())
    );
    println!("{secret}");
    Ok(())
}

/// `onejob webhooks deliveries ID [--limit N]`: newest first, with each try.
pub async fn deliveries(db: &DbArgs, id: &str, limit: i64) -> anyhow::Result<()> {
    let opened = Opened::new(db).await?;
    let listed = opened.hooks().deliveries(admin(), id, limit).await;
    let rows = opened.close(listed).await?;
    let now = SystemClock.now_ms();
    let mut out = vec![[
        "DELIVERY", "TYPE", "JOB", "STATE", "TRIES", "CREATED", "LAST",
    ]
    .map(String::from)];
    for (d, tries) in &rows {
        let last = tries.last().map_or_else(
            || match d.state {
                crate::store::webhooks::DeliveryState::Pending if d.next_attempt_at > now => {
                    format!("next try {}", rfc3339(d.next_attempt_at))
                }
                _ => "-".to_string(),
            },
            |t| {
                format!(
                    "{} in {} ms{}",
                    t.status.map_or("no answer".to_string(), |s| s.to_string()),
                    t.latency_ms,
                    t.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            },
        );
        out.push([
            d.id.clone(),
            d.event_type.clone(),
            d.job_id.to_string(),
            d.state.as_str().to_string(),
            d.tries.to_string(),
            rfc3339(d.created_at),
            last,
        ]);
    }
    print!("{}", table(&out));
    Ok(())
}

/// `onejob webhooks redeliver ENDPOINT_ID DELIVERY_ID`.
pub async fn redeliver(db: &DbArgs, endpoint_id: &str, delivery_id: &str) -> anyhow::Result<()> {
    let opened = Opened::new(db).await?;
    let redelivered = opened
        .hooks()
        .redeliver(admin(), endpoint_id, delivery_id)
        .await;
    let (d, _) = opened.close(redelivered).await?;
    println!(
        "delivery {} ({} of job {}) is pending again; a running server sends it with the same webhook-id",
        d.id, d.event_type, d.job_id
    );
    Ok(())
}
