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
            DatabaseUrl::Postgres(u) => f.write_str(&redacted(u)),
        }
    }
}

/// `url` with nothing a password may hide in: the user information before
/// the host, and the value of any query parameter whose name says
/// `password` (libpq takes `?password=…` too).
fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let start = scheme_end + 3;
    let (main, query) = match url[start..].find('?') {
        Some(q) => url.split_at(start + q),
        None => (url, ""),
    };
    let host_end = main[start..].find('/').map_or(main.len(), |i| start + i);
    let mut out = String::with_capacity(url.len());
    match main[start..host_end].rfind('@') {
        Some(at) => {
            out.push_str(&main[..start]);
            out.push_str("***");
            out.push_str(&main[start + at..]);
        }
        None => out.push_str(main),
    }
    if let Some(query) = query.strip_prefix('?') {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if name.to_ascii_lowercase().contains("password") => {
                    format!("{name}=***")
                }
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
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
        for (url, shown) in [
            (
                "postgres://u@127.0.0.1:1/db?password=secret&sslmode=disable",
                "postgres://***@127.0.0.1:1/db?password=***&sslmode=disable",
            ),
            (
                "postgresql://h/db?sslmode=require&sslpassword=secret",
                "postgresql://h/db?sslmode=require&sslpassword=***",
            ),
            ("postgres://h/db?user=u@x", "postgres://h/db?user=u@x"),
            ("postgres://h/db", "postgres://h/db"),
        ] {
            let printed = DatabaseUrl::parse(url).unwrap().to_string();
            assert_eq!(printed, shown);
            assert!(!printed.contains("secret"), "{printed}");
        }
    }
}
