//! Kafka client properties as a pipeline holds them: passed to librdkafka untouched, shown with
//! their secrets redacted (a `{:?}` of a [`PipelineConfig`](super::PipelineConfig), a start-up error
//! naming a property, a log line).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};

/// What a secret's value is shown as.
pub const REDACTED: &str = "[redacted]";

/// Parts of a property name that mark its value as a secret (matched case-insensitively):
/// `sasl.password`, `ssl.key.password`, `ssl.keystore.password`, `ssl.key.pem`, `ssl_key`,
/// `sasl.oauthbearer.client.secret`, `sasl.oauthbearer.config`, `sasl.jaas.config` (a Java client's
/// property, rejected by librdkafka, whose message would otherwise repeat it), keytabs, tokens and
/// credentials.
const SECRET_PARTS: [&str; 9] =
    ["password", "secret", "jaas", "key.pem", "ssl_key", "keytab", "token", "credential", "oauthbearer.config"];

/// Whether the value of property `name` is a secret, never to be shown.
///
/// ```
/// use millrace::config::properties::is_secret;
///
/// assert!(is_secret("sasl.password") && is_secret("ssl.key.pem") && is_secret("sasl.jaas.config"));
/// assert!(!is_secret("sasl.username") && !is_secret("security.protocol"));
/// ```
pub fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARTS.iter().any(|part| name.contains(part))
}

/// `value`, or [`REDACTED`] when property `name` holds a secret.
pub fn shown<'a>(name: &str, value: &'a str) -> &'a str {
    if is_secret(name) { REDACTED } else { value }
}

/// Kafka client properties (name → value). Derefs to the map; its `Debug` redacts secrets.
///
/// ```
/// use millrace::config::properties::KafkaProperties;
///
/// let mut p = KafkaProperties::default();
/// p.insert("sasl.username".into(), "billing".into());
/// p.insert("sasl.password".into(), "hunter2".into());
/// let shown = format!("{p:?}");
/// assert!(shown.contains("billing") && !shown.contains("hunter2"), "{shown}");
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(BTreeMap<String, String>);

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(k, v)| (k, shown(k, v)))).finish()
    }
}

impl Deref for KafkaProperties {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for KafkaProperties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<'a> IntoIterator for &'a KafkaProperties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for KafkaProperties {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl From<BTreeMap<String, String>> for KafkaProperties {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }
}

/// A property value as a configuration file writes it: text, a number or a boolean (passed to
/// librdkafka as text), or a table whose keys continue the name (TOML's `ssl.ca.location = "…"`
/// is the table `ssl` → `ca` → `location`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Node {
    Text(String),
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Table(BTreeMap<String, Node>),
}

impl Node {
    fn flatten_into(self, name: String, out: &mut BTreeMap<String, String>) {
        let text = match self {
            Node::Text(t) => t,
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => i.to_string(),
            Node::UInt(u) => u.to_string(),
            Node::Float(f) => f.to_string(),
            Node::Table(table) => {
                for (k, v) in table {
                    v.flatten_into(format!("{name}.{k}"), out);
                }
                return;
            }
        };
        out.insert(name, text);
    }
}

/// Property names to values; values may be numbers or booleans and names may be nested tables. A
/// value of any other shape fails without the value being repeated (it may be a secret).
impl<'de> serde::Deserialize<'de> for KafkaProperties {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = BTreeMap::new();
        for (k, v) in BTreeMap::<String, Node>::deserialize(d)? {
            v.flatten_into(k, &mut out);
        }
        Ok(Self(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_recognised_whatever_their_case() {
        for name in [
            "sasl.password",
            "SASL.PASSWORD",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.kerberos.keytab",
        ] {
            assert!(is_secret(name), "{name}");
        }
        for name in ["bootstrap.servers", "sasl.mechanism", "ssl.ca.location", "ssl.certificate.pem", "client.id"] {
            assert!(!is_secret(name), "{name}");
        }
    }
}
