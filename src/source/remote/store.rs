//! The object behind a URL, through Apache Arrow's `object_store`: its store (HTTP(S), S3,
//! GCS, Azure), configured from the standard environment, what it was when it was opened
//! (size, ETag, Last-Modified), and ranged reads of it that are checked against that.
//!
//! Invariants: every ranged read asks for `If-Match` on the ETag it was opened with, and
//! its answer is refused unless it is a partial response of exactly the range asked for, of
//! an object of the same size and ETag; a body is read into a buffer of the range's length
//! and no more (a server that sends more is refused, one that sends less is an error), so
//! memory never depends on what a server claims. Errors never quote a secret of the URL.
//! See docs/remote.md#faults.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt,
    ObjectStoreScheme, RetryConfig,
};

use super::address::Address;
use super::Settings;

/// What a read of the object found wrong, apart from the network.
#[derive(Debug)]
pub enum FetchError {
    /// The object is no longer the one that was opened (its ETag or size changed).
    Changed(String),
    /// Anything else, already described (and scrubbed of secrets).
    Failed(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Changed(m) | FetchError::Failed(m) => f.write_str(m),
        }
    }
}

/// The object as it was when it was opened: reads are checked against it, and the cache
/// keys its blocks by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    pub etag: Option<String>,
    pub last_modified: String,
}

impl Version {
    /// One line naming this version; cached blocks carry it and are used only for it.
    pub fn key(&self, shown: &str) -> String {
        format!(
            "{shown}\nsize {}\netag {}\nlast-modified {}",
            self.size,
            self.etag.as_deref().unwrap_or("-"),
            self.last_modified
        )
    }
}

/// An object store and the path of the object in it.
pub struct Object {
    pub address: Address,
    store: Arc<dyn ObjectStore>,
    path: StorePath,
}

/// The client settings every store gets: timeouts, retries with backoff, plain HTTP only
/// where the URL (or the configured endpoint) asks for it.
fn client_options(settings: &Settings, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_allow_http(allow_http)
        .with_connect_timeout(settings.timeout.min(Duration::from_secs(10)))
        // A stalled body times out between two reads; a whole request only after a long
        // while (a large block on a slow link is no fault).
        .with_read_timeout(settings.timeout)
        .with_timeout(settings.timeout.saturating_mul(20))
}

fn retry_config(settings: &Settings) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: settings.retries,
        retry_timeout: settings.timeout.saturating_mul(4),
    }
}

/// Whether the endpoint the environment configures for `prefix` (`AWS_ENDPOINT_URL`, ...)
/// is plain HTTP (a local S3 server, for one).
fn endpoint_is_http(vars: &[&str]) -> bool {
    vars.iter().any(|v| {
        std::env::var(v).is_ok_and(|e| e.trim().to_ascii_lowercase().starts_with("http://"))
    })
}

/// Makes `object_store`'s TLS use ring (once per process).
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Object {
    /// The store of `address`: plain HTTP(S) for `http(s)://` (the whole URL, query
    /// included, is what is fetched), else the object store of its scheme, configured from
    /// the standard environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`).
    pub fn new(address: Address, settings: &Settings) -> Result<Object, String> {
        install_tls_provider();
        let scrub = |e: object_store::Error| address.scrub(&e.to_string());
        let retry = retry_config(settings);
        let (store, path): (Arc<dyn ObjectStore>, StorePath) = if address.is_http() {
            let store = object_store::http::HttpBuilder::new()
                .with_url(address.url.as_str())
                .with_client_options(client_options(settings, address.url.scheme() == "http"))
                .with_retry(retry)
                .build()
                .map_err(scrub)?;
            (Arc::new(store), StorePath::default())
        } else {
            let (scheme, path) = ObjectStoreScheme::parse(&address.url)
                .map_err(|e| address.scrub(&e.to_string()))?;
            let url = address.url.as_str();
            let store: Arc<dyn ObjectStore> = match scheme {
                ObjectStoreScheme::AmazonS3 => Arc::new(
                    object_store::aws::AmazonS3Builder::from_env()
                        .with_url(url)
                        .with_client_options(client_options(
                            settings,
                            endpoint_is_http(&["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]),
                        ))
                        .with_retry(retry)
                        .build()
                        .map_err(scrub)?,
                ),
                ObjectStoreScheme::GoogleCloudStorage => Arc::new(
                    object_store::gcp::GoogleCloudStorageBuilder::from_env()
                        .with_url(url)
                        .with_client_options(client_options(settings, false))
                        .with_retry(retry)
                        .build()
                        .map_err(scrub)?,
                ),
                ObjectStoreScheme::MicrosoftAzure => Arc::new(
                    object_store::azure::MicrosoftAzureBuilder::from_env()
                        .with_url(url)
                        .with_client_options(client_options(
                            settings,
                            endpoint_is_http(&["AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"]),
                        ))
                        .with_retry(retry)
                        .build()
                        .map_err(scrub)?,
                ),
                other => return Err(format!("{other:?} URLs are not read remotely")),
            };
            (store, path)
        };
        Ok(Object {
            address,
            store,
            path,
        })
    }

    /// The object's size, ETag and Last-Modified, as the store reports them now.
    pub async fn head(&self) -> Result<Version, String> {
        let meta = self
            .store
            .head(&self.path)
            .await
            .map_err(|e| self.describe(&e))?;
        Ok(Version {
            size: meta.size,
            etag: meta.e_tag,
            last_modified: meta.last_modified.to_rfc3339(),
        })
    }

    /// The object's first `n` bytes (fewer when it is shorter) and its version, from one
    /// ranged request: opening a file whose header and flatbuffer fit costs one request.
    /// `None` when the store would not answer that way (an empty object): then `head`.
    pub async fn first(&self, n: u64) -> Result<Option<(Version, Bytes)>, String> {
        let options = GetOptions {
            range: Some(GetRange::Bounded(0..n)),
            ..Default::default()
        };
        let result = match self.store.get_opts(&self.path, options).await {
            Ok(r) => r,
            // A store that cannot answer this range (an empty object: 416; a server without
            // ranges) is asked for the size alone; any other failure is the answer.
            Err(e) => {
                let why = self.describe(&e);
                if matches!(e, object_store::Error::NotSupported { .. }) || why.contains("416") {
                    log::debug!("{}: {why}; asking for its size", self.address.shown);
                    return Ok(None);
                }
                return Err(format!("bytes 0..{n}: {why}"));
            }
        };
        let version = Version {
            size: result.meta.size,
            etag: result.meta.e_tag.clone(),
            last_modified: result.meta.last_modified.to_rfc3339(),
        };
        if result.range.start != 0 || result.range.end > n.min(version.size) {
            return Err(format!(
                "the server answered bytes {}..{} for bytes 0..{n}",
                result.range.start, result.range.end
            ));
        }
        let want = result.range.end;
        let bytes = self
            .body(result, want)
            .await
            .map_err(|e| format!("bytes 0..{want}: {e}"))?;
        Ok(Some((version, bytes)))
    }

    /// Bytes `range` of the object, which must still be `version`: read into a buffer of
    /// exactly the range's length.
    pub async fn fetch(&self, range: Range<u64>, version: &Version) -> Result<Bytes, FetchError> {
        let want = range.end - range.start;
        let options = GetOptions {
            if_match: version.etag.clone(),
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let result = match self.store.get_opts(&self.path, options).await {
            Ok(r) => r,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(self.changed("its ETag no longer matches"))
            }
            Err(e) => return Err(FetchError::Failed(self.describe(&e))),
        };
        if result.meta.size != version.size {
            return Err(self.changed(&format!(
                "it is now {} bytes, it was {}",
                result.meta.size, version.size
            )));
        }
        if let (Some(now), Some(was)) = (&result.meta.e_tag, &version.etag) {
            if now != was {
                return Err(self.changed(&format!("its ETag is now {now}, it was {was}")));
            }
        }
        if result.range != range {
            return Err(FetchError::Failed(format!(
                "the server answered bytes {}..{} for bytes {}..{}",
                result.range.start, result.range.end, range.start, range.end
            )));
        }
        self.body(result, want).await
    }

    /// The body of `result`, which must be `want` bytes: read into a buffer of that size.
    async fn body(&self, result: object_store::GetResult, want: u64) -> Result<Bytes, FetchError> {
        let capacity = usize::try_from(want)
            .map_err(|_| FetchError::Failed(format!("a range of {want} bytes")))?;
        let mut buf = BytesMut::with_capacity(capacity);
        let mut stream = result.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| FetchError::Failed(self.describe(&e)))?;
            if buf.len() + chunk.len() > capacity {
                return Err(FetchError::Failed(format!(
                    "the server sent more than the {want} bytes asked for"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        if buf.len() != capacity {
            return Err(FetchError::Failed(format!(
                "the response ended after {} of {want} bytes",
                buf.len()
            )));
        }
        Ok(buf.freeze())
    }

    fn changed(&self, why: &str) -> FetchError {
        FetchError::Changed(format!(
            "{} changed on the server since it was mounted ({why}): its bytes are no longer read; remount it",
            self.address.shown
        ))
    }

    /// An error of the store, with its causes, without the URL's secrets.
    fn describe(&self, e: &object_store::Error) -> String {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        let mut depth = 0;
        while let Some(s) = source {
            let more = s.to_string();
            if !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            source = s.source();
            depth += 1;
            if depth > 8 {
                break;
            }
        }
        self.address.scrub(&text)
    }
}
