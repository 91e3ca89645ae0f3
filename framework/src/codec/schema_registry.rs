//! A Confluent-compatible schema registry: its configuration (validated at start-up, naming the
//! field at fault), one shared client with the schema caches, and the Confluent wire format (magic
//! byte `0`, then the schema id as 4 bytes big-endian, then the Avro body).
//!
//! Any registry speaking the Confluent REST API works: Confluent Schema Registry, Karapace, or
//! Apicurio under `/apis/ccompat/v7`. None is installable on the project's test machines, so the tests
//! use an in-process double (`docs/schema-registry.md` says why).
//!
//! ```
//! use millrace::codec::schema_registry::{SchemaRegistry, SchemaRegistryConfig};
//!
//! let config = SchemaRegistryConfig::new("https://registry.example.com").basic_auth("api-key", "secret");
//! let registry = SchemaRegistry::new(config).unwrap();
//!
//! let bad = SchemaRegistryConfig::new("registry.example.com"); // no scheme
//! let err = SchemaRegistry::new(bad).unwrap_err();
//! assert_eq!(err.field, "schema_registry.url");
//! ```

use crate::codec::CodecError;
use crate::error::ConfigError;
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::error::SRCError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The environment variable [`SchemaRegistryConfig::url_from_env`] reads.
pub const URL_ENV: &str = "SCHEMA_REGISTRY_URL";

/// The registry URL when [`URL_ENV`] is unset: Apicurio's Confluent-compatible API on its default port.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8081/apis/ccompat/v7";

/// Where the schema registry is and how to talk to it.
#[derive(Clone)]
pub struct SchemaRegistryConfig {
    /// Base URLs of the Confluent REST API (`http://` or `https://`), tried in order on every call.
    pub urls: Vec<String>,
    /// Basic-auth user name (Confluent Cloud: the API key).
    pub username: Option<String>,
    /// Basic-auth password (Confluent Cloud: the API secret); needs `username`.
    pub password: Option<String>,
    /// Connect and read timeout of one HTTP call (default 10 s). A call that times out is a
    /// transient failure: the record is retried.
    pub timeout: Duration,
}

impl fmt::Debug for SchemaRegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaRegistryConfig")
            .field("urls", &self.urls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SchemaRegistryConfig {
    /// A registry at `url` (several may be given separated by commas), without authentication.
    pub fn new(url: impl AsRef<str>) -> Self {
        let urls = url.as_ref().split(',').map(|u| u.trim().trim_end_matches('/').to_owned()).collect();
        Self { urls, username: None, password: None, timeout: Duration::from_secs(10) }
    }

    /// `$SCHEMA_REGISTRY_URL`, or [`DEFAULT_URL`] when it is unset.
    pub fn url_from_env() -> String {
        std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned())
    }

    /// Authenticates every call with HTTP basic auth.
    pub fn basic_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Sets the timeout of one HTTP call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks every field; the error names the first one at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.urls.is_empty() || self.urls.iter().any(String::is_empty) {
            return Err(ConfigError::new("schema_registry.url", "must not be empty"));
        }
        for url in &self.urls {
            let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")).ok_or_else(|| {
                ConfigError::new("schema_registry.url", format!("{url:?} must start with http:// or https://"))
            })?;
            let host = rest.split('/').next().unwrap_or_default();
            if host.is_empty() || url.chars().any(char::is_whitespace) {
                return Err(ConfigError::new("schema_registry.url", format!("{url:?} has no host or contains spaces")));
            }
        }
        match (&self.username, &self.password) {
            (Some(u), _) if u.is_empty() => {
                return Err(ConfigError::new("schema_registry.username", "must not be empty when set"));
            }
            (Some(u), _) if u.contains(':') => {
                return Err(ConfigError::new("schema_registry.username", "must not contain ':' (basic auth)"));
            }
            (None, Some(_)) => return Err(ConfigError::new("schema_registry.password", "set without a username")),
            _ => {}
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("schema_registry.timeout", "must be above zero"));
        }
        Ok(())
    }
}

/// A client of one schema registry, cheap to clone and shared by every codec that uses it. Writer
/// schemas are cached by id for decoding (each id is fetched once per registry client); each codec
/// caches its own registrations by subject (each subject registered or looked up once per codec).
/// Failures that retrying cannot fix (an unknown id) are cached too; an unavailable registry is
/// not, so the next attempt asks again.
#[derive(Clone)]
pub struct SchemaRegistry {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) decoder: AvroDecoder,
    settings: SrSettings,
    urls: Vec<String>,
}

impl fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaRegistry").field("urls", &self.inner.urls).finish_non_exhaustive()
    }
}

impl SchemaRegistry {
    /// Validates `config` and builds the client. It does not call the registry: an unreachable
    /// registry shows up later as transient failures of the records that need it.
    pub fn new(config: SchemaRegistryConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut builder = SrSettings::new_builder(config.urls[0].clone());
        for url in &config.urls[1..] {
            builder.add_url(url.clone());
        }
        if let Some(user) = &config.username {
            builder.set_basic_authorization(user, config.password.as_deref());
        }
        builder.set_timeout(config.timeout);
        let settings = builder.build().map_err(|e| ConfigError::new("schema_registry", e.error))?;
        Ok(Self { inner: Arc::new(Inner { decoder: AvroDecoder::new(settings.clone()), settings, urls: config.urls }) })
    }

    /// The registry's base URLs.
    pub fn urls(&self) -> &[String] {
        &self.inner.urls
    }

    /// A new encoder (with its own subject cache) for one codec.
    pub(crate) fn encoder(&self) -> AvroEncoder {
        AvroEncoder::new(self.inner.settings.clone())
    }

    /// Classifies a registry error. `id` is the schema id asked for, when decoding; `encoder` the
    /// encoder that failed, when encoding. An error the converter cached but that retrying may fix
    /// (auth refused, a 5xx it does not count as retriable) is dropped from its cache so the next
    /// attempt asks again.
    pub(crate) fn error(&self, e: SRCError, id: Option<u32>, encoder: Option<&AvroEncoder>) -> CodecError {
        let text = e.to_string();
        let status = http_status(&text);
        if e.retriable || matches!(status, Some(401 | 403 | 408 | 429 | 500..=599)) {
            if !e.retriable {
                self.inner.decoder.remove_errors_from_cache();
                if let Some(encoder) = encoder {
                    encoder.remove_errors_from_cache();
                }
            }
            return CodecError::RegistryUnavailable { message: text };
        }
        match (status, id) {
            (Some(404), Some(id)) => CodecError::UnknownSchema { id },
            _ => CodecError::Invalid { codec: "avro", message: text },
        }
    }
}

/// The HTTP status in a converter error message ("... failed with status 404 Not Found ...").
fn http_status(message: &str) -> Option<u16> {
    let at = message.find("status ")? + "status ".len();
    message[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The Confluent wire format: `[0, id (4 bytes, big-endian), body…]`.
pub mod wire {
    use crate::codec::CodecError;

    /// The first byte of a value in the Confluent wire format.
    pub const MAGIC: u8 = 0;
    /// Bytes before the body: the magic byte and the schema id.
    pub const HEADER_LEN: usize = 5;

    /// Splits a value into its schema id and body.
    ///
    /// ```
    /// use millrace::codec::schema_registry::wire;
    /// assert_eq!(wire::split(&[0, 0, 0, 1, 2, 42]).unwrap(), (258, &[42u8][..]));
    /// assert!(wire::split(&[1, 0, 0, 1, 2, 42]).is_err()); // wrong magic byte
    /// assert!(wire::split(&[0, 0, 0]).is_err()); // too short
    /// ```
    pub fn split(value: &[u8]) -> Result<(u32, &[u8]), CodecError> {
        if value.first().is_some_and(|b| *b != MAGIC) {
            return Err(CodecError::Invalid {
                codec: "avro",
                message: format!(
                    "magic byte is {:#04x}, expected {MAGIC:#04x} (not the Confluent wire format)",
                    value[0]
                ),
            });
        }
        if value.len() < HEADER_LEN {
            return Err(CodecError::Invalid {
                codec: "avro",
                message: format!(
                    "value is {} bytes, shorter than the {HEADER_LEN}-byte wire-format header",
                    value.len()
                ),
            });
        }
        let id = u32::from_be_bytes([value[1], value[2], value[3], value[4]]);
        Ok((id, &value[HEADER_LEN..]))
    }

    /// The schema id of a value in the wire format, if it has one.
    pub fn schema_id(value: &[u8]) -> Option<u32> {
        split(value).ok().map(|(id, _)| id)
    }

    /// Prefixes `body` with the wire-format header for schema `id`.
    pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.push(MAGIC);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_field() {
        let field = |c: SchemaRegistryConfig| SchemaRegistry::new(c).unwrap_err().field;
        assert_eq!(field(SchemaRegistryConfig::new("")), "schema_registry.url");
        assert_eq!(field(SchemaRegistryConfig::new("ftp://x")), "schema_registry.url");
        assert_eq!(field(SchemaRegistryConfig::new("http://")), "schema_registry.url");
        assert_eq!(field(SchemaRegistryConfig::new("http://a,")), "schema_registry.url");
        assert_eq!(field(SchemaRegistryConfig::new("http://a").basic_auth("", "p")), "schema_registry.username");
        let mut c = SchemaRegistryConfig::new("http://a");
        c.password = Some("p".into());
        assert_eq!(field(c), "schema_registry.password");
        assert_eq!(field(SchemaRegistryConfig::new("http://a").timeout(Duration::ZERO)), "schema_registry.timeout");
        let ok = SchemaRegistry::new(
            SchemaRegistryConfig::new("http://a:1/apis/ccompat/v7/, https://b").basic_auth("u", "p"),
        )
        .unwrap();
        assert_eq!(ok.urls(), ["http://a:1/apis/ccompat/v7", "https://b"]);
    }

    #[test]
    fn password_is_not_printed() {
        let c = SchemaRegistryConfig::new("http://a").basic_auth("u", "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn wire_format_round_trips_and_rejects() {
        let framed = wire::frame(7, &[1, 2, 3]);
        assert_eq!(framed, [0, 0, 0, 0, 7, 1, 2, 3]);
        assert_eq!(wire::split(&framed).unwrap(), (7, &[1u8, 2, 3][..]));
        assert_eq!(wire::schema_id(&wire::frame(u32::MAX, &[])), Some(u32::MAX));
        assert_eq!(wire::schema_id(&[]), None);
        assert_eq!(wire::schema_id(&[0, 0, 0, 1]), None);
        let err = wire::split(&[b'{', 0, 0, 0, 1]).unwrap_err().to_string();
        assert!(err.contains("magic byte is 0x7b"), "{err}");
    }

    #[test]
    fn registry_errors_are_classified() {
        let registry = SchemaRegistry::new(SchemaRegistryConfig::new("http://a")).unwrap();
        let not_found = SRCError::new("HTTP request to schema registry failed with status 404 Not Found", None, false);
        assert!(matches!(registry.error(not_found.clone(), Some(9), None), CodecError::UnknownSchema { id: 9 }));
        assert!(matches!(registry.error(not_found, None, None), CodecError::Invalid { .. }));
        let refused = SRCError::new("http call to schema registry failed", Some("connection refused".into()), true);
        assert!(registry.error(refused, Some(1), None).is_transient());
        for status in ["401 Unauthorized", "500 Internal Server Error", "503 Service Unavailable"] {
            let e = SRCError::new(&format!("HTTP request to schema registry failed with status {status}"), None, false);
            assert!(registry.error(e, Some(1), None).is_transient(), "{status}");
        }
        let not_avro = SRCError::new("type Json, is not supported", None, false);
        assert!(!registry.error(not_avro, Some(1), None).is_transient());
    }
}
