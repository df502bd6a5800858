//! AWS Signature Version 4, by hand: the canonical request, the string to
//! sign, the derived key and the `Authorization` header, as AWS documents
//! them ("Create a signed AWS API request", IAM user guide) and checks them
//! in its published test suite (see the tests below).
//!
//! Only header signing is done (no presigned URLs). The path is
//! URI-encoded once more in the canonical request, as every service but S3
//! expects: a Bedrock model id's `:` is sent as `%3A` and signed as `%253A`.

use super::config::Secret;
use ring::{digest, hmac};

/// The algorithm named in the string to sign and the header.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An access key, its secret, and a session token when the credentials are
/// temporary (STS). The secret and token never show in `Debug`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// Where a signature is valid: the region and service of its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
}

/// A request to sign. `path` is the path as it is sent (already
/// percent-encoded); `query` holds decoded name/value pairs; `headers`
/// are every header to sign, `host` and `x-amz-date` included.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a [(&'a str, &'a str)],
    pub headers: &'a [(&'a str, &'a str)],
    /// Hex SHA-256 of the body (see [`payload_hash`]).
    pub payload_hash: &'a str,
}

/// Every intermediate of one signature, so a test can compare each with
/// what AWS publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub canonical_request: String,
    pub string_to_sign: String,
    pub signed_headers: String,
    pub signature: String,
    pub authorization: String,
}

/// Hex SHA-256 of `bytes`: the payload hash, and the canonical request's
/// hash in the string to sign.
pub fn payload_hash(bytes: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, bytes))
}

/// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters
/// (`A-Z a-z 0-9 - _ . ~`) kept, every other byte as `%XX`, upper case.
pub fn uri_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The canonical URI: each segment of the path as sent, encoded again.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".to_string();
    }
    path.split('/')
        .map(uri_encode)
        .collect::<Vec<_>>()
        .join("/")
}

fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Header names lower-cased and sorted, values trimmed with inner runs of
/// spaces collapsed, repeated names joined by commas in order.
fn canonical_headers(headers: &[(&str, &str)]) -> (String, String) {
    let mut sorted: Vec<(String, String)> = Vec::new();
    for (name, value) in headers {
        let name = name.trim().to_ascii_lowercase();
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        match sorted.iter_mut().find(|(n, _)| *n == name) {
            Some((_, existing)) => {
                existing.push(',');
                existing.push_str(&value);
            }
            None => sorted.push((name, value)),
        }
    }
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let canonical: String = sorted.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed = sorted
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    (canonical, signed)
}

fn hmac_sha256(key: &[u8], data: &str) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
}

/// `kSigning`: the secret, HMAC'd with the date, region, service and
/// `aws4_request` in turn.
fn signing_key(secret: &str, date: &str, scope: Scope<'_>) -> hmac::Tag {
    let k_date = hmac_sha256(format!("AWS4{secret}").as_bytes(), date);
    let k_region = hmac_sha256(k_date.as_ref(), scope.region);
    let k_service = hmac_sha256(k_region.as_ref(), scope.service);
    hmac_sha256(k_service.as_ref(), "aws4_request")
}

/// Sign `request` at `amz_date` (`YYYYMMDDTHHMMSSZ`, the value of its
/// `x-amz-date` header).
pub fn sign(
    request: &Request<'_>,
    credentials: &Credentials,
    scope: Scope<'_>,
    amz_date: &str,
) -> Signature {
    let (headers, signed_headers) = canonical_headers(request.headers);
    let canonical_request = format!(
        "{}\n{}\n{}\n{headers}\n{signed_headers}\n{}",
        request.method,
        canonical_uri(request.path),
        canonical_query(request.query),
        request.payload_hash
    );
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{credential_scope}\n{}",
        payload_hash(canonical_request.as_bytes())
    );
    let key = signing_key(credentials.secret_access_key.expose(), date, scope);
    let signature = hex::encode(hmac_sha256(key.as_ref(), &string_to_sign));
    let authorization = format!(
        "{ALGORITHM} Credential={}/{credential_scope}, SignedHeaders={signed_headers}, \
         Signature={signature}",
        credentials.access_key_id
    );
    Signature {
        canonical_request,
        string_to_sign,
        signed_headers,
        signature,
        authorization,
    }
}

/// `x-amz-date` for `time`: `YYYYMMDDTHHMMSSZ`, UTC.
pub fn amz_date(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace(['-', ':'], "")
}

#[cfg(test)]
mod tests {
    //! AWS's SigV4 test suite (`aws-sig-v4-test-suite`, published with the
    //! SigV4 documentation and shipped in botocore, aws-sdk-ruby's
    //! `aws-sigv4` and aws-c-auth): its credentials, scope and clock, and
    //! for each vector the canonical request, the string to sign and the
    //! signature it publishes. The expected values below are the suite's
    //! `.creq`/`.sts`/`.authz` files for `get-vanilla`, `post-vanilla`,
    //! `post-x-www-form-urlencoded` and `get-vanilla-with-session-token`.
    use super::*;

    const DATE: &str = "20150830T123600Z";
    const SCOPE: Scope<'static> = Scope {
        region: "us-east-1",
        service: "service",
    };
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    /// The session token the suite's `get-vanilla-with-session-token` uses.
    const TOKEN: &str = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";

    fn credentials() -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
            session_token: None,
        }
    }

    fn signed(method: &str, headers: &[(&str, &str)], payload: &str) -> Signature {
        let hash = payload_hash(payload.as_bytes());
        let request = Request {
            method,
            path: "/",
            query: &[],
            headers,
            payload_hash: &hash,
        };
        sign(&request, &credentials(), SCOPE, DATE)
    }

    fn authorization(signed_headers: &str, signature: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders={signed_headers}, Signature={signature}"
        )
    }

    #[test]
    fn get_vanilla() {
        let s = signed(
            "GET",
            &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
            "",
        );
        assert_eq!(
            s.canonical_request,
            format!(
                "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n\
                 host;x-amz-date\n{EMPTY}"
            )
        );
        assert_eq!(
            s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n\
             bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        assert_eq!(
            s.authorization,
            authorization(
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    #[test]
    fn post_vanilla() {
        let s = signed(
            "POST",
            &[("Host", "example.amazonaws.com"), ("X-Amz-Date", DATE)],
            "",
        );
        assert_eq!(
            s.authorization,
            authorization(
                "host;x-amz-date",
                "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
            )
        );
    }

    #[test]
    fn post_x_www_form_urlencoded() {
        let s = signed(
            "POST",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Host", "example.amazonaws.com"),
                ("X-Amz-Date", DATE),
            ],
            "Param1=value1",
        );
        assert_eq!(
            s.canonical_request,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\n\
             host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n\
             content-type;host;x-amz-date\n\
             9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
        assert_eq!(
            s.authorization,
            authorization(
                "content-type;host;x-amz-date",
                "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
            )
        );
    }

    #[test]
    fn get_vanilla_with_session_token() {
        let s = signed(
            "GET",
            &[
                ("Host", "example.amazonaws.com"),
                ("X-Amz-Date", DATE),
                ("X-Amz-Security-Token", TOKEN),
            ],
            "",
        );
        assert_eq!(
            s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n\
             067b36aa60031588cea4a4cde1f21215227a047690c72247f1d70b32fbbfad2b"
        );
        assert_eq!(
            s.authorization,
            authorization(
                "host;x-amz-date;x-amz-security-token",
                "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"
            )
        );
    }

    #[test]
    fn a_model_id_is_encoded_again_in_the_canonical_uri() {
        assert_eq!(
            canonical_uri("/model/us.anthropic.claude-3-5-sonnet-20241022-v2%3A0/converse"),
            "/model/us.anthropic.claude-3-5-sonnet-20241022-v2%253A0/converse"
        );
        assert_eq!(uri_encode("a b:c/é"), "a%20b%3Ac%2F%C3%A9");
    }

    #[test]
    fn amz_date_is_the_basic_iso_form() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160);
        assert_eq!(amz_date(t), DATE);
    }
}
