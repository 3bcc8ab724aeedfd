//! What the user named: a URL of an object (`https://host/model.pte`, `s3://bucket/key`,
//! `gs://`, `az://`, ...) rather than a local path, and how it is shown.
//!
//! Invariant: `shown` never holds a secret of the URL (a user name and password, a query
//! string such as a pre-signed URL's signature, a fragment): it is what logs, errors, the
//! tree's JSON, the `user.ptefs.file` xattr and the mount table show; `scrub` removes
//! those secrets from any other text (an error of the HTTP client that quotes the URL).

use url::Url;

/// The schemes read as remote objects; anything else is a local path.
const SCHEMES: &[&str] = &[
    "http", "https", "s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss",
];

/// A remote object's URL.
#[derive(Clone)]
pub struct Address {
    pub url: Url,
    /// The URL without user information, query or fragment.
    pub shown: String,
    /// The parts of the URL that must not be shown.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// Whether `name` is a URL of a remote object (a scheme ptefs reads remotely, then `://`).
pub fn is_remote(name: &str) -> bool {
    name.split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

impl Address {
    /// Parses `name`, which `is_remote` accepted; the error says what is wrong without
    /// quoting the URL's secrets.
    pub fn parse(name: &str) -> Result<Address, String> {
        let url = Url::parse(name).map_err(|e| format!("not a valid URL ({e})"))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!(
                "{}:// needs a host or bucket after the scheme",
                url.scheme()
            ));
        }
        let mut secrets = Vec::new();
        if let Some(p) = url.password() {
            secrets.push(p.to_string());
        }
        if !url.username().is_empty() {
            secrets.push(url.username().to_string());
        }
        if let Some(q) = url.query().filter(|q| !q.is_empty()) {
            secrets.push(q.to_string());
        }
        if let Some(f) = url.fragment().filter(|f| !f.is_empty()) {
            secrets.push(f.to_string());
        }
        let mut clean = url.clone();
        let _ = clean.set_username("");
        let _ = clean.set_password(None);
        clean.set_query(None);
        clean.set_fragment(None);
        // Longest first, so a secret containing another is removed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Ok(Address {
            shown: clean.to_string(),
            url,
            secrets,
        })
    }

    /// Whether the URL is read over plain HTTP(S) (any other scheme is an object store's).
    pub fn is_http(&self) -> bool {
        matches!(self.url.scheme(), "http" | "https")
    }

    /// `text` without any secret of the URL.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            // Also as the URL encodes it, in case the text quotes the parsed URL.
            for form in [s.clone(), percent_encoded(s)] {
                if !form.is_empty() && out.contains(&form) {
                    out = out.replace(&form, "<redacted>");
                }
            }
        }
        out
    }

    /// The last segment of the path (the object's file name), or `model`.
    pub fn file_name(&self) -> String {
        self.url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .filter(|s| !s.is_empty())
            .map(|s| {
                percent_decode(s)
                    .replace('/', "_")
                    .trim_start_matches('.')
                    .to_string()
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "model".to_string())
    }
}

fn percent_encoded(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names_are_urls_of_known_schemes() {
        assert!(is_remote("https://host/m.pte"));
        assert!(is_remote("S3://bucket/key.pte"));
        assert!(is_remote("gs://b/k"));
        assert!(!is_remote("model.pte"));
        assert!(!is_remote("/tmp/https://x"));
        assert!(!is_remote("file:///tmp/m.pte"));
        assert!(!is_remote("ftp://host/m.pte"));
    }

    #[test]
    fn the_shown_url_holds_no_secret_and_scrub_removes_them() {
        let a = Address::parse(
            "https://alice:s3cr3t@host:8443/dir/model.pte?X-Amz-Signature=abc123&X-Amz-Credential=AKIA#frag",
        )
        .unwrap();
        assert_eq!(a.shown, "https://host:8443/dir/model.pte");
        assert_eq!(a.file_name(), "model.pte");
        let err = format!("error sending request for url ({})", a.url);
        let scrubbed = a.scrub(&err);
        for secret in ["s3cr3t", "alice", "abc123", "AKIA", "frag"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("host:8443/dir/model.pte"), "{scrubbed}");
    }

    #[test]
    fn bad_urls_are_refused_saying_why() {
        assert!(Address::parse("s3:///key").unwrap_err().contains("bucket"));
        assert!(Address::parse("https://").is_err());
    }

    #[test]
    fn file_names_are_decoded_and_never_hidden_or_empty() {
        let name = |u: &str| Address::parse(u).unwrap().file_name();
        assert_eq!(name("https://h/a/my%20model.pte"), "my model.pte");
        assert_eq!(name("https://h/a/"), "model");
        assert_eq!(name("https://h/.x.pte"), "x.pte");
        assert_eq!(name("s3://bucket/k/m.ptd"), "m.ptd");
    }
}
