//! Which database a URL names. The store's own input, so that the store
//! needs nothing from [`config`](crate::config) (which re-exports it).

use std::path::PathBuf;

/// Which database, from a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    Sqlite(PathBuf),
    Postgres(String),
}

/// A URL that names no database this store opens.
#[derive(Debug, thiserror::Error)]
#[error("database URL {0:?}: expected postgres://…, sqlite://PATH or a file path")]
pub struct InvalidDatabaseUrl(pub String);

impl DatabaseUrl {
    pub fn parse(url: &str) -> Result<Self, InvalidDatabaseUrl> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(url.to_string()));
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        if path.is_empty() || path.contains("://") {
            return Err(InvalidDatabaseUrl(url.to_string()));
        }
        Ok(DatabaseUrl::Sqlite(PathBuf::from(path)))
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrl::Sqlite(p) => write!(f, "sqlite://{}", p.display()),
            // Never print a password that may be in the URL.
            DatabaseUrl::Postgres(u) => match (u.find("://"), u.rfind('@')) {
                (Some(s), Some(at)) if at > s => write!(f, "{}://***{}", &u[..s], &u[at..]),
                _ => f.write_str(u),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls() {
        assert_eq!(
            DatabaseUrl::parse("postgres://u:p@h/db").unwrap(),
            DatabaseUrl::Postgres("postgres://u:p@h/db".into())
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite://a/b.db").unwrap(),
            DatabaseUrl::Sqlite("a/b.db".into())
        );
        assert_eq!(
            DatabaseUrl::parse("x.db").unwrap(),
            DatabaseUrl::Sqlite("x.db".into())
        );
        assert!(DatabaseUrl::parse("mysql://x").is_err());
        assert_eq!(
            DatabaseUrl::parse("postgres://u:secret@h/db")
                .unwrap()
                .to_string(),
            "postgres://***@h/db"
        );
    }
}
